"""The step bound of a placement (tagplan/planner/step_bound.py): never above the step the
simulator gives, for every strategy kind of the compiler's tests and for strategies of
the search's actions on zoo models and random clusters; its network part, under data
parallelism over two machines, is the gradients' AllReduce at the cheapest algorithm's
seconds per byte; under one bucket of every gradient its collectives part is the
backward pass each GPU runs before the bucket and then the bucket's AllReduce, and the
buckets it rebuilds are the compiler's under every gradient sync; the classic bound of one
link with release dates by hand; an op moved whole onto one GPU sends every replica
elsewhere its rows from that GPU and machine; with a measured communication profile only
compute and chains count."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tagplan.planner import collective_starts
from tagplan.planner.compile import transport
from tagplan.planner.compile.placement import place
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.errors import InvalidInput, PlannerError
from tagplan.planner.evaluate import Evaluator, resolve_planned
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.step_bound import StepBound
from tagplan.planner.strategy import GradientSync, Mode, Strategy
from tagplan.planner.topology import load_cluster
from tests.planner.compile.test_graphdef import LAYERS, STRATEGIES, committed, strategy, two_by_two
from tests.planner.compile.test_pipeline import joined_stages
from tests.planner.search.test_mcts import make_search


@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
def test_every_strategy_kind_steps_no_faster_than_its_bound(model: str) -> None:
    _, ir = committed(model)
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    binding = set()
    for name in STRATEGIES:
        candidate = strategy(name, ir, cluster, LAYERS[model])
        if candidate.pipeline is not None:
            with pytest.raises(InvalidInput, match="without a pipeline"):
                evaluator.step_bound_s(candidate)
            continue
        parts = evaluator.step_bound_parts(candidate)
        step_s = evaluator.evaluate(candidate, by_class=False).step_time_s
        assert parts.step_time_s <= step_s * (1 + 1e-9), name
        assert evaluator.step_bound_s(candidate) == parts.step_time_s
        binding.add(
            max(
                ("compute", "ports", "network", "chain", "collectives"),
                key=lambda p: getattr(parts, f"{p}_s"),
            )
        )
    assert binding - {"compute"}, "no strategy was bound by anything but its compute"


@pytest.mark.parametrize(
    ("model", "cluster"),
    [
        ("mlp", "random:3"),
        ("small_cnn", "random:5"),
        ("tiny_lstm", "testbed"),
        ("wide_deep", "random:8"),
        ("gnmt_small", "cloud"),
        ("bert_small", "random:11"),
    ],
)
def test_the_searchs_strategies_step_no_faster_than_their_bound(model: str, cluster: str) -> None:
    """Strategies as the search builds them: a few actions mixed over the op groups."""
    search = make_search(model, load_cluster(cluster))
    evaluator, rng = search.evaluator, np.random.default_rng(7)
    checked = 0
    for _ in range(10):
        mix = rng.choice(len(search.space), size=3)
        key = tuple(int(a) for a in rng.choice(mix, size=search.grouping.num_groups))
        candidate = search.strategy_of(key)
        try:
            step_s = evaluator.evaluate(candidate).step_time_s
        except PlannerError:
            continue
        parts = evaluator.step_bound_parts(candidate)
        assert parts.step_time_s <= step_s * (1 + 1e-9), key
        checked += 1
    assert checked >= 5


def test_data_parallel_over_two_machines_counts_its_allreduce_at_the_cheapest_algorithm() -> None:
    """DP-NCCL on two machines of two GPUs: every batch tensor stays on its GPU and the
    gradients are AllReduced among the four. The cheapest algorithm per byte is the
    hierarchical one (its chain down and up a machine at 100 Gbps, its leaders' ring
    sending half the bytes twice at 10 Gbps), below the ring's 2(k-1)/k over 10 Gbps: the
    network part is the gradients' bytes at that rate, and the few scalars the first
    GPU's unsplit ops hand the other machine (under 64 bytes); a port takes the ring's
    tenth of its 100 Gbps."""
    _, ir = committed("small_cnn")
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    parts = evaluator.step_bound_parts(baseline_strategy("dp-nccl", ir, cluster, evaluator.costs))
    gradients = ir.parameters.gradient_tensor[ir.parameters.gradient_tensor >= 0]
    network_bytes_per_s, port_bytes_per_s = 10e9 / 8, 100e9 / 8
    hierarchical = 2 / port_bytes_per_s + 2 * (2 - 1) / 2 / network_bytes_per_s
    ring = 2 * (4 - 1) / 4 / network_bytes_per_s
    assert hierarchical < ring
    expected_s = float(ir.tensor_bytes[gradients].sum()) * hierarchical
    scalars_s = 64 / network_bytes_per_s
    assert expected_s <= parts.network_s <= expected_s + scalars_s
    assert expected_s / 10 <= parts.ports_s <= (expected_s + scalars_s) / 10


def _data_parallel_mlp() -> tuple:
    """The mlp on two machines of two GPUs: its IR, the cluster, an evaluator, DP-NCCL
    and its placement."""
    _, ir = committed("mlp")
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    dp = baseline_strategy("dp-nccl", ir, cluster, evaluator.costs)
    return ir, cluster, evaluator, dp, place(ir, resolve_planned(dp, ir, cluster))


def test_under_one_bucket_the_allreduce_follows_each_gpus_backward_pass() -> None:
    """DP-NCCL buckets every gradient together, so its AllReduce starts once every GPU has
    made its partials: after each GPU has run, one at a time, every instance of its
    replica that leads to a gradient (the batch-split ops upstream of the gradients'
    producers, which under data parallelism are each replica's own). From then on the
    machines' uplinks carry the gradients' bytes at the hierarchical algorithm's seconds
    per byte. The mlp's step on two machines is bound by that sum, above every other
    part."""
    ir, cluster, evaluator, dp, placement = _data_parallel_mlp()
    split = placement.op_mode == int(Mode.SPLIT)
    gradients = ir.parameters.gradient_tensor[ir.parameters.gradient_tensor >= 0]
    upstream = set()
    stack = [int(ir.tensor_producer[t]) for t in gradients]
    while stack:
        op = stack.pop()
        if op in upstream:
            continue
        upstream.add(op)
        stack.extend(int(ir.tensor_producer[t]) for t in ir.input_lists[op])
    upstream = {op for op in upstream if split[op]}
    seconds = evaluator.step_bound.instance_seconds(placement)
    before_s = max(
        sum(
            seconds[i]
            for op in upstream
            for i in placement.instances(op)
            if placement.inst_device[i] == d
        )
        for d in range(cluster.num_devices)
    )
    hierarchical = 2 / (100e9 / 8) + 2 * (2 - 1) / 2 / (10e9 / 8)
    allreduce_s = float(ir.tensor_bytes[gradients].sum()) * hierarchical
    parts = evaluator.step_bound_parts(dp)
    assert parts.collectives_s == pytest.approx(before_s + allreduce_s, rel=1e-9)
    assert parts.collectives_s > max(parts.compute_s, parts.ports_s, parts.network_s, parts.chain_s)
    assert parts.collectives_s <= evaluator.evaluate(dp, by_class=False).step_time_s


@pytest.mark.parametrize("sync", list(GradientSync))
@pytest.mark.parametrize("name", ["dp-nccl", "weights", "partial", "bucketed-apart", "hub"])
def test_the_bound_rebuilds_the_compilers_buckets(
    name: str, sync: GradientSync, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every strategy kind under each gradient sync (buckets of 4 KiB, so the mlp's
    gradients fill several): the gradients' AllReduces the bound fills its buckets with
    are the compiler's, in the compiler's order, and the step is no faster than the
    bound."""
    _, ir = committed("mlp")
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    plain = strategy(name, ir, cluster, LAYERS["mlp"])
    update = {"gradient_sync": sync, "bucket_bytes": 4096}
    candidate = Strategy(
        name=name,
        default=plain.default.model_copy(update=update),
        groups=[
            g.model_copy(update={"decision": g.decision.model_copy(update=update)})
            for g in plain.groups
        ],
    )
    listed: dict[str, list] = {}

    def recorder(where: str, buckets):
        def record(allreduces, decisions):
            listed[where] = list(allreduces)
            return buckets(allreduces, decisions)

        return record

    monkeypatch.setattr(
        collective_starts, "gradient_buckets", recorder("bound", collective_starts.gradient_buckets)
    )
    monkeypatch.setattr(
        transport, "gradient_buckets", recorder("compiler", transport.gradient_buckets)
    )
    bound_s = evaluator.step_bound_s(candidate)
    assert bound_s <= evaluator.evaluate(candidate, by_class=False).step_time_s * (1 + 1e-9)
    assert len(listed["bound"]) > 1
    if sync != GradientSync.OVERLAP:  # the compiler buckets nothing under overlap alone
        assert listed["bound"] == listed["compiler"]


def test_the_chains_few_transfers_share_their_link_as_the_sorted_bound_does() -> None:
    """The chain's in-port check over a reader's few transfers (no sort) gives the bound
    of one link with release dates (sorted), on random work."""
    rng = np.random.default_rng(3)
    for size in (1, 2, 5, 9):
        made = rng.choice([0.0, 1.0, 2.5, 4.0], size=size)
        busy_s = rng.random(size)
        assert collective_starts.released(made, busy_s) == pytest.approx(
            collective_starts.after_release_s(made, busy_s), rel=1e-12
        )


def test_the_gpus_time_before_each_bucket_is_the_same_summed_per_set_of_buckets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Horovod's buckets of the mlp at 4 KiB on two machines: the instances summed per
    set of buckets they precede give each bucket's start what they give summed one
    bucket at a time (every set past the first taken instance by instance), and the
    buckets start at different times."""
    _, ir = committed("mlp")
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    horovod = baseline_strategy("horovod", ir, cluster, evaluator.costs)
    small = Strategy(
        name="horovod",
        default=horovod.default.model_copy(update={"bucket_bytes": 4096}),
        groups=horovod.groups,
    )
    calls: list[tuple] = []
    serial_before = collective_starts.serial_before

    def record(*args):
        calls.append(args)
        return serial_before(*args)

    monkeypatch.setattr(collective_starts, "serial_before", record)
    evaluator.step_bound_s(small)
    (args,) = calls
    assert args[12] > 1  # units
    summed = serial_before(*args)
    one_by_one = serial_before(*args[:-1], 1)
    assert np.allclose(summed[0], one_by_one[0], rtol=1e-12) and summed[1] == pytest.approx(
        one_by_one[1], rel=1e-12
    )
    assert len(set(summed[0].round(12))) > 1


def test_a_link_with_release_dates_by_hand() -> None:
    """Work released at 0, 2 and 1 taking 3, 1 and 2 seconds: what is released at 1 or
    later takes 3 seconds from 1 on (4), everything 6 from 0 on: 6. Work released at 5
    taking 1 ends at 6 however little else there is."""
    assert (
        collective_starts.after_release_s(np.array([0.0, 2.0, 1.0]), np.array([3.0, 1.0, 2.0]))
        == 6.0
    )
    assert collective_starts.after_release_s(np.array([5.0, 0.0]), np.array([1.0, 1.0])) == 6.0
    assert collective_starts.after_release_s(np.zeros(0), np.zeros(0)) == 0.0


def test_an_op_run_whole_on_one_gpu_sends_each_replica_elsewhere_its_rows() -> None:
    """DP-NCCL's placement with one batch-split op moved whole onto GPU 0: the rows the
    three other replicas read leave GPU 0 besides what left it before, and the half read
    on the other machine leaves its machine, however little of it reaches each reader (a
    quarter of the batch)."""
    ir, _, evaluator, _, placement = _data_parallel_mlp()
    split = placement.op_mode == int(Mode.SPLIT)
    consumers = np.split(ir.tensor_consumer_op, ir.tensor_consumer_ptr[1:-1])
    t = max(
        (
            t
            for t in range(ir.num_tensors)
            if ir.tensor_batch_axis[t] >= 0
            and split[ir.tensor_producer[t]]
            and len(consumers[t])
            and split[consumers[t]].all()
        ),
        key=lambda t: ir.tensor_bytes[t],
    )
    op = int(ir.tensor_producer[t])
    first, last = placement.inst_ptr[op], placement.inst_ptr[op + 1]
    assert last - first == 4
    inst_ptr = placement.inst_ptr.copy()
    inst_ptr[op + 1 :] -= 3

    def one(column: np.ndarray, value: int) -> np.ndarray:
        return np.concatenate([column[:first], [value], column[last:]]).astype(column.dtype)

    whole = replace(
        placement,
        op_mode=np.where(np.arange(ir.num_ops) == op, int(Mode.SINGLE), placement.op_mode),
        inst_ptr=inst_ptr,
        inst_device=one(placement.inst_device, 0),
        inst_lo=one(placement.inst_lo, 0),
        inst_hi=one(placement.inst_hi, ir.batch_size),
    )
    leaving, exiting = evaluator.step_bound.departures(whole)
    leaving_dp, exiting_dp = evaluator.step_bound.departures(placement)
    assert leaving[0] >= leaving_dp[0] + 0.75 * ir.tensor_bytes[t]
    assert exiting[0] >= exiting_dp[0] + 0.5 * ir.tensor_bytes[t]


def test_a_measured_profile_leaves_the_links_out() -> None:
    """A profile may price a copy faster than its link's bandwidth: the bound keeps only
    compute and the chains without transfer times."""
    _, ir = committed("small_cnn")
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    candidate = baseline_strategy("dp-ps", ir, cluster, evaluator.costs)
    placement = place(ir, resolve_planned(candidate, ir, cluster))
    profiled = CommModel(cluster)
    profiled.profile = object()  # any profile: the bound only asks whether there is one
    without = StepBound(ir, cluster, evaluator.costs, profiled).parts(placement)
    with_links = evaluator.step_bound.parts(placement)
    assert without.ports_s == without.network_s == 0.0
    assert without.compute_s == with_links.compute_s
    assert without.chain_s <= with_links.chain_s
    assert with_links.network_s > 0.0


def test_the_bound_refuses_a_pipeline() -> None:
    _, ir = committed("mlp")
    evaluator = Evaluator(ir, two_by_two())
    with pytest.raises(InvalidInput, match="without a pipeline"):
        evaluator.step_bound_s(joined_stages(ir))
