"""Strategy JSON and its validation against a graph and a cluster (docs/design.md §4)."""

from __future__ import annotations

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.strategy import (
    GroupDecision,
    OpGroup,
    Option,
    Strategy,
    load_strategy,
    resolve,
)
from tagplan.planner.topology import load_cluster
from tests.planner.graph.builders import dense_graph, graph_def


@pytest.fixture(scope="module")
def ir():
    return analyze(graph_def(dense_graph()))


@pytest.fixture(scope="module")
def testbed():
    return load_cluster("testbed")


def decision(**changes) -> GroupDecision:
    return GroupDecision(**({"device_groups": [0], "option": Option.REPLICATE_ALLREDUCE} | changes))


def test_json_round_trip_keeps_every_field() -> None:
    strategy = Strategy(
        name="mixed",
        groups=[OpGroup(ops=["y", "dy"], decision=decision(option=Option.MODEL_PARALLEL))],
        default=decision(replicas={"v100-0/GPU:1": 2}, batch_weights={"v100-0/GPU:0": 2.0}),
        sfb={"w": ["dw"]},
    )
    assert load_strategy(strategy.to_json()) == strategy


def test_round_robin_parameter_servers_and_replica_shares(ir, testbed) -> None:
    resolved = resolve(Strategy(default=decision(option=Option.REPLICATE_PS)), ir, testbed)
    assert resolved.group_ps_device.tolist() == [0]
    shares = resolve(Strategy(default=decision(replicas={"v100-0/GPU:3": 3})), ir, testbed)
    devices, weights = shares.replicas(0)
    assert devices.tolist() == [0, 1, 2, 3, 3, 3]
    assert weights.sum() == pytest.approx(1.0)


def test_unnamed_parameter_servers_go_round_robin_over_the_groups_that_have_one(
    ir, testbed
) -> None:
    """The i-th group with a parameter server left unnamed gets its GPUs' i-th (TAG §4.2's
    round robin), whatever the other groups decide: a strategy with one such group puts
    its server on the same GPU whichever group it is (docs/design.md §4)."""
    ps, allreduce = decision(option=Option.REPLICATE_PS), decision()
    named = decision(option=Option.REPLICATE_PS, ps_device="v100-0/GPU:3")
    options = [allreduce, ps, named, allreduce, ps, ps]
    groups = [
        OpGroup(ops=[op], decision=d)
        for op, d in zip(["x", "axes", "lr", "y", "loss", "dy"], options, strict=True)
    ]
    resolved = resolve(Strategy(groups=groups, default=allreduce), ir, testbed)
    first = testbed.group_devices(0).tolist()
    assert resolved.group_ps_device.tolist()[:6] == [-1, first[0], 3, -1, first[1], first[2]]
    for alone in (1, 4):
        one = [
            OpGroup(ops=g.ops, decision=ps if k == alone else allreduce)
            for k, g in enumerate(groups)
        ]
        assert (
            resolve(Strategy(groups=one, default=allreduce), ir, testbed).group_ps_device[alone]
            == first[0]
        )


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        (
            Strategy(groups=[OpGroup(ops=["nope"], decision=decision())], default=decision()),
            "op 'nope' is not in the graph",
        ),
        (
            Strategy(groups=[OpGroup(ops=["y", "dy", "gone"], decision=decision())]),
            "group 0: op 'gone' is not in the graph",
        ),
        (
            Strategy(
                groups=[
                    OpGroup(ops=["y"], decision=decision()),
                    OpGroup(ops=["y"], decision=decision()),
                ],
                default=decision(),
            ),
            "already in group 0",
        ),
        (Strategy(groups=[OpGroup(ops=["y"], decision=decision())]), "in no group"),
        (Strategy(default=decision(device_groups=[42])), r"device groups \[42\] do not exist"),
        (
            Strategy(default=decision(option=Option.REPLICATE_PS, ps_device="x/GPU:9")),
            "ps_device 'x/GPU:9' does not exist",
        ),
        (Strategy(default=decision(replicas={"p100-0/GPU:0": 1})), "not in the group's GPUs"),
        (Strategy(default=decision(), sfb={"y": []}), "not a trainable parameter"),
        (Strategy(default=decision(), sfb={"w": ["nope"]}), "names op 'nope'"),
        (
            Strategy(
                default=decision(option=Option.MODEL_PARALLEL, placement={"y": "p100-0/GPU:0"})
            ),
            "not one of the group's",
        ),
    ],
)
def test_invalid_strategies_are_refused_with_the_reason(ir, testbed, strategy, message) -> None:
    with pytest.raises(InvalidInput, match=message):
        resolve(strategy, ir, testbed)


def test_malformed_json_names_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"default\.option"):
        load_strategy('{"version": 1, "default": {"device_groups": [0], "option": "magic"}}')
    with pytest.raises(InvalidInput, match="groups or a default"):
        load_strategy('{"version": 1}')


def test_explicit_placement_moves_colocated_ops_and_refuses_splitting_them(ir, testbed) -> None:
    """A variable's read follows it; placing the two apart is refused."""
    mp = {"device_groups": [0], "option": Option.MODEL_PARALLEL}
    resolved = resolve(
        Strategy(default=decision(**mp, placement={"w": "v100-0/GPU:2"})), ir, testbed
    )
    assert resolved.op_device[ir.op_index("w/read")] == 2
    assert resolved.op_device[ir.op_index("update_w")] == 2
    split = decision(**mp, placement={"w": "v100-0/GPU:2", "w/read": "v100-0/GPU:1"})
    with pytest.raises(InvalidInput, match="must colocate"):
        resolve(Strategy(default=split), ir, testbed)
