"""Celery application and planning tasks (DESIGN.md §9)."""
