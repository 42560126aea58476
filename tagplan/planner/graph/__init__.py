"""Graph import, the analyzer and the IR (docs/design.md §2, TAG §4.1.1)."""
