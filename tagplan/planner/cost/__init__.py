"""Op and communication cost model (docs/design.md §3, TAG §4.1.2)."""
