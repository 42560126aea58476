"""Graph import, the analyzer and the IR (DESIGN.md §2, TAG §4.1.1)."""
