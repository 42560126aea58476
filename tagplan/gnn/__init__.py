"""Heterogeneous GNN prior for the search (DESIGN.md §8, TAG §4.2.1)."""
