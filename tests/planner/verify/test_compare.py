"""The verification criterion, compared a chunk at a time, against numpy's own
``isclose`` on whole arrays."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.verify import compare as module
from tagplan.planner.verify.compare import Tolerance, compare, largest_magnitude


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch) -> None:
    monkeypatch.setattr(module, "_CHUNK", 7)  # many chunks, the last one short


def _pair(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    expected = rng.standard_normal((5, 11))
    actual = expected * (1 + rng.uniform(-2e-4, 2e-4, expected.shape))
    return actual, expected


@pytest.mark.parametrize("seed", range(5))
def test_the_verdict_and_worst_errors_are_numpys(seed: int) -> None:
    actual, expected = _pair(seed)
    errors = compare(actual, expected, Tolerance(1e-4, 1e-12))
    assert errors.close == bool(np.all(np.isclose(actual, expected, rtol=1e-4, atol=1e-12)))
    diff = np.abs(actual - expected)
    assert errors.max_abs == diff.max()
    assert errors.max_rel == pytest.approx((diff / np.abs(expected)).max(), rel=1e-12)
    assert errors.largest == largest_magnitude(expected) == np.abs(expected).max()
    assert errors.scaled == errors.max_abs / errors.largest


def test_noise_elements_get_their_own_floor_and_nothing_else_does() -> None:
    expected = np.zeros(20)
    actual = np.zeros(20)
    actual[3] = 1e-9  # a noise element moved by rounding
    noise = np.zeros(20, bool)
    noise[3] = True
    assert compare(actual, expected, Tolerance(1e-4, 1e-12, noise, 1e-8)).close
    assert not compare(actual, expected, Tolerance(1e-4, 1e-12)).close
    actual[4] = 1e-9  # the same move where the reference saw a real gradient
    assert not compare(actual, expected, Tolerance(1e-4, 1e-12, noise, 1e-8)).close


def test_a_difference_where_zero_is_expected_is_infinitely_relative() -> None:
    errors = compare(np.array([0.0, 1e-20]), np.array([0.0, 0.0]), Tolerance(1e-4, 1e-12))
    assert errors.close and errors.max_rel == np.inf and errors.scaled == np.inf
    assert compare(np.array(2.0), np.array(2.0), Tolerance(1e-4, 0.0)).max_rel == 0.0
