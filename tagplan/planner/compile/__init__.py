"""Strategy compiler: task graph and distributed GraphDef (DESIGN.md §5, TAG §4.3.1)."""
