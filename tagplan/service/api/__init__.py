"""HTTP layer: one router per resource under ``/v1``."""
