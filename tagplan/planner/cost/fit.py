"""Segmented-linear models of transfer time fitted to measurements (TAG §4.1.2: the
profiler fits segmented linear regressions for point-to-point and AllReduce times)."""

from __future__ import annotations

import itertools
from typing import Annotated

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import InvalidInput

__all__ = [
    "Seconds",
    "Segment",
    "SegmentedLinear",
    "as_seconds",
    "as_sizes",
    "fit_segmented_linear",
]

Seconds = float | npt.NDArray[np.float64]
"""A time in seconds: a float for a scalar size, an array for an array of sizes."""


def as_sizes(nbytes: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], bool]:
    """``nbytes`` as a float array and whether it was a scalar; refuses negative sizes."""
    try:
        sizes = np.asarray(nbytes, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInput(f"nbytes must be a number of bytes, got {nbytes!r}") from None
    if not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
        raise InvalidInput(f"nbytes must be finite and >= 0, got {nbytes!r}")
    return sizes, sizes.ndim == 0


def as_seconds(seconds: npt.NDArray[np.float64], scalar: bool) -> Seconds:
    return float(seconds) if scalar else seconds


class Segment(BaseModel):
    """One piece of a :class:`SegmentedLinear`: ``t = intercept_s + slope_s_per_byte · S``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    intercept_s: Annotated[float, Field(allow_inf_nan=False)]
    slope_s_per_byte: Annotated[float, Field(ge=0, allow_inf_nan=False)]


class SegmentedLinear(BaseModel):
    """A transfer time in seconds as a piecewise-linear function of bytes (TAG §4.1.2).

    ``segments[i]`` holds for sizes in ``[breakpoints_bytes[i-1], breakpoints_bytes[i])``
    (the first from 0, the last up to infinity: beyond the measured range the last piece
    extrapolates linearly). Slopes are ``>= 0`` and each piece is floored at the value
    the previous pieces reached, so predictions never decrease with size:

    .. math:: t(S) = \\max\\left(a_i + b_i S,\\; \\max_{j<i} (a_j + b_j β_j)\\right),
              \\quad β_{i-1} \\le S < β_i

    >>> model = SegmentedLinear(
    ...     breakpoints_bytes=(1000.0,),
    ...     segments=(
    ...         Segment(intercept_s=1e-5, slope_s_per_byte=0.0),
    ...         Segment(intercept_s=0.0, slope_s_per_byte=1e-8),
    ...     ),
    ... )
    >>> model.predict([10, 1000, 4000]).tolist()
    [1e-05, 1e-05, 4e-05]
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    breakpoints_bytes: tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)], ...] = ()
    segments: tuple[Segment, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> SegmentedLinear:
        breaks = self.breakpoints_bytes
        for left, right in itertools.pairwise(breaks):
            if right <= left:
                raise ValueError(
                    f"breakpoints_bytes must be strictly increasing, got {list(breaks)}"
                )
        if len(self.segments) != len(breaks) + 1:
            raise ValueError(
                f"{len(self.segments)} segments need {len(self.segments) - 1} breakpoints, "
                f"got {len(breaks)}"
            )
        if self.segments[0].intercept_s < 0:
            raise ValueError(
                f"the first segment predicts negative times (intercept_s "
                f"{self.segments[0].intercept_s} < 0)"
            )
        return self

    @property
    def num_segments(self) -> int:
        """Number of linear pieces."""
        return len(self.segments)

    def predict(self, nbytes: npt.ArrayLike) -> Seconds:
        """Predicted seconds for ``nbytes`` (a number or an array of sizes)."""
        sizes, scalar = as_sizes(nbytes)
        intercept = np.array([s.intercept_s for s in self.segments])
        slope = np.array([s.slope_s_per_byte for s in self.segments])
        breaks = np.array(self.breakpoints_bytes, dtype=np.float64)
        # floor[i]: the highest value the pieces before i reach (at their right ends).
        ends = intercept[:-1] + slope[:-1] * breaks
        floor = np.maximum.accumulate(np.concatenate([[0.0], ends]))
        piece = np.searchsorted(breaks, sizes, side="right")
        seconds = np.maximum(intercept[piece] + slope[piece] * sizes, floor[piece])
        return as_seconds(seconds, scalar)


def _fit_line(x: np.ndarray, t: np.ndarray, *, first: bool) -> tuple[float, float, float]:
    """Least squares of the relative error ``(a + b x - t) / t``: (a, b, Σ error²).

    Constrained to ``b >= 0`` (flat line at the weighted mean) and, for the first
    segment, ``a >= 0`` (line through the origin).
    """
    w = 1.0 / t
    scale = float(x.max())
    design = np.column_stack([w, w * x / scale])
    if np.unique(x).size > 1:
        (a, b), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
        b /= scale
    else:
        a, b = -1.0, -1.0
    if b < 0:
        a, b = float(np.sum(w) / np.sum(w * w)), 0.0
    elif first and a < 0:
        xw = x * w
        a, b = 0.0, float(np.sum(xw) / np.sum(xw * xw))
    error = float(np.sum((a * w + b * x * w - 1.0) ** 2))
    return float(a), float(b), error


def _breakpoint(
    lo: float, hi: float, left: tuple[float, float], right: tuple[float, float]
) -> float:
    """Where two fitted pieces meet between sizes ``lo < hi`` (their crossing if it lies
    there, else the geometric midpoint)."""
    (a0, b0), (a1, b1) = left, right
    if b0 != b1:
        cross = (a1 - a0) / (b0 - b1)
        tolerance = 1e-9 * hi
        if lo - tolerance <= cross <= hi + tolerance:
            return min(max(cross, lo), hi)
    return float(np.sqrt(lo * hi))


def fit_segmented_linear(
    sizes_bytes: npt.ArrayLike, times_s: npt.ArrayLike, max_segments: int = 3
) -> SegmentedLinear:
    """Fit a monotone :class:`SegmentedLinear` to measured transfer times (TAG §4.1.2).

    Each piece is a least-squares line of the *relative* error ``(t̂ - t) / t`` (sizes
    span six orders of magnitude; absolute errors would ignore small transfers), with
    slope ``>= 0``. Pieces split the distinct sizes into runs of at least three (two
    below six sizes), and the last of several pieces must rise (it extrapolates past the
    largest size). For each number of pieces ``s <= max_segments`` the split minimizing
    the total squared relative error ``E_s`` is found exhaustively (dynamic programming,
    ``O(s·m²)`` line fits for ``m`` distinct sizes), and ``s`` minimizes
    ``n·ln(E_s/n) + (3s - 1)·ln n`` (BIC over ``n`` points), so a piece is added only
    when it pays. Breakpoints lie where neighbouring pieces cross, between the last size
    of one and the first of the next. Sizes may repeat (several runs per size).
    """
    x = np.asarray(sizes_bytes, dtype=np.float64).ravel()
    t = np.asarray(times_s, dtype=np.float64).ravel()
    if x.size != t.size or x.size == 0:
        raise InvalidInput(
            f"need as many sizes as times, at least one; got {x.size} sizes, {t.size} times"
        )
    if not (np.all(np.isfinite(x)) and np.all(x > 0)):
        raise InvalidInput("sizes_bytes must be finite and > 0")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise InvalidInput("times_s must be finite and > 0 (a transfer takes time)")
    if isinstance(max_segments, bool) or not isinstance(max_segments, int) or max_segments < 1:
        raise InvalidInput(f"max_segments must be an integer >= 1, got {max_segments!r}")
    order = np.argsort(x, kind="stable")
    x, t = x[order], t[order]
    distinct, starts = np.unique(x, return_index=True)
    bounds = np.append(starts, x.size)  # points of distinct size j: bounds[j]:bounds[j+1]
    m = distinct.size
    # A line through two sizes always fits; runs of three keep pieces from chasing noise.
    min_run = 1 if m == 1 else 2 if m < 6 else 3
    max_pieces = max(1, min(max_segments, m // min_run))

    fits: dict[tuple[int, int], tuple[float, float, float]] = {}

    def piece(i: int, j: int) -> tuple[float, float, float]:
        """Fit over distinct sizes ``i..j-1``."""
        if (i, j) not in fits:
            sl = slice(bounds[i], bounds[j])
            fits[i, j] = _fit_line(x[sl], t[sl], first=i == 0)
        return fits[i, j]

    # best[s][j]: (error, cuts) of the best split of distinct sizes 0..j-1 into s pieces.
    best: list[dict[int, tuple[float, tuple[int, ...]]]] = [{0: (0.0, ())}]
    for s in range(1, max_pieces + 1):
        layer: dict[int, tuple[float, tuple[int, ...]]] = {}
        for j in range(s * min_run, m + 1):
            options = [
                (error + piece(i, j)[2], (*cuts, i))
                for i, (error, cuts) in best[s - 1].items()
                if j - i >= min_run and (j < m or s == 1 or piece(i, j)[1] > 0)
            ]
            if options:
                layer[j] = min(options)
        best.append(layer)

    n = x.size
    candidates = []
    for s in range(1, max_pieces + 1):
        if m in best[s]:
            error, cuts = best[s][m]
            bic = n * np.log(max(error / n, 1e-24)) + (3 * s - 1) * np.log(n)
            candidates.append((bic, s, cuts))
    _, _, cuts = min(candidates)
    edges = [*cuts[1:], m]
    lines = [piece(i, j)[:2] for i, j in zip(cuts, edges, strict=True)]
    breaks = tuple(
        _breakpoint(distinct[i - 1], distinct[i], lines[k], lines[k + 1])
        for k, i in enumerate(cuts[1:])
    )
    segments = tuple(Segment(intercept_s=a, slope_s_per_byte=b) for a, b in lines)
    return SegmentedLinear(breakpoints_bytes=breaks, segments=segments)
