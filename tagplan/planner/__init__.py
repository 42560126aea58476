"""The planning engine. Imports no web, queue or database code (DESIGN.md §1)."""
