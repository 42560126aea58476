"""Twin machines (tagplan/planner/topology/twins.py): which machines are twins, how a
placement is moved onto the lowest of them, and that strategies moved onto one another
so simulate alike: the same step and out-of-memory verdict, the same peak memory on the
GPU at the same place, per GPU and by symmetry class."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.errors import PlannerError
from tagplan.planner.evaluate import relabeled
from tagplan.planner.search.actions import Action
from tagplan.planner.topology import load_cluster
from tagplan.planner.topology.twins import TwinMachines
from tests.planner.search.test_mcts import make_search


def _machine(name: str, gpus: object, intra_gbps: float = 300) -> dict:
    return {"name": name, "gpus": gpus, "intra_bandwidth_gbps": intra_gbps}


def _classes(cluster_spec: dict) -> list[int]:
    return TwinMachines(load_cluster(cluster_spec)).lowest_twin.tolist()


def test_twins_hold_the_same_gpus_in_order_and_reach_everything_alike() -> None:
    """b and c are twins; a is not (a slower link to d), nor d (other GPUs), nor e (a
    slower interconnect), nor f, whose GPUs are g's in another order; a cluster of a
    and e has none."""
    v100 = {"type": "V100-32GB", "count": 2}
    spec = {
        "machines": [
            _machine("a", v100),
            _machine("b", v100),
            _machine("c", v100),
            _machine("d", {"type": "T4", "count": 2}),
            _machine("e", v100, intra_gbps=100),
            _machine("f", [{"index": 0, "type": "V100-32GB"}, {"index": 1, "type": "T4"}]),
            _machine("g", [{"index": 0, "type": "T4"}, {"index": 1, "type": "V100-32GB"}]),
        ],
        "network": {
            "bandwidth_gbps": 100,
            "links": [{"between": ["a", "d"], "bandwidth_gbps": 50}],
        },
    }
    assert _classes(spec) == [0, 1, 1, 3, 4, 5, 6]
    apart = {
        "machines": [spec["machines"][0], spec["machines"][4]],
        "network": {"bandwidth_gbps": 100},
    }
    assert not TwinMachines(load_cluster(apart)).has_twins


def test_a_placement_moves_onto_the_lowest_twins_only_in_order() -> None:
    """On ``scale:64`` (twin classes {0, 3, 6}, {1, 4, 7}, {2, 5}): machine 4 alone moves
    to 1, {4, 7} to {1, 4}, {3, 4} to {0, 1}, {1, 6} to {1, 3} (not {1, 0}: the order
    is kept), each GPU to its place there; {1, 3} and {0, 1, 2} are where they would go:
    neither moves."""
    cluster = load_cluster("scale:64")
    twins = TwinMachines(cluster)
    assert twins.lowest_twin.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]

    def on(*machines: int) -> np.ndarray:
        return np.flatnonzero(np.isin(cluster.device_machine, machines))

    for machines, moved_to in [((4,), (1,)), ((4, 7), (1, 4)), ((3, 4), (0, 1)), ((1, 6), (1, 3))]:
        device_map = twins.relabel(on(*machines))
        assert device_map is not None
        assert sorted(device_map.tolist()) == list(range(cluster.num_devices))
        np.testing.assert_array_equal(device_map[on(*machines)], on(*moved_to))
    assert twins.relabel(on(1, 3)) is None
    assert twins.relabel(on(0, 1, 2)) is None


def _twin_image(action: Action, swap: dict[int, int], cluster) -> Action:
    """``action`` with the device groups of each machine in ``swap`` on its image."""
    groups = []
    for g in action.device_groups:
        machine = swap.get(int(cluster.group_machine[g]), int(cluster.group_machine[g]))
        groups.append(
            int(
                np.flatnonzero(
                    (cluster.group_machine == machine)
                    & (cluster.group_type == cluster.group_type[g])
                )[0]
            )
        )
    return Action(tuple(sorted(groups)), action.option)


@pytest.mark.parametrize(("model", "cluster"), [("mlp", "cloud"), ("small_cnn", "testbed")])
def test_strategies_moved_onto_twins_simulate_alike(model: str, cluster: str) -> None:
    """Random strategies of the search's actions and their images under swaps of twin
    machines: wherever the two share an identity, they step alike, fit alike and peak
    at the same memory on the GPU at the same place, per GPU and by class."""
    search = make_search(model, load_cluster(cluster))
    evaluator, space, rng = search.evaluator, search.space, np.random.default_rng(3)
    twins = evaluator.twins.lowest_twin
    classes = [np.flatnonzero(twins == root) for root in np.unique(twins)]
    classes = [members for members in classes if len(members) > 1]
    index = {action: a for a, action in enumerate(space.actions)}
    alike = 0
    for _ in range(40):
        members = classes[int(rng.integers(len(classes)))]
        a, b = (int(x) for x in rng.choice(members, size=2, replace=False))
        swap = {a: b, b: a}
        mix = rng.choice(len(space), size=2)
        key = tuple(int(x) for x in rng.choice(mix, size=search.grouping.num_groups))
        image = tuple(
            index.get(_twin_image(space.actions[x], swap, evaluator.cluster), -1) for x in key
        )
        if -1 in image:
            continue
        first, second = search.strategy_of(key), search.strategy_of(image)
        try:
            if evaluator.identity(first) != evaluator.identity(second):
                continue
            first_map, second_map = evaluator.twin_map(first), evaluator.twin_map(second)
            for by_class in (False, True):
                one = evaluator.evaluate(first, by_class=by_class)
                other = evaluator.evaluate(second, by_class=by_class)
                assert one.step_time_s == pytest.approx(other.step_time_s, rel=1e-12)
                assert one.result.oom == other.result.oom
                moved = relabeled(other.result, second_map, first_map, evaluator.cluster)
                np.testing.assert_array_equal(moved.peak_memory_bytes, one.result.peak_memory_bytes)
                np.testing.assert_allclose(moved.link_busy_s, one.result.link_busy_s, rtol=1e-9)
        except PlannerError:
            continue
        alike += key != image and (first_map is not None or second_map is not None)
    assert alike >= 6
