"""Celery application and planning tasks (docs/design.md §9)."""
