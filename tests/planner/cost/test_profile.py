"""Profile files and profile sources: format, validation and the batch-size rule."""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tagplan.planner.cost.profile import (
    InMemoryProfileSource,
    Profile,
    ProfileSource,
    dumps_profile,
    estimate_time,
    load_profile,
)
from tagplan.planner.errors import InvalidInput

RELU = "Relu|float32[B,4]|T=float32"
MATMUL = "MatMul|float32[B,4];float32[4,3]|T=float32;transpose_a=False;transpose_b=False"


def profile_dict(
    gpu_type: str = "V100-32GB", times: dict[str, float] | None = None
) -> dict[str, Any]:
    return {
        "format": "tagplan.profile",
        "version": 1,
        "device": {"gpu_type": gpu_type, "description": "test", "tensorflow_version": "2.21.0"},
        "source": {"graph": "zoo:mlp", "fingerprint": "ab12"},
        "batch_sizes": [8, 16, 32],
        "step_time_s": {"8": 0.01, "16": 0.018, "32": 0.034},
        "ops": [
            {
                "cost_key": RELU,
                "op_type": "Relu",
                "times_s": times or {"8": 2.0, "16": 3.0, "32": 7.0},
                "count": 2,
            },
            {"cost_key": MATMUL, "op_type": "MatMul", "times_s": {"8": 5.0}, "count": 1},
        ],
    }


class TestFormat:
    def test_round_trip(self, tmp_path: Path) -> None:
        profile = load_profile(profile_dict())
        text = dumps_profile(profile)
        assert load_profile(text.encode()) == profile
        path = tmp_path / "p.json"
        path.write_text(text)
        assert load_profile(path) == profile
        assert load_profile(str(path)) == profile
        assert json.loads(text)["ops"][0]["times_s"] == {"8": 2.0, "16": 3.0, "32": 7.0}

    def test_batch_sizes_become_integers(self) -> None:
        profile = load_profile(profile_dict())
        assert profile.ops[0].times_s == {8: 2.0, 16: 3.0, 32: 7.0}
        assert profile.step_time_s[16] == 0.018
        assert profile.ops[0].count == 2

    def test_built_in_python_with_integer_keys(self) -> None:
        data = profile_dict()
        data["ops"][1]["times_s"] = {8: 5}
        assert load_profile(data).ops[1].times_s == {8: 5.0}

    def test_one_line_per_op(self) -> None:
        text = dumps_profile(load_profile(profile_dict()))
        assert sum(1 for line in text.splitlines() if '"cost_key"' in line) == 2
        assert text.endswith("}\n")

    def test_zero_time_is_allowed(self) -> None:
        data = profile_dict(times={"8": 0.0})
        assert load_profile(data).ops[0].times_s == {8: 0.0}


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value

    return apply


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        del target[last]

    return apply


def _duplicate_op(data: dict[str, Any]) -> None:
    data["ops"].append(copy.deepcopy(data["ops"][0]))


INVALID = [
    ("wrong format", _set("format", "tagplan.strategy"), "format: expected 'tagplan.profile'"),
    ("missing format", _drop("format"), "format: expected"),
    ("wrong version", _set("version", 2), "version: Input should be 1"),
    ("version as bool", _set("version", True), "version: version must be the integer 1"),
    ("version as string", _set("version", "1"), "version"),
    ("missing device", _drop("device"), "device: required field is missing"),
    ("missing description", _drop("device.description"), "device.description: required field"),
    ("missing fingerprint", _drop("source.fingerprint"), "source.fingerprint: required field"),
    ("missing count", _drop("ops.0.count"), "ops[0].count: required field is missing"),
    ("missing times", _drop("ops.1.times_s"), "ops[1].times_s: required field is missing"),
    ("empty gpu type", _set("device.gpu_type", ""), "device.gpu_type: String should have"),
    ("blank gpu type", _set("device.gpu_type", "  "), "device.gpu_type: gpu_type must not"),
    ("negative time", _set("ops.0.times_s.16", -1.0), "ops[0].times_s[16]: Input should be"),
    ("nan time", _set("ops.0.times_s.8", math.nan), "ops[0].times_s[8]: Input should be a finite"),
    ("inf time", _set("ops.0.times_s.8", math.inf), "ops[0].times_s[8]: Input should be a finite"),
    ("string time", _set("ops.0.times_s.8", "2.0"), "ops[0].times_s[8]: Input should be a valid"),
    ("negative step", _set("step_time_s.8", -0.5), "step_time_s[8]: Input should be greater"),
    ("zero batch size", _set("batch_sizes", [0, 8, 16, 32]), "batch_sizes: batch sizes must be"),
    ("negative batch", _set("batch_sizes", [-8, 8, 16, 32]), "batch_sizes: batch sizes must be"),
    ("zero batch key", _set("ops.1.times_s", {"0": 1.0}), "ops[1].times_s: batch sizes must be"),
    ("float batch key", _set("ops.1.times_s", {"8.5": 1.0}), "batch size keys must be integers"),
    ("empty times", _set("ops.1.times_s", {}), "ops[1].times_s: Dictionary should have"),
    ("no batch sizes", _set("batch_sizes", []), "batch_sizes: List should have at least 1"),
    ("duplicate batch sizes", _set("batch_sizes", [8, 8, 16, 32]), "duplicate batch sizes"),
    ("undeclared batch", _set("ops.1.times_s", {"64": 1.0}), "ops[1].times_s: batch sizes [64]"),
    ("undeclared step", _set("step_time_s", {"4": 1.0}), "step_time_s: batch sizes [4] are not"),
    ("duplicate cost key", _duplicate_op, "ops[2].cost_key: duplicate cost key"),
    ("empty cost key", _set("ops.0.cost_key", ""), "ops[0].cost_key: String should have"),
    ("zero count", _set("ops.0.count", 0), "ops[0].count: Input should be greater than or equal"),
    ("float count", _set("ops.0.count", 1.5), "ops[0].count: Input should be a valid integer"),
    ("unknown field", _set("comment", "x"), "comment: unknown field"),
    ("ops not a list", _set("ops", {}), "ops: Input should be a valid list"),
]


class TestValidation:
    @pytest.mark.parametrize(
        ("mutate", "message"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID]
    )
    def test_refused_naming_the_field(self, mutate: Callable[..., None], message: str) -> None:
        data = profile_dict()
        mutate(data)
        with pytest.raises(InvalidInput, match="invalid profile: .*" + re.escape(message)):
            load_profile(data)

    def test_bytes_must_be_json(self) -> None:
        with pytest.raises(InvalidInput, match="not valid JSON"):
            load_profile(b"{not json")

    def test_top_level_must_be_an_object(self) -> None:
        with pytest.raises(InvalidInput, match="expected a JSON object"):
            load_profile(b"[1, 2]")

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidInput, match=r"cannot read profile 'absent\.json'"):
            load_profile(tmp_path / "absent.json")

    def test_nan_in_json_text(self) -> None:
        text = json.dumps(profile_dict()).replace('"8": 2.0', '"8": NaN')
        with pytest.raises(InvalidInput, match=r"ops\[0\]\.times_s\[8\]: Input should be a finite"):
            load_profile(text.encode())


POINTS = {8: 2.0, 16: 3.0, 32: 7.0}


class TestEstimateTime:
    @pytest.mark.parametrize(
        ("batch", "expected"),
        [
            (8, 2.0),  # measured
            (16, 3.0),
            (12, 2.5),  # 2 + (3 - 2) * 4/8
            (24, 5.0),  # 3 + (7 - 3) * 8/16
            (64, 15.0),  # above: 7 + (7 - 3)/16 * 32
            (40, 9.0),  # 7 + 0.25 * 8
            (4, 1.5),  # below: 2 - (3 - 2)/8 * 4 = 1.5, within [2 * 4/8, 2]
            (1, 1.125),  # 2 - 0.125 * 7
        ],
    )
    def test_rule(self, batch: int, expected: float) -> None:
        assert estimate_time(POINTS, batch) == pytest.approx(expected)

    def test_below_clamped_to_proportional_share(self) -> None:
        # superlinear points: the line gives 1 - 3/8 * 4 = -0.5; the floor is 1 * 4/8
        assert estimate_time({8: 1.0, 16: 4.0}, 4) == pytest.approx(0.5)
        assert estimate_time({8: 1.0, 16: 4.0}, 1) == pytest.approx(0.125)

    def test_below_never_above_smallest_measurement(self) -> None:
        # a falling line (noise) would give 2 + 0.5/8 * 4 = 2.25 at batch 4
        assert estimate_time({8: 2.0, 16: 1.5}, 4) == pytest.approx(2.0)

    def test_above_never_below_largest_measurement(self) -> None:
        assert estimate_time({8: 2.0, 16: 1.5}, 32) == pytest.approx(1.5)

    def test_uses_the_two_largest_points_above(self) -> None:
        # (16, 3) and (32, 7) -> slope 0.25; the smallest point does not matter
        assert estimate_time({1: 100.0, 16: 3.0, 32: 7.0}, 48) == pytest.approx(11.0)

    def test_single_point(self) -> None:
        assert estimate_time({8: 2.0}, 16) == pytest.approx(4.0)
        assert estimate_time({8: 2.0}, 20) == pytest.approx(5.0)
        assert estimate_time({8: 2.0}, 4) == pytest.approx(2.0)
        assert estimate_time({8: 2.0}, 8) == 2.0

    def test_positive_for_positive_points(self) -> None:
        for batch in range(1, 200):
            assert estimate_time({8: 1e-6, 16: 9e-6, 64: 1e-5}, batch) > 0

    @pytest.mark.parametrize("batch", [0, -4, 2.5, True])
    def test_batch_must_be_a_positive_integer(self, batch: Any) -> None:
        with pytest.raises(InvalidInput, match="batch size must be a positive integer"):
            estimate_time({8: 1.0}, batch)

    def test_needs_points(self) -> None:
        with pytest.raises(InvalidInput, match="no measured points"):
            estimate_time({}, 8)


class TestInMemoryProfileSource:
    def source(self) -> InMemoryProfileSource:
        return InMemoryProfileSource([load_profile(profile_dict())])

    def test_is_a_profile_source(self) -> None:
        assert isinstance(self.source(), ProfileSource)

    @pytest.mark.parametrize(
        ("batch", "expected"),
        [(16, 3.0), (12, 2.5), (64, 15.0), (4, 1.5)],
        ids=["exact", "interpolated", "extrapolated", "below-min"],
    )
    def test_lookup(self, batch: int, expected: float) -> None:
        assert self.source().lookup(RELU, "V100-32GB", batch) == pytest.approx(expected)

    def test_single_point(self) -> None:
        source = self.source()
        assert source.lookup(MATMUL, "V100-32GB", 32) == pytest.approx(20.0)
        assert source.lookup(MATMUL, "V100-32GB", 2) == pytest.approx(5.0)

    def test_unknown_key_and_gpu_type(self) -> None:
        source = self.source()
        assert source.lookup("Relu|float32[B,5]|T=float32", "V100-32GB", 8) is None
        assert source.lookup(RELU, "T4", 8) is None

    def test_gpu_type_case_insensitive(self) -> None:
        source = self.source()
        assert source.lookup(RELU, "v100-32gb", 8) == 2.0
        assert source.lookup(RELU, "V100-32gb", 12) == pytest.approx(2.5)
        assert source.gpu_types == ["V100-32GB"]

    def test_several_gpu_types(self) -> None:
        source = self.source()
        source.add_profile(load_profile(profile_dict("T4", {"8": 10.0})))
        assert source.lookup(RELU, "t4", 16) == pytest.approx(20.0)
        assert source.lookup(RELU, "V100-32GB", 16) == 3.0
        assert sorted(source.gpu_types) == ["T4", "V100-32GB"]

    def test_profiles_merge_and_the_first_wins(self) -> None:
        source = self.source()
        other = profile_dict(times={"8": 99.0})
        other["batch_sizes"] = [8, 64]
        other["step_time_s"] = {}
        other["ops"][0]["times_s"] = {"8": 99.0, "64": 11.0}
        source.add_profile(load_profile(other))
        assert source.points(RELU, "V100-32GB") == {8: 2.0, 16: 3.0, 32: 7.0, 64: 11.0}
        source.add_profile(load_profile(other), replace=True)
        assert source.lookup(RELU, "V100-32GB", 8) == 99.0

    def test_add_profile_under_another_gpu_type(self) -> None:
        source = InMemoryProfileSource()
        source.add_profile(load_profile(profile_dict()), gpu_type="A100-40GB")
        assert source.lookup(RELU, "a100-40gb", 8) == 2.0
        assert source.lookup(RELU, "V100-32GB", 8) is None

    def test_add_by_hand_replaces(self) -> None:
        source = InMemoryProfileSource()
        source.add(RELU, "L4", 8, 1.0)
        source.add(RELU, "L4", 8, 2.0)
        source.add(RELU, "l4", 16, 4.0)
        assert source.points(RELU, "L4") == {8: 2.0, 16: 4.0}
        assert source.lookup(RELU, "L4", 12) == pytest.approx(3.0)
        assert len(source) == 1

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("", "L4", 8, 1.0), "cost key must not be empty"),
            ((RELU, " ", 8, 1.0), "gpu_type must not be empty"),
            ((RELU, "L4", 0, 1.0), "batch size must be a positive integer"),
            ((RELU, "L4", 8, -1.0), "finite and non-negative"),
            ((RELU, "L4", 8, math.inf), "finite and non-negative"),
        ],
    )
    def test_add_refuses_bad_points(self, args: tuple[Any, ...], message: str) -> None:
        with pytest.raises(InvalidInput, match=message):
            InMemoryProfileSource().add(*args)

    def test_lookup_refuses_bad_batch(self) -> None:
        with pytest.raises(InvalidInput, match="batch size must be a positive integer"):
            self.source().lookup(RELU, "V100-32GB", 0)
        with pytest.raises(InvalidInput, match="batch size must be a positive integer"):
            self.source().lookup("unknown", "V100-32GB", -1)


def test_profile_model_is_frozen() -> None:
    profile = load_profile(profile_dict())
    assert isinstance(profile, Profile)
    with pytest.raises(Exception, match="frozen"):
        profile.version = 2  # type: ignore[misc]
