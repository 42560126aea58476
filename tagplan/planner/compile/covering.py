"""Which pieces of a split tensor make up a range of its rows, for both back ends.

A reader of rows ``[lo, hi)`` whose exact piece exists nowhere (a stage of two GPUs
feeding a stage of one, a micro-batch cut differently by two groups) is served from the
pieces that cover its rows, instead of a whole copy of the tensor gathered on one GPU and
cut again: one piece holding the rows is cut where it is; several adjacent pieces are
sent to the reader and concatenated there (then cut, should they overhang).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

__all__ = ["covering_pieces"]


class _Rows(Protocol):
    @property
    def lo(self) -> int: ...

    @property
    def hi(self) -> int: ...


PieceT = TypeVar("PieceT", bound=_Rows)


def covering_pieces(
    pieces: Sequence[PieceT], lo: int, hi: int, closest: Callable[[list[PieceT]], PieceT]
) -> list[PieceT] | None:
    """Adjacent pieces, left to right, whose rows ``[a, b)`` contain ``[lo, hi)`` (the
    widest piece at each step; ``closest`` picks among equal ones), or ``None`` when the
    pieces leave a gap."""
    by_start: dict[int, list[PieceT]] = {}
    for piece in pieces:
        if piece.lo < hi and piece.hi > lo:
            by_start.setdefault(piece.lo, []).append(piece)
    position = max((start for start in by_start if start <= lo), default=None)
    if position is None:
        return None
    chosen: list[PieceT] = []
    while position < hi:
        options = by_start.get(position)
        if not options:
            return None
        widest = max(piece.hi for piece in options)
        chosen.append(closest([piece for piece in options if piece.hi == widest]))
        position = widest
    return chosen
