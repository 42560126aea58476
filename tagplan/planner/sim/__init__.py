"""Discrete-event simulator (DESIGN.md §6, TAG §4.3.2)."""
