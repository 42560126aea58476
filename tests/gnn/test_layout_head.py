"""The layout head: the candidates of the pipelined part of the tree as features, the head
scoring them, the search asking it, checkpoints that carry it, and its training."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tagplan.gnn import load_prior
from tagplan.gnn.checkpoint import CheckpointRefused, load_checkpoint, save_checkpoint
from tagplan.gnn.dataset import Case, search_for
from tagplan.gnn.layout_features import LAYOUT_FEATURES, LayoutStatics
from tagplan.gnn.model import PriorNet
from tagplan.gnn.prior import GnnPrior
from tagplan.gnn.train import TrainOptions
from tagplan.gnn.train_layouts import train_layouts, with_layout_head
from tagplan.planner.errors import InvalidInput
from tagplan.planner.search.layout_branches import SYNC_CHOICES
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.search.prior import LayoutQuery, PriorQuery
from tagplan.planner.strategy import Option

CASE = Case("zoo:small_cnn", "testbed", 10_001)  # seven machines: several layouts
F = {name: i for i, name in enumerate(LAYOUT_FEATURES)}


@pytest.fixture(scope="module")
def search() -> StrategySearch:
    found = search_for(CASE, None, layouts=True)
    assert found.layouts is not None and len(found.layouts) >= 2
    return found


@pytest.fixture(scope="module")
def statics(search) -> LayoutStatics:
    return LayoutStatics(search.context, search.layouts)


def test_the_root_offers_tag_decisions_then_every_layout(search, statics) -> None:
    branches = search.layouts
    root = statics.candidates(())
    assert root.x.shape == (1 + len(branches), len(LAYOUT_FEATURES))
    assert root.x[0, F["kind_tag"]] == 1 and (root.x[1:, F["kind_layout"]] == 1).all()
    assert np.allclose(root.focus.sum(axis=1), 1.0)
    cluster = branches.cluster
    assert root.device_groups[0] == tuple(range(cluster.num_groups))
    # TAG's decisions: the allocation's whole-model time at perfect data parallelism
    ideal_s = cluster.num_devices / branches.device_speed.sum()
    assert root.x[0, F["log_bound_vs_reference"]] == pytest.approx(
        math.log(ideal_s / search.reference_step_s), rel=1e-5
    )
    for k, layout in enumerate(branches.layouts):
        row = root.x[1 + k]
        p, m = layout.num_stages, layout.micro_batches[0]
        assert row[F["bubble"]] == pytest.approx((p - 1) / (m + p - 1))  # GPipe's bubble
        assert row[F["log_micro_batches_vs_stages"]] == pytest.approx(math.log(m / p), abs=1e-6)
        assert row[F["log_bound_vs_reference"]] == pytest.approx(
            math.log(branches.bound_s[k][0] / search.reference_step_s), rel=1e-5
        )
        gpus = sum(len(g) for g in layout.stage_gpus)
        assert row[F["gpu_share"]] == pytest.approx(gpus / cluster.num_devices)
        used = {int(g) for s in layout.stage_gpus for g in cluster.group_of_device[s]}
        assert set(root.device_groups[1 + k]) == used


def test_a_stage_s_parameters_and_transfers_are_those_of_its_ops(search, statics) -> None:
    ir = search.evaluator.ir
    for k, layout in enumerate(search.layouts.layouts):
        stages = statics.stages(k)
        # every parameter is in exactly one stage
        assert stages.param_bytes.sum() == pytest.approx(float(ir.parameters.bytes.sum()))
        assert stages.group_time.sum() == pytest.approx(statics.op_time_s.sum())
        assert stages.transfer_s > 0  # a cut model sends activations and gradients
        assert len(stages.device_groups) == layout.num_stages


def test_below_a_layout_the_choices_are_micro_batches_then_each_stage_s_sync(
    search, statics
) -> None:
    branches = search.layouts
    k = max(range(len(branches)), key=lambda i: len(branches.layouts[i].micro_batches))
    layout = branches.layouts[k]
    micro = statics.candidates((k + 1,))
    assert len(micro.x) == len(layout.micro_batches) == branches.level_sizes(k)[0]
    assert (micro.x[:, F["kind_micro_batches"]] == 1).all()
    bubbles = micro.x[:, F["bubble"]]
    assert (np.diff(bubbles) < 0).all()  # more micro-batches, a smaller bubble
    sync = statics.candidates((k + 1, 0, 0))  # the second stage's synchronization
    assert len(sync.x) == len(SYNC_CHOICES) == branches.level_sizes(k)[2]
    ps = [c == Option.REPLICATE_PS for c in SYNC_CHOICES]
    assert sync.x[:, F["parameter_server"]].tolist() == [float(p) for p in ps]
    rest = np.delete(sync.x, F["parameter_server"], axis=1)
    assert np.array_equal(rest[0], rest[1])
    assert sync.device_groups[0] == statics.stages(k).device_groups[1]
    # the focus is the stage's share of each op group's compute
    time = statics.stages(k).group_time[1]
    assert np.allclose(sync.focus[0], time / time.sum(), atol=1e-6)


def _favoured(query: LayoutQuery) -> np.ndarray:
    """The last candidate of every level first (the last layout at the root)."""
    count = len(query.branches.prior(query.path))
    p = np.full(count, 0.1 / count)
    p[-1] += 0.9
    return p


class Favouring:
    """A prior with an opinion on the layouts (:func:`_favoured`), uniform elsewhere."""

    name = "favouring"

    def __init__(self) -> None:
        self.asked: list[LayoutQuery] = []

    def probabilities(self, query: PriorQuery) -> np.ndarray:
        return np.full(len(query.actions), 1.0 / len(query.actions))

    def layout_probabilities(self, query: LayoutQuery) -> np.ndarray:
        self.asked.append(query)
        return _favoured(query)


def test_the_search_asks_a_layout_prior_and_checks_what_it_gives() -> None:
    prior = Favouring()
    searched = search_for(CASE, prior, layouts=True)
    searched.run(iterations=30)
    root = searched._root
    assert prior.asked[0].path == () and prior.asked[0].branches is searched.layouts
    assert np.allclose(root.prior, _favoured(prior.asked[0]))
    below = [child for edge, child in root.children.items() if edge > 0]
    assert below  # a layout was expanded, with the prior's own probabilities
    for child in below:
        assert child.query in prior.asked and np.allclose(child.prior, _favoured(child.query))
    layout_targets = [q for q, _ in searched.visit_targets(1) if isinstance(q, LayoutQuery)]
    assert layout_targets[0] is root.query

    class Wrong(Favouring):
        def layout_probabilities(self, query: LayoutQuery) -> np.ndarray:
            return np.ones(1)

    with pytest.raises(InvalidInput, match="one probability per candidate"):
        search_for(CASE, Wrong(), layouts=True).run(iterations=1)


def test_a_network_without_a_head_leaves_the_layouts_their_own_prior(search) -> None:
    torch.manual_seed(0)
    prior = GnnPrior(PriorNet(hidden=16, heads=2, layers=1), name="test")
    query = LayoutQuery(search.context, search.layouts, ())
    assert prior.layout_probabilities(query) is None
    searched = search_for(CASE, prior, layouts=True)
    searched.run(iterations=3)
    assert np.array_equal(searched._root.prior, searched.layouts.prior(()))


def test_a_head_scores_every_candidate_and_round_trips_in_a_checkpoint(search, tmp_path) -> None:
    torch.manual_seed(0)
    model = with_layout_head(PriorNet(hidden=16, heads=2, layers=1), seed=4)
    prior = GnnPrior(model, name="test")
    for path in [(), (1,), (1, 0)]:
        query = LayoutQuery(search.context, search.layouts, path)
        p = prior.layout_probabilities(query)
        assert p.shape == (len(search.layouts.prior(path)),)
        assert p.sum() == pytest.approx(1.0) and (p >= 0.1 / len(p) - 1e-12).all()
    digest = save_checkpoint(tmp_path / "head.pt", model, {"training": {}})
    loaded, meta = load_checkpoint(tmp_path / "head.pt")
    assert loaded.has_layout_head and meta["state_sha256"] == digest
    assert meta["schema"]["layout"]["features"] == list(LAYOUT_FEATURES)
    root = LayoutQuery(search.context, search.layouts, ())
    again = GnnPrior(loaded, name="again").layout_probabilities(root)
    assert np.array_equal(again, prior.layout_probabilities(root))
    # a head trained on other layout features is refused, naming the layout schema
    payload = torch.load(tmp_path / "head.pt", weights_only=True)
    payload["meta"]["schema"]["layout"]["features"] = list(LAYOUT_FEATURES[:-1])
    torch.save(payload, tmp_path / "other.pt")
    with pytest.raises(CheckpointRefused, match="differs in: layout"):
        load_checkpoint(tmp_path / "other.pt")


SMALL = TrainOptions(
    models=("small_cnn",),
    clusters_per_model=3,
    rounds=2,
    iterations=40,
    min_visits=2,
    epochs=8,
    batch_size=4,
    workers=1,
)


def test_training_a_head_leaves_the_base_network_and_is_deterministic(tmp_path) -> None:
    torch.manual_seed(1)
    base = PriorNet(hidden=16, heads=2, layers=1)
    base_path = tmp_path / "base.pt"
    save_checkpoint(base_path, base, {"training": {"note": "base"}, "metrics": {}})
    checkpoint = train_layouts(tmp_path / "run", base_path, SMALL)
    model, meta = load_checkpoint(checkpoint)
    assert model.has_layout_head
    trained = model.state_dict()
    for name, weight in base.state_dict().items():  # the base network is as it was
        assert torch.equal(trained[name], weight), name
    assert meta["training"] == {"note": "base"}
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [r["prior"] for r in record["rounds"]] == ["base", "round-0/prior.pt"]
    last = record["rounds"][-1]
    assert last["train_examples"] > 0
    history = last["history"]
    assert history[-1]["train_cross_entropy"] < history[0]["train_cross_entropy"]
    # the same options on the same base give the same head; from the trained checkpoint
    # too (its network without the head is the base)
    again = train_layouts(tmp_path / "again", checkpoint, SMALL)
    assert load_checkpoint(again)[1]["state_sha256"] == meta["state_sha256"]
    with pytest.raises(Exception, match="other options"):
        train_layouts(tmp_path / "run", base_path, TrainOptions(models=("mlp",), workers=1))


def test_the_shipped_checkpoint_has_a_layout_head_that_puts_tag_decisions_first(search) -> None:
    """Its training searches found no case where a pipeline was the best plan."""
    prior = load_prior()
    assert prior.model.has_layout_head
    p = prior.layout_probabilities(LayoutQuery(search.context, search.layouts, ()))
    assert p.shape == (1 + len(search.layouts),) and int(np.argmax(p)) == 0
