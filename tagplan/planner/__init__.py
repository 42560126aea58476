"""The planning engine. Imports no web, queue or database code (docs/design.md §1)."""
