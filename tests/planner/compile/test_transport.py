"""The transport planner's rules (compile/transport.py), through a back end that records
what each rule asks it to emit. Both real back ends are held to these rules by their own
tests (the same task graph and GraphDef for every zoo model and strategy)."""

from __future__ import annotations

from typing import NamedTuple

from tagplan.planner.compile.transport import FULL, SLICE, SUM, TransportRules

BATCH = 8
MACHINE = [0, 0, 1, 1]  # GPUs 0, 1 on one machine, 2, 3 on another


class Piece(NamedTuple):
    device: int
    lo: int
    hi: int
    kind: int
    made_by: str = "instance"


class Recorder(TransportRules[Piece]):
    """Emits nothing but a log of what the rules asked for."""

    def __init__(
        self,
        readers: set[int],
        *,
        micro_batched: bool = False,
        rows: list[tuple[int, int, int]] | None = None,
    ) -> None:
        super().__init__(None, BATCH, MACHINE)  # no gradients: no strategy to sync them
        self.readers, self.micro, self.rows = readers, micro_batched, rows or []
        self.log: list[tuple] = []

    def _move(self, tensor: int, copy: Piece, device: int, reader: int) -> Piece:
        self.log.append(("move", copy.device, device, copy.lo, copy.hi))
        return self._keep(tensor, copy._replace(device=device, made_by="move"))

    def _concat(self, tensor, pieces, device, lo, hi, reader) -> Piece:
        local = [self._local(tensor, p, device, reader) for p in pieces]
        self.log.append(("concat", device, [(p.lo, p.hi) for p in local]))
        kind = FULL if (lo, hi) == (0, BATCH) else SLICE
        return self._keep(tensor, Piece(device, lo, hi, kind, "concat"))

    def _cut(self, tensor, source, lo, hi, reader, members) -> Piece:
        self.log.append(("cut", source.device, lo, hi))
        piece = Piece(source.device, lo, hi, SLICE, "cut")
        self.cache[(tensor, source.device, lo, hi)] = piece
        return piece

    def _split(self, tensor, source, rows, reader) -> list[Piece]:
        self.log.append(("split", source.device, [(lo, hi) for lo, hi, _ in rows]))
        return [Piece(source.device, lo, hi, SLICE, "split") for lo, hi, _ in rows]

    def _allreduce(self, tensor, partial, members, reader) -> None:
        self.log.append(("allreduce", members))
        for member in members:
            self._keep(tensor, Piece(member, 0, BATCH, FULL, "allreduce"))

    def _add(self, tensor, pieces, device, reader, kind) -> Piece:
        self.log.append(("add", device, len(pieces)))
        return Piece(device, 0, BATCH, kind, "add")

    def _sum(self, tensor, partial, device, reader) -> Piece:
        self.log.append(("sum", device, sorted(p.device for p in partial)))
        return Piece(device, 0, BATCH, FULL, "sum")

    def _reader_devices(self, reader: int) -> set[int]:
        return self.readers

    def _micro_batched(self, tensor: int) -> bool:
        return self.micro

    def _reader_rows(self, reader: int) -> list[tuple[int, int, int]]:
        return self.rows


def produced(rules: Recorder, *pieces: Piece) -> None:
    rules._record_copies(0, pieces)


def test_a_whole_copy_comes_from_the_same_gpu_then_the_same_machine() -> None:
    rules = Recorder({0})
    produced(rules, Piece(0, 0, BATCH, FULL), Piece(2, 0, BATCH, FULL))
    assert rules._full(0, 2, reader=0).made_by == "instance"  # already there
    assert rules._full(0, 3, reader=0).made_by == "move"
    assert rules.log == [("move", 2, 3, 0, BATCH)]  # GPU 2 shares GPU 3's machine
    rules._full(0, 3, reader=0)
    assert len(rules.log) == 1  # the moved copy is fetched, not moved again
    rules._full(0, 1, reader=0)
    assert rules.log[-1] == ("move", 0, 1, 0, BATCH)


def test_partials_read_on_every_gpu_holding_one_are_allreduced_else_summed() -> None:
    mirrored = Recorder({0, 1})
    produced(mirrored, Piece(0, 0, 4, SUM), Piece(1, 4, 8, SUM))
    assert mirrored._full(0, 1, reader=0).made_by == "allreduce"
    assert mirrored.log == [("allreduce", (0, 1))]
    elsewhere = Recorder({2})
    produced(elsewhere, Piece(0, 0, 4, SUM), Piece(1, 4, 8, SUM))
    assert elsewhere._full(0, 2, reader=0).made_by == "sum"
    assert elsewhere.log == [("sum", 2, [0, 1])]


def test_micro_batches_partials_add_up_on_their_gpu_before_they_travel() -> None:
    rules = Recorder({2}, micro_batched=True)
    produced(rules, Piece(0, 0, 2, SUM), Piece(0, 2, 4, SUM), Piece(1, 4, 8, SUM))
    rules._full(0, 2, reader=0)
    assert rules.log == [("add", 0, 2), ("sum", 2, [0, 1])]


def test_rows_across_two_pieces_are_joined_where_read_then_cut() -> None:
    rules = Recorder({3})
    produced(rules, Piece(0, 0, 4, SLICE), Piece(1, 4, 8, SLICE))
    piece = rules._slice(0, 3, 2, 6, reader=0)
    assert (piece.device, piece.lo, piece.hi) == (3, 2, 6)
    assert rules.log == [
        ("move", 0, 3, 0, 4),
        ("move", 1, 3, 4, 8),
        ("concat", 3, [(0, 4), (4, 8)]),
        ("cut", 3, 2, 6),
    ]


def test_rows_of_a_whole_tensor_are_cut_on_the_hub_in_one_split_and_moved() -> None:
    """The reader has an instance on every GPU; the first whole copy (GPU 2) is the hub.
    One split there cuts the rows of the instances it serves (not its own, not GPU 3's,
    which holds a whole copy); each piece moves when its instance reads it."""
    rules = Recorder({0}, rows=[(0, 0, 2), (1, 2, 4), (2, 4, 6), (3, 6, 8)])
    produced(rules, Piece(2, 0, BATCH, FULL), Piece(3, 0, BATCH, FULL))
    piece = rules._slice(0, 0, 0, 2, reader=0)
    assert (piece.device, piece.lo, piece.hi) == (0, 0, 2)
    assert rules.log == [("split", 2, [(0, 2), (2, 4)]), ("move", 2, 0, 0, 2)]
    assert rules._slice(0, 0, 0, 2, reader=0) == piece  # cached where it is read
    rules._slice(0, 1, 2, 4, reader=0)
    rules._slice(0, 2, 4, 6, reader=0)
    rules._slice(0, 3, 6, 8, reader=0)
    assert rules.log[2:] == [("move", 2, 1, 2, 4), ("cut", 2, 4, 6), ("cut", 3, 6, 8)]
