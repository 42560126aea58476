"""Op and communication cost model (DESIGN.md §3, TAG §4.1.2)."""
