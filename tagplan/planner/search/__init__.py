"""Strategy search: grouping, MCTS, SFB, baselines (docs/design.md §7, TAG §4.2)."""
