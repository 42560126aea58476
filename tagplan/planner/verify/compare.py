"""The elementwise criterion of verification (:mod:`.verify`): ``|actual - expected| <=
atol + rtol * |expected|`` (``numpy.testing.assert_allclose``'s), with a larger absolute
floor for the elements a reference step marks as rounding noise, and the worst errors.

Arrays are compared a chunk at a time in float64: VGG19's first dense kernel is 822 MB in
float64, and the temporaries of a whole-array comparison (difference, magnitudes, bound,
relative error) would be five times that on top of the values themselves."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Errors", "Tolerance", "compare", "largest_magnitude"]

_CHUNK = 1 << 22  # elements at a time: 32 MiB per float64 temporary


@dataclass(frozen=True)
class Tolerance:
    """``atol + rtol * |expected|``; elements where ``noise`` holds get ``noise_atol``
    instead of ``atol`` when it is larger."""

    rtol: float
    atol: float
    noise: np.ndarray | None = None
    noise_atol: float = 0.0


@dataclass(frozen=True)
class Errors:
    """What a comparison found: the worst absolute and relative errors (an element that
    differs where the expected value is zero has an infinite relative error), the
    largest expected magnitude, and whether every element met the tolerance."""

    max_abs: float
    max_rel: float
    largest: float
    close: bool

    @property
    def scaled(self) -> float:
        """The worst absolute error over the largest expected magnitude."""
        if self.largest:
            return self.max_abs / self.largest
        return math.inf if self.max_abs else 0.0


def _chunks(size: int) -> range:
    return range(0, size, _CHUNK)


def largest_magnitude(values: np.ndarray) -> float:
    flat = values.reshape(-1)
    return max(
        (float(np.abs(flat[lo : lo + _CHUNK]).max()) for lo in _chunks(flat.size)), default=0.0
    )


def compare(actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance) -> Errors:
    """``actual`` against ``expected`` (same shape) under ``tolerance``."""
    a, e = actual.reshape(-1), expected.reshape(-1)
    noise = None if tolerance.noise is None else tolerance.noise.reshape(-1)
    noise_atol = max(tolerance.atol, tolerance.noise_atol)
    max_abs = max_rel = largest = 0.0
    close = True
    for lo in _chunks(a.size):
        hi = lo + _CHUNK
        wanted = e[lo:hi].astype(np.float64)
        diff = np.abs(a[lo:hi].astype(np.float64) - wanted)
        scale = np.abs(wanted)
        floor: float | np.ndarray = tolerance.atol
        if noise is not None:
            floor = np.where(noise[lo:hi], noise_atol, tolerance.atol)
        close = close and bool(np.all(diff <= floor + tolerance.rtol * scale))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(diff == 0, 0.0, diff / scale)
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(rel.max()))
        largest = max(largest, float(scale.max()))
    return Errors(max_abs, max_rel, largest, close)
