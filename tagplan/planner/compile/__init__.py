"""Strategy compiler: task graph and distributed GraphDef (docs/design.md §5, TAG §4.3.1)."""
