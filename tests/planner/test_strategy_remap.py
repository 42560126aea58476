"""Renumbering a strategy: every field naming a device group or device is rewritten, and a
new field of the strategy models has to say whether it names one."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.strategy import GroupDecision, OpGroup, Option, Pipeline, Schedule, Strategy
from tagplan.planner.strategy_remap import (
    DECISION_REMAPS,
    DEVICE_FREE_DECISION_FIELDS,
    DEVICE_FREE_GROUP_FIELDS,
    DEVICE_FREE_STRATEGY_FIELDS,
    ClusterMapping,
    pin_numbering,
    remap_strategy,
)
from tagplan.planner.topology import Cluster, dumps_cluster_spec, load_cluster
from tagplan.planner.topology.canonical import canonical_order
from tests.planner.zoo_graphs import zoo_ir

GROUPS = [2, 0, 1]  # source group g is target group GROUPS[g]
DEVICES = {"a": "x", "b": "y", "c": "z"}


def full_decision() -> GroupDecision:
    """A decision with every device-bearing field set."""
    return GroupDecision(
        device_groups=[0, 1],
        option=Option.REPLICATE_PS,
        replicas={"a": 2, "b": 1},
        batch_weights={"a": 2.0, "b": 1.0},
        ps_device="b",
        placement={"op1": "a", "op2": "c"},
    )


def test_every_decision_field_is_remapped_or_device_free() -> None:
    remapped, free = set(DECISION_REMAPS), set(DEVICE_FREE_DECISION_FIELDS)
    assert remapped.isdisjoint(free)
    assert remapped | free == set(GroupDecision.model_fields)


def test_every_strategy_and_group_field_is_accounted_for() -> None:
    assert set(OpGroup.model_fields) == {"decision"} | DEVICE_FREE_GROUP_FIELDS
    assert set(Strategy.model_fields) == {"groups", "default"} | DEVICE_FREE_STRATEGY_FIELDS


def test_every_device_bearing_field_changes() -> None:
    original = full_decision()
    strategy = Strategy(groups=[OpGroup(ops=["op1"], decision=original)], default=original)
    remapped = remap_strategy(strategy, device_groups=GROUPS, devices=DEVICES)
    for decision in (remapped.groups[0].decision, remapped.default):
        assert decision == GroupDecision(
            device_groups=[0, 2],
            option=Option.REPLICATE_PS,
            replicas={"x": 2, "y": 1},
            batch_weights={"x": 2.0, "y": 1.0},
            ps_device="y",
            placement={"op1": "x", "op2": "z"},
        )
        for name in DECISION_REMAPS:
            assert getattr(decision, name) != getattr(original, name), name
    assert remapped.groups[0].ops == ["op1"]


def test_unset_fields_and_device_free_fields_stay() -> None:
    strategy = Strategy(
        name="dp",
        default=GroupDecision(device_groups=[1], option=Option.DUPLICATE),
        sfb={"w": ["dw"]},
    )
    remapped = remap_strategy(strategy, device_groups=GROUPS, devices=DEVICES)
    assert remapped == strategy.model_copy(
        update={"default": GroupDecision(device_groups=[0], option=Option.DUPLICATE)}
    )
    assert remapped.default is not None and remapped.default.ps_device is None


def test_identity_renumbering_keeps_the_strategy() -> None:
    strategy = Strategy(default=full_decision())
    same = remap_strategy(strategy, device_groups=[0, 1, 2], devices={n: n for n in "abc"})
    assert same == strategy


@pytest.mark.parametrize(
    ("groups", "devices", "message"),
    [([2], DEVICES, "device group 1"), (GROUPS, {"a": "x", "b": "y"}, "device 'c'")],
)
def test_missing_counterpart_is_refused(groups: list[int], devices: dict, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        remap_strategy(Strategy(default=full_decision()), device_groups=groups, devices=devices)


def test_a_pipeline_keeps_its_stages_and_its_groups_get_their_new_gpus() -> None:
    first = GroupDecision(device_groups=[0], option=Option.REPLICATE_ALLREDUCE)
    rest = GroupDecision(device_groups=[1], option=Option.REPLICATE_ALLREDUCE)
    pipeline = Pipeline(stages=[[0], [1]], micro_batches=4, schedule=Schedule.ONE_F_ONE_B)
    strategy = Strategy(
        groups=[OpGroup(ops=["op1"], decision=first)], default=rest, pipeline=pipeline
    )
    remapped = remap_strategy(strategy, device_groups=GROUPS, devices=DEVICES)
    assert remapped.pipeline == pipeline
    assert remapped.groups[0].decision.device_groups == [2]
    assert remapped.default.device_groups == [0]


def _reversed_testbed() -> tuple[Cluster, Cluster, ClusterMapping]:
    """The testbed and itself with machines listed in reverse and renamed."""
    source = load_cluster("testbed")
    spec = json.loads(dumps_cluster_spec(source, fmt="json"))
    machines = list(reversed(spec["machines"]))
    for i, machine in enumerate(machines):
        machine["name"] = f"node-{i}"
    target = load_cluster({**spec, "machines": machines})
    mapping = ClusterMapping((source, canonical_order(source)), (target, canonical_order(target)))
    return source, target, mapping


def _model_parallel(
    ops: Sequence[str], device_groups: list[int], default: GroupDecision
) -> Strategy:
    """``ops`` model-parallel over ``device_groups``, the rest following ``default``."""
    decision = GroupDecision(device_groups=device_groups, option=Option.MODEL_PARALLEL)
    return Strategy(groups=[OpGroup(ops=[str(n) for n in ops], decision=decision)], default=default)


def test_a_pinned_strategy_steps_alike_on_a_renumbered_cluster() -> None:
    """A model-parallel group over every machine splits its ops along the GPUs'
    numbering, and a parameter server left to the round-robin takes a GPU by number:
    remapped as they are, they run differently on the testbed with its machines
    reversed. Pinned first (every op's device, every server written out), the
    model-parallel plan steps exactly the same there, and the parameter server over every
    machine within 1% (the order in which its transfers queue still follows the GPUs'
    numbers); pinning changes nothing on the strategy's own cluster."""
    ir = zoo_ir("mlp")
    source, target, mapping = _reversed_testbed()
    everywhere = list(range(source.num_groups))
    split = _model_parallel(
        ir.op_names[: ir.num_ops // 2],
        everywhere,
        GroupDecision(device_groups=[0], option=Option.REPLICATE_ALLREDUCE),
    )
    served = Strategy(default=GroupDecision(device_groups=everywhere, option=Option.REPLICATE_PS))
    on_source, on_target = Evaluator(ir, source), Evaluator(ir, target)
    for strategy, tolerance in ((split, 1e-9), (served, 0.01)):
        evaluation = on_source.evaluate(strategy)
        step_s = evaluation.step_time_s
        pinned = pin_numbering(evaluation.resolved, ir, source)
        assert on_source.evaluate(pinned).step_time_s == step_s
        unpinned_s = on_target.evaluate(mapping.remap(strategy)).step_time_s
        assert abs(unpinned_s / step_s - 1) > 0.1
        pinned_s = on_target.evaluate(mapping.remap(pinned)).step_time_s
        assert pinned_s == pytest.approx(step_s, rel=tolerance)
    assert split.groups[0].decision.placement is None
    assert (
        pin_numbering(on_source.evaluate(split).resolved, ir, source).groups[0].decision.placement
    )
    assert pin_numbering(on_source.evaluate(served).resolved, ir, source).default.ps_device


def test_a_default_that_covers_no_op_is_left_as_it_is() -> None:
    """Every op in a group: the default decides nothing, so there is nothing to pin."""
    ir = zoo_ir("mlp")
    source, _, _ = _reversed_testbed()
    everywhere = list(range(source.num_groups))
    strategy = _model_parallel(
        ir.op_names, everywhere, GroupDecision(device_groups=everywhere, option=Option.REPLICATE_PS)
    )
    pinned = pin_numbering(Evaluator(ir, source).evaluate(strategy).resolved, ir, source)
    assert pinned.default == strategy.default
    placement = pinned.groups[0].decision.placement
    assert placement is not None and set(placement) == {str(n) for n in ir.op_names}
