"""Training: deterministic for a seed, resumable, and the result is a checkpoint that
fits the search's targets better than the uniform prior on the cases it learned from."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tagplan.gnn.checkpoint import load_checkpoint
from tagplan.gnn.dataset import Case, case_file, load_case
from tagplan.gnn.train import (
    EVAL_SEEDS,
    TRAIN_SEEDS,
    TrainOptions,
    cases_for,
    held_out_cases,
    train,
)
from tagplan.planner.errors import InvalidInput

SMALL = TrainOptions(
    models=("mlp", "small_cnn"),
    clusters_per_model=3,
    rounds=1,
    iterations=30,
    min_visits=4,
    epochs=6,
    batch_size=8,
    workers=1,
    hyper={"hidden": 16, "heads": 2, "layers": 1},
)


class Interrupt(Exception):
    pass


def test_cases_come_from_training_seeds_only() -> None:
    cases = cases_for(TrainOptions(clusters_per_model=5))
    assert len(cases) == 5 * len(TrainOptions().models)
    seeds = {c.seed for c in cases}
    assert all(s in TRAIN_SEEDS and s not in EVAL_SEEDS for s in seeds)
    assert cases == cases_for(TrainOptions(clusters_per_model=5))
    assert cases != cases_for(TrainOptions(clusters_per_model=5, seed=1))
    assert {c.cluster for c in cases if c.cluster in ("testbed", "cloud")} == {"testbed", "cloud"}


def test_an_excluded_model_leaves_the_other_cases_as_they_were() -> None:
    every = cases_for(TrainOptions())
    without = cases_for(TrainOptions(exclude=("vgg19",)))
    assert without == [c for c in every if c.graph != "zoo:vgg19"]
    assert len(every) - len(without) == TrainOptions().clusters_per_model
    assert cases_for(TrainOptions(exclude=("vgg19",)), with_excluded=True) == every
    assert held_out_cases(TrainOptions(exclude=("vgg19",))) == held_out_cases(TrainOptions())
    options = TrainOptions(exclude=("vgg19",), larger_machines=(8, 12))
    assert TrainOptions.from_json(json.loads(json.dumps(dataclasses.asdict(options)))) == options


def test_every_third_case_is_a_larger_allocation_of_the_machines_asked() -> None:
    def machines(options: TrainOptions) -> set[int]:
        return {
            int(c.cluster.split(":")[2]) for c in cases_for(options) if c.cluster.count(":") == 2
        }

    assert machines(TrainOptions()) == set(range(4, 9))
    larger = TrainOptions(larger_machines=(8, 12))
    assert machines(larger) == set(range(8, 13))
    assert [c.seed for c in cases_for(larger)] == [c.seed for c in cases_for(TrainOptions())]
    with pytest.raises(InvalidInput, match="machines"):
        train("unused", TrainOptions(larger_machines=(6, 3)))
    with pytest.raises(InvalidInput, match="nothing to train on"):
        train("unused", TrainOptions(models=("mlp",), exclude=("mlp",)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    return out, train(out, SMALL)


def test_a_run_is_deterministic_and_learns(trained, tmp_path) -> None:
    out, checkpoint = trained
    _, meta = load_checkpoint(checkpoint)
    record = json.loads((out / "run.json").read_text())
    (round_record,) = record["rounds"]
    assert round_record["train_examples"] > 0 and round_record["validation_examples"] > 0
    history = round_record["history"]
    assert len(history) == SMALL.epochs
    # fitting lowers the training loss below the uniform prior's cross-entropy
    assert history[-1]["train_cross_entropy"] < history[0]["train_cross_entropy"]
    metrics = meta["metrics"]
    assert metrics["val_cross_entropy"] == round_record["metrics"]["val_cross_entropy"]

    # interrupted after the data and two epochs, then resumed: the same weights
    calls = []

    def stop_after_two_epochs(stage: str, done: int, total: int) -> None:
        calls.append(stage)
        if stage == "fit" and done == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(tmp_path, SMALL, progress=stop_after_two_epochs)
    assert "generate" in calls
    resumed = train(tmp_path, dataclasses.replace(SMALL, workers=2))  # processes do not count
    assert load_checkpoint(resumed)[1]["state_sha256"] == meta["state_sha256"]


def test_a_run_interrupted_after_its_first_round_resumes(tmp_path) -> None:
    options = dataclasses.replace(SMALL, clusters_per_model=2, rounds=2, epochs=2)
    fitted_rounds = []

    def stop_in_the_second_round(stage: str, done: int, total: int) -> None:
        if stage == "fit" and done == total:
            fitted_rounds.append(done)
        if stage == "generate" and len(fitted_rounds) == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(tmp_path, options, progress=stop_in_the_second_round)
    first = load_checkpoint(tmp_path / "round-0" / "prior.pt")[1]["state_sha256"]
    assert [r["round"] for r in json.loads((tmp_path / "run.json").read_text())["rounds"]] == [0]
    train(tmp_path, options)  # the record on disk (JSON lists) matches the options (tuples)
    record = json.loads((tmp_path / "run.json").read_text())
    assert [r["round"] for r in record["rounds"]] == [0, 1]
    assert load_checkpoint(tmp_path / "round-0" / "prior.pt")[1]["state_sha256"] == first


def test_case_files_hold_the_search_targets(trained) -> None:
    out, _ = trained
    case = cases_for(SMALL)[0]
    examples, summary = load_case(case_file(out / "round-0" / "data", case))
    assert summary["graph"] == case.graph and summary["examples"] == len(examples)
    for example in examples:
        assert example.target.shape == (summary["actions"],)
        assert example.target.sum() == pytest.approx(1.0)
        assert example.graph.act_x.shape[0] == summary["actions"]


def test_a_run_directory_keeps_its_options(trained) -> None:
    out, _ = trained
    with pytest.raises(InvalidInput, match="other options"):
        train(out, TrainOptions(models=("mlp",), clusters_per_model=1, workers=1))
    with pytest.raises(InvalidInput):
        train(out / "x", TrainOptions(epochs=0))
    assert Case("zoo:mlp", "random:5:2", 5).slug == "zoo_mlp_random_5_2_5"
