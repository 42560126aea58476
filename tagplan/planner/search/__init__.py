"""Strategy search: grouping, MCTS, SFB, baselines (DESIGN.md §7, TAG §4.2)."""
