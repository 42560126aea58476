"""Fuzzing the graph importer (read the bytes, then analyze) with mutated zoo graphs.

Every mutation (truncated or flipped bytes of the binary, gzip, text and JSON forms; huge
or negative dimensions; deep nesting; cycles; dangling inputs; wrong dtypes; unknown ops;
duplicated, nameless and dropped nodes) is either imported or refused with a one-line
:class:`~tagplan.planner.errors.PlannerError`; nothing else may escape. Seeded: the same
graphs every run.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import text_format

from tagplan.planner.errors import InvalidInput, PlannerError
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.load import loads_graph_def
from tagplan.planner.graph.neutral_json import OUTPUT_SHAPES_ATTR
from tagplan.planner.graph.protos import GraphDef
from tests.planner.zoo_graphs import zoo_source

MODELS = ("mlp", "small_cnn", "tiny_lstm")
GRAPHS_PER_MUTATION = 8
"""Mutated graphs per model and mutation: 3 models x 20 mutations x 8 = 480."""

Mutation = Callable[[random.Random, Any], bytes]


def _flip(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def _node(rng: random.Random, graph: Any, with_attr: str | None = None) -> Any:
    nodes = [n for n in graph.node if with_attr is None or with_attr in n.attr]
    return rng.choice(nodes or list(graph.node))


def _edit(change: Callable[[random.Random, Any], None]) -> Mutation:
    """A mutation of the parsed graph, sent as binary."""

    def mutate(rng: random.Random, graph: Any) -> bytes:
        change(rng, graph)
        return graph.SerializeToString(deterministic=True)

    return mutate


def _huge_dim(rng: random.Random, graph: Any) -> None:
    node = _node(rng, graph, "shape")
    size = rng.choice([2**62, 2**63 - 1, 10**12, -7, 0])
    if "shape" in node.attr:
        node.attr["shape"].shape.dim.add().size = size
        node.attr["shape"].shape.dim[0].size = size
    node = _node(rng, graph, OUTPUT_SHAPES_ATTR)
    if OUTPUT_SHAPES_ATTR in node.attr:
        for shape in node.attr[OUTPUT_SHAPES_ATTR].list.shape:
            shape.dim.add().size = size


def _cycle(rng: random.Random, graph: Any) -> None:
    first, second = rng.sample(list(graph.node), 2)
    first.input.append(second.name)
    second.input.append(first.name)


def _dangling(rng: random.Random, graph: Any) -> None:
    _node(rng, graph).input.append(rng.choice(["missing", "missing:3", "^missing", ":", ""]))


def _bad_slot(rng: random.Random, graph: Any) -> None:
    source = _node(rng, graph)
    _node(rng, graph).input.append(f"{source.name}:{rng.choice([1, 99, 2**40])}")


def _wrong_dtype(rng: random.Random, graph: Any) -> None:
    node = _node(rng, graph, rng.choice(["T", "dtype"]))
    for key in ("T", "dtype"):
        if key in node.attr:
            node.attr[key].type = rng.choice([0, 7, 20, 23, 999])


def _unknown_op(rng: random.Random, graph: Any) -> None:
    for _ in range(rng.randint(1, 5)):
        _node(rng, graph).op = rng.choice(["FuzzOp", "Conv9D", "\u2603", "MatMul "])


def _drop_nodes(rng: random.Random, graph: Any) -> None:
    for _ in range(rng.randint(1, 10)):
        del graph.node[rng.randrange(len(graph.node))]


def _duplicate(rng: random.Random, graph: Any) -> None:
    graph.node.add().CopyFrom(_node(rng, graph))


def _nameless(rng: random.Random, graph: Any) -> None:
    node = _node(rng, graph)
    setattr(node, rng.choice(["name", "op"]), "")


def _deep_chain(rng: random.Random, graph: Any) -> None:
    """Thousands of Identity ops after one node: a deep graph, not a wide one."""
    previous = _node(rng, graph, "T")
    for depth in range(rng.choice([2000, 5000])):
        node = graph.node.add(name=f"chain_{depth}", op="Identity", input=[previous.name])
        node.attr["T"].CopyFrom(previous.attr["T"])
        previous = node


def _deep_attr(rng: random.Random, graph: Any) -> bytes:
    """An attribute of functions nested far past any parser's recursion limit."""
    depth = rng.choice([200, 5000])
    nested = "func { name: 'f' attr { key: 'a' value { " * depth + "b: true" + " } } }" * depth
    node = f"node {{ name: 'deep' op: 'NoOp' attr {{ key: 'a' value {{ {nested} }} }} }}"
    return (text_format.MessageToString(graph) + node).encode()


def _deep_json(rng: random.Random, graph: Any) -> bytes:
    depth = rng.choice([1000, 100_000])
    return b'{"nodes": ' + b"[" * depth + b"]" * depth + b"}"


MUTATIONS: dict[str, Mutation] = {
    "truncated": lambda rng, g: (d := g.SerializeToString(deterministic=True))[
        : rng.randrange(1, len(d))
    ],
    "flipped": lambda rng, g: _flip(rng, g.SerializeToString(deterministic=True)),
    "gzip truncated": lambda rng, g: (z := gzip.compress(g.SerializeToString(deterministic=True)))[
        : rng.randrange(1, len(z))
    ],
    "gzip flipped": lambda rng, g: _flip(
        rng, gzip.compress(g.SerializeToString(deterministic=True), mtime=0)
    ),
    "text flipped": lambda rng, g: _flip(rng, text_format.MessageToString(g).encode()),
    "json flipped": lambda rng, g: _flip(rng, json.dumps({"nodes": [{"name": "x"}]}).encode()),
    "huge dims": _edit(_huge_dim),
    "cycle": _edit(_cycle),
    "dangling input": _edit(_dangling),
    "output slot": _edit(_bad_slot),
    "wrong dtype": _edit(_wrong_dtype),
    "unknown op": _edit(_unknown_op),
    "dropped nodes": _edit(_drop_nodes),
    "duplicate name": _edit(_duplicate),
    "empty name or op": _edit(_nameless),
    "deep chain": _edit(_deep_chain),
    "deep attribute": _deep_attr,
    "deep json": _deep_json,
    "empty": lambda rng, g: rng.choice([b"", b" \n", b"\x1f\x8b", gzip.compress(b"")]),
    "no nodes": lambda rng, g: rng.choice([GraphDef().SerializeToString(), b"{}", b"[]"]),
}


def import_graph(data: bytes, model: str) -> Any:
    """What a worker does with an upload: read it, then analyze it."""
    source = zoo_source(model)
    return analyze(loads_graph_def(data), batch_inputs=source.batch_inputs, loss=source.loss)


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutated_graphs_import_or_are_refused_in_one_line(mutation: str) -> None:
    crashes = []
    for model in MODELS:
        for seed in range(GRAPHS_PER_MUTATION):
            graph = GraphDef()
            graph.CopyFrom(zoo_source(model).graph_def)
            data = MUTATIONS[mutation](random.Random(f"{mutation}/{model}/{seed}"), graph)
            try:
                import_graph(data, model)
            except PlannerError as exc:
                message = str(exc)
                if not message or "\n" in message:
                    crashes.append((model, seed, f"not one line: {message!r}"))
            except Exception as exc:
                crashes.append((model, seed, f"{type(exc).__name__}: {exc}"[:300]))
    assert not crashes, crashes


def _mlp() -> Any:
    graph = GraphDef()
    graph.CopyFrom(zoo_source("mlp").graph_def)
    return graph


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # Text whose first 4 KiB are UTF-8 and the rest not: UnicodeDecodeError.
        (text_format.MessageToString(_mlp()).encode() + b"\xff", "not a valid text GraphDef"),
        # Nesting past the interpreter's recursion limit: RecursionError.
        (b'{"nodes": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests too deeply"),
        (MUTATIONS["deep attribute"](random.Random(1), _mlp()), "nests too deeply"),
    ],
)
def test_what_the_fuzzing_found_in_reading(data: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        import_graph(data, "mlp")


def test_a_variable_too_large_for_int64_bytes_is_refused() -> None:
    """Byte counts of a variable of 2**62 rows wrapped round in int64 (or overflowed it)."""
    graph = _mlp()
    variable = next(n for n in graph.node if n.op == "VarHandleOp")
    variable.attr["shape"].shape.dim[0].size = 2**62
    with pytest.raises(InvalidInput, match=f"of node {variable.name!r} takes"):
        import_graph(graph.SerializeToString(), "mlp")


def test_a_colocation_list_of_bytes_that_are_not_utf8_reads() -> None:
    """A flipped byte in a ``_class`` list left it not UTF-8 (UnicodeDecodeError): it reads
    with replacement characters, names no op, and the graph still analyzes."""
    graph = _mlp()
    node = next(n for n in graph.node if n.op == "VarHandleOp")
    node.attr["_class"].list.s[:] = [b"loc:@\xd6\xff"]
    ir = import_graph(graph.SerializeToString(deterministic=True), "mlp")
    assert ir.num_ops > 0
