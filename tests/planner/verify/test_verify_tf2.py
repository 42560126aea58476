"""TF2 concrete functions end to end (docs/verification.md, "TF2 functions"): the Keras 3
MLP of the zoo, its captured variables bound to variables of their own, verified under
data parallelism, a strategy that places its last layer on one machine only, and model
parallelism."""

from __future__ import annotations

import pytest

from tagplan.planner.strategy import GroupDecision, OpGroup, Option, Strategy
from tagplan.planner.topology import Cluster
from tagplan.planner.verify.check import VerifyReport, verify_many
from tagplan.planner.zoo import catalog
from tests.planner.compile.test_graphdef import committed, two_by_two

pytestmark = pytest.mark.tf

AR = Option.REPLICATE_ALLREDUCE


def strategies() -> dict[str, Strategy]:
    """Data parallelism over 2 x 2 GPUs, the same with the last layer (its captured kernel
    and bias, their reads and gradients) replicated on machine 0 only, and model
    parallelism over the four GPUs."""
    _, ir = committed("mlp_tf2")
    everywhere = GroupDecision(device_groups=[0, 1], option=AR)
    last = [n for n in ir.op_names if n.startswith(("MatMul_2", "BiasAdd_2"))]
    assert last, "the last layer's ops are named MatMul_2 / BiasAdd_2"
    apart = OpGroup(ops=last, decision=GroupDecision(device_groups=[0], option=AR))
    return {
        "dp": Strategy(name="dp", default=everywhere),
        "partial": Strategy(name="partial", groups=[apart], default=everywhere),
        "model-parallel": Strategy(
            name="model-parallel",
            default=GroupDecision(device_groups=[0, 1], option=Option.MODEL_PARALLEL),
        ),
    }


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return two_by_two()


@pytest.fixture(scope="module")
def reports(cluster: Cluster) -> dict[str, VerifyReport]:
    chosen = strategies()
    found = verify_many("zoo:mlp_tf2", cluster, list(chosen.values()))
    return dict(zip(chosen, found, strict=True))


@pytest.mark.parametrize("name", ["dp", "partial", "model-parallel"])
def test_mlp_tf2_verifies_with_every_captured_variable(reports, name) -> None:
    report = reports[name]
    assert report.passed, report.summary()
    assert report.loss_actual == pytest.approx(report.loss_expected, rel=1e-12)
    checked = {check.name for check in report.variables}
    manifest = {c["placeholder"] for c in catalog.get_model("mlp_tf2").captured_variables}
    assert checked == manifest  # parameters, Adam's slots, learning rate, step counter


def test_the_optimizers_step_counter_is_in_the_step() -> None:
    """Keras 3 Adam counts its steps with an update no batch reaches, waited on only by the
    function's output; the step keeps it although the output is a value nobody reads."""
    _, ir = committed("mlp_tf2")
    counter = next(
        c["placeholder"]
        for c in catalog.get_model("mlp_tf2").captured_variables
        if c["variable"] == "adam/iteration"
    )
    assert "AssignVariableOp" in ir.op_names, ir.dropped["dangling"]  # counter += 1
    op = ir.op_index("AssignVariableOp")
    inputs = ir.op_input_tensor[ir.op_input_ptr[op] : ir.op_input_ptr[op + 1]]
    assert counter in {ir.op_names[p] for p in ir.tensor_producer[inputs]}


def test_a_tf2_step_with_an_unknown_loss_is_refused(cluster) -> None:
    from tagplan.planner.errors import InvalidInput

    with pytest.raises(InvalidInput, match="nosuch"):
        verify_many("zoo:mlp_tf2", cluster, [strategies()["dp"]], loss="nosuch")
