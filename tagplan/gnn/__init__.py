"""Heterogeneous GNN prior for the search (docs/design.md §8, TAG §4.2.1)."""
