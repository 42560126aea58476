"""Discrete-event simulator (docs/design.md §6, TAG §4.3.2)."""
