"""A small search to take states from: the zoo's MLP on TAG's testbed."""

from __future__ import annotations

import pytest

from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.topology import load_cluster
from tests.planner.search.test_mcts import make_search


@pytest.fixture(scope="module")
def searched() -> StrategySearch:
    search = make_search("mlp", load_cluster("testbed"), shuffle_ties=True, seed=1)
    search.run(iterations=40)
    return search
