"""Build the zoo's training graphs with TensorFlow and commit them.

``python -m tagplan.planner.zoo.generate [NAME ...]`` rebuilds the named models
(all by default): it writes ``graphs/<name>.pb.gz``, updates that model's entry
in ``manifest.json`` and rewrites ``README.md`` from the manifest. Output is
deterministic: seeds are fixed and gzip headers carry no timestamp, so a rebuild
with the same TensorFlow version reproduces the committed bytes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tagplan.planner.errors import InvalidInput
from tagplan.planner.zoo import catalog
from tagplan.planner.zoo.catalog import (
    GRAPHS_DIRNAME,
    MIB,
    ZOO_DIR,
    ZooModel,
    model_from_entry,
)

if TYPE_CHECKING:  # the builders import TensorFlow; load them only when building
    from tagplan.planner.zoo.models.common import TrainGraph

__all__ = ["MODELS", "ModelSpec", "build", "generate", "generate_all", "main", "model_spec"]

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class ModelSpec:
    """How to build one zoo model and what to record about it."""

    batch_size: int
    style: Literal["tf1", "tf2"]
    description: str
    builder: Callable[..., TrainGraph]
    tag_table3: dict[str, Any] | None = None
    min_image_size: int | None = None  # rebuildable at another image size down to this


def _vgg19(batch: int) -> TrainGraph:
    from .models import vgg

    return vgg.build(batch)


def _resnet101(batch: int, image_size: int | None = None) -> TrainGraph:
    from .models import resnet

    return resnet.build(batch, image_size or resnet.IMAGE_SIZE)


def _inception_v3(batch: int, image_size: int | None = None) -> TrainGraph:
    from .models import inception

    return inception.build(batch, image_size or inception.IMAGE_SIZE)


def _transformer(batch: int) -> TrainGraph:
    from .models import transformer

    return transformer.build(transformer.TRANSFORMER_BASE, batch)


def _bert_small(batch: int) -> TrainGraph:
    from .models import bert

    return bert.build(bert.BERT_SMALL, batch)


def _bert_large(batch: int) -> TrainGraph:
    from .models import bert

    return bert.build(bert.BERT_LARGE, batch)


def _gnmt_small(batch: int) -> TrainGraph:
    from .models import recurrent

    return recurrent.build(recurrent.GNMT_SMALL, batch)


def _tiny_lstm(batch: int) -> TrainGraph:
    from .models import recurrent

    return recurrent.build(recurrent.TINY_LSTM, batch)


def _wide_deep(batch: int) -> TrainGraph:
    from .models import recommender

    return recommender.build(recommender.WIDE_DEEP, batch)


def _tiny_wide_deep(batch: int) -> TrainGraph:
    from .models import recommender

    return recommender.build(recommender.TINY_WIDE_DEEP, batch)


def _mlp(batch: int) -> TrainGraph:
    from .models import tiny

    return tiny.build_mlp(batch)


def _small_cnn(batch: int) -> TrainGraph:
    from .models import tiny

    return tiny.build_small_cnn(batch)


def _mlp_tf2(batch: int) -> TrainGraph:
    from .models import tiny

    return tiny.build_mlp_tf2(batch)


MODELS: dict[str, ModelSpec] = {
    "vgg19": ModelSpec(
        96,
        "tf1",
        "VGG19, ImageNet 224x224, 1000 classes",
        _vgg19,
        {"ops": 1169, "param_size_mib": 548},
    ),
    "resnet101": ModelSpec(
        96,
        "tf1",
        "ResNet-101 with batch norm, ImageNet 224x224",
        _resnet101,
        {"ops": 7951, "param_size_mib": 169},
        min_image_size=32,
    ),
    "inception_v3": ModelSpec(
        96,
        "tf1",
        "Inception-v3 with batch norm, ImageNet 299x299",
        _inception_v3,
        {"ops": 5312, "param_size_mib": 90},
        min_image_size=75,
    ),
    "transformer": ModelSpec(
        480,
        "tf1",
        "Encoder-decoder Transformer (base, 6+6 layers, d_model 512), 50-token sentences",
        _transformer,
        {"ops": 16859, "param_size_mib": 407},
    ),
    "bert_small": ModelSpec(
        96,
        "tf1",
        "BERT-Small pre-training (L=4, H=512, A=8), sequence length 128",
        _bert_small,
        {"ops": 5061, "param_size_mib": 98},
    ),
    "bert_large": ModelSpec(
        16,
        "tf1",
        "BERT-Large pre-training (L=24, H=1024, A=16), sequence length 128",
        _bert_large,
        {"ops": 26601, "param_size_mib": 2313},
    ),
    "gnmt_small": ModelSpec(
        256,
        "tf1",
        "GNMT-style seq2seq: 2+2 LSTM layers of 512, Luong attention, 16k vocabulary, "
        "20+20 steps unrolled",
        _gnmt_small,
    ),
    "wide_deep": ModelSpec(
        512,
        "tf1",
        "Wide-and-deep recommender: 8 categorical features with tables of 10^5-10^6 rows "
        "(width 32, and wide weights), 13 continuous features, a 1024-512-256 tower, Adam "
        "with sparse table gradients",
        _wide_deep,
    ),
    "mlp": ModelSpec(32, "tf1", "Tiny MLP 784-256-128-10 for tests", _mlp),
    "small_cnn": ModelSpec(
        16, "tf1", "Tiny CNN: 2 conv+pool stages and a dense layer, 32x32x3", _small_cnn
    ),
    "tiny_lstm": ModelSpec(
        8, "tf1", "Tiny LSTM seq2seq with attention for tests: 4+3 steps of 16 units", _tiny_lstm
    ),
    "tiny_wide_deep": ModelSpec(
        8,
        "tf1",
        "Tiny wide-and-deep for tests: 3 categorical features of 30-50 rows, sparse gradients",
        _tiny_wide_deep,
    ),
    "mlp_tf2": ModelSpec(
        32, "tf2", "The tiny MLP as a TF2 concrete function with Keras 3 Adam", _mlp_tf2
    ),
}


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise InvalidInput(
            f"unknown zoo model {name!r}; known models: {', '.join(MODELS)}"
        ) from None


def build(name: str, batch_size: int | None = None, *, image_size: int | None = None) -> TrainGraph:
    """Build model ``name`` (at its zoo batch size unless given) and return its TrainGraph.

    ``image_size`` rebuilds an image classifier whose global pooling makes it
    size-independent (ResNet-101 from 32, Inception-v3 from 75 pixels) on smaller
    images: the same layers and parameters, less computation.
    """
    spec = model_spec(name)
    batch = batch_size or spec.batch_size
    if image_size is None:
        return spec.builder(batch)
    if spec.min_image_size is None:
        raise InvalidInput(f"zoo model {name!r} is not rebuilt at another image size")
    if image_size < spec.min_image_size:
        raise InvalidInput(
            f"zoo model {name!r} needs images of at least {spec.min_image_size} pixels, "
            f"got {image_size}"
        )
    return spec.builder(batch, image_size)


def _manifest_entry(spec: ModelSpec, graph: TrainGraph, data: bytes) -> dict[str, Any]:
    """The manifest record of a freshly built graph."""
    import tensorflow as tf

    param_count = 0
    param_bytes = 0
    for _, dtype, shape in graph.params:
        n = 1
        for d in shape:
            n *= d
        param_count += n
        param_bytes += n * DTYPE_BYTES[dtype]
    entry: dict[str, Any] = {
        "batch_size": spec.batch_size,
        "style": spec.style,
        "description": spec.description,
        "inputs": graph.inputs,
        "loss_node": graph.loss_node,
        "train_node": graph.train_node,
        "init_node": graph.init_node,
        "runnable": graph.runnable,
        "op_count": len(graph.graph_def.node),
        "param_count": param_count,
        "param_bytes": param_bytes,
        "trainable_variables": len(graph.params),
        "graph_sha256": hashlib.sha256(data).hexdigest(),
        "tensorflow_version": tf.__version__,
        "config": graph.config,
    }
    if graph.captured_variables:
        entry["captured_variables"] = graph.captured_variables
    if spec.tag_table3:
        entry["tag_table3"] = spec.tag_table3
    return entry


def _read_manifest(path: pathlib.Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    return {"format": MANIFEST_FORMAT, "models": {}}


def _write_manifest(path: pathlib.Path, manifest: dict[str, Any]) -> None:
    """Write models in registry order so the file diff stays small and stable."""
    models = manifest["models"]
    ordered = {n: models[n] for n in MODELS if n in models}
    ordered.update({n: e for n, e in models.items() if n not in ordered})
    text = json.dumps({"format": MANIFEST_FORMAT, "models": ordered}, indent=2) + "\n"
    path.write_text(text, encoding="utf-8")


def generate(name: str, out_dir: pathlib.Path | None = None) -> ZooModel:
    """Build model ``name``, write ``graphs/<name>.pb.gz`` and update ``manifest.json``.

    ``out_dir`` defaults to the package directory (the committed zoo); a temporary
    directory gets the same layout, which is how tests compare against the zoo.
    """
    spec = model_spec(name)
    out = pathlib.Path(out_dir) if out_dir is not None else ZOO_DIR
    start = time.perf_counter()
    graph = spec.builder(spec.batch_size)
    data = graph.graph_def.SerializeToString(deterministic=True)
    (out / GRAPHS_DIRNAME).mkdir(parents=True, exist_ok=True)
    gz_path = out / GRAPHS_DIRNAME / f"{name}.pb.gz"
    gz_path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    manifest_path = out / "manifest.json"
    manifest = _read_manifest(manifest_path)
    entry = _manifest_entry(spec, graph, data)
    manifest["models"][name] = entry
    _write_manifest(manifest_path, manifest)
    write_readme(manifest, out / "README.md")
    if out.resolve() == ZOO_DIR:
        catalog.clear_cache()
    log.info(
        "%s: %d ops, %.1f MiB params, %.1f KiB gz, %.1f s",
        name,
        entry["op_count"],
        entry["param_bytes"] / MIB,
        gz_path.stat().st_size / 1024,
        time.perf_counter() - start,
    )
    return model_from_entry(name, entry)


def generate_all(out_dir: pathlib.Path | None = None) -> list[ZooModel]:
    """Rebuild every zoo model."""
    return [generate(name, out_dir) for name in MODELS]


README_HEAD = """\
# Model zoo

Single-device **training graphs** (forward + backward + Adam) committed as
gzip-compressed binary GraphDefs in `graphs/`, described by `manifest.json`.
Read them with `tagplan.planner.zoo` (no TensorFlow needed); rebuild them with
`python -m tagplan.planner.zoo.generate [NAME ...]` (needs TensorFlow). This file
is generated from the manifest by the same command. Rebuilding with the same
TensorFlow version reproduces the committed bytes (`graph_sha256`).

## Conventions

- **TF1 style** (all but `mlp_tf2`): resource variables (`VarHandleOp` +
  `ReadVariableOp`; embedding lookups read the handle directly with
  `ResourceGather`), a scalar `loss`, a `train_op` that applies one
  `ResourceApplyAdam` per trainable variable, batch-norm moving averages
  (`AssignSubVariableOp`) as further control inputs of `train_op`, and an `init`
  op that initializes every variable, so the graph runs on its own.
  Embedding gradients are densified (`UnsortedSegmentSum`) before Adam.
- Data inputs are placeholders with fully known shapes; the first dimension is
  the batch. Integer inputs record `high`, the exclusive bound of valid values,
  so random batches can be fed. Forward-pass reshapes use `-1` for the batch
  dimension; gradient code still bakes the full batch into some constants (the
  `Mean` gradient's divisor, `Tile` multiples, `Reshape` shapes).
- Every node with outputs carries `_output_shapes`, all fully static except
  `FusedBatchNormV3`'s `reserve_space_3` (a backend-dependent scratch buffer) and
  the unused `ZerosLike` tf.gradients makes for it.
- **TF2 style** (`mlp_tf2`): a `tf.function` train step. Variables are
  `DT_RESOURCE` placeholders (mapped to variables in `captured_variables`),
  Keras 3 Adam is decomposed into elementwise ops and `Assign*VariableOp`s, the
  loss is the `Identity` named `loss` and the step's last node is `NoOp`. It is
  not runnable on its own (`runnable: false`).
- No dropout anywhere: a step is deterministic, so a distributed version of a
  graph can be checked against the original.

## Sizes compared with TAG Table 3

"params" counts trainable float32 parameters; MiB = bytes / 2^20, the unit of
TAG's "Parameter size" column. "ops" counts every node of the GraphDef.

"""

README_TAIL = """
Why the numbers differ from TAG:

- **Op counts** depend on how a graph is written, not only on the architecture.
  TAG's graphs came from tf-slim and the reference TF1 BERT/Transformer code;
  these come from `tf_keras.applications` and compact hand-written TF1 ops.
  The CNNs with batch norm have about twice TAG's count: resource variables
  cost more nodes than reference variables (`VarIsInitializedOp`, separate
  initializer assignments, one `ReadVariableOp` per use), every batch-norm layer
  holds four variables, and Keras ResNet convolutions carry a bias (slim's do
  not), each with its own Adam slots and update. VGG19, without batch norm, lands
  within 12%. The language models have fewer ops than TAG's because they have
  no dropout, no padding-mask arithmetic and a compact layer norm. The ratio of
  BERT-Small to BERT-Large op counts is 0.19 both here and in TAG, consistent
  with the same four-layer BERT-Small.
- **VGG19, ResNet-101, Inception-v3 and the Transformer** match TAG's parameter
  sizes (the Transformer's vocabulary, 40,000, was chosen to land there; see
  `models/transformer.py`).
- **BERT-Small** is the released BERT-Small configuration (L=4, H=512, A=8,
  30,522-token vocabulary): 29M parameters, 111 MiB, 13% above TAG's 98 MiB,
  which would need a smaller vocabulary or one layer fewer.
- **BERT-Large** is the standard configuration (L=24, H=1024, A=16): 336M
  parameters, 1,283 MiB. TAG's 2,313 MiB (606M float32 parameters) is not
  reachable with that architecture and BERT's vocabulary; TAG's figure
  presumably counts more than the trainable float32 weights.
"""


def _fmt_delta(ours: float, theirs: float) -> str:
    return f"{(ours - theirs) / theirs * 100:+.0f}%"


def render_readme(manifest: dict[str, Any]) -> str:
    """README text: fixed prose around a table generated from ``manifest``."""
    rows = [
        "| model | batch | ops | TAG ops | params | param MiB | TAG MiB | Δ size |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in manifest["models"].items():
        mib = entry["param_bytes"] / MIB
        tag = entry.get("tag_table3")
        tag_ops = f"{tag['ops']:,}" if tag else "–"
        tag_mib = f"{tag['param_size_mib']:,}" if tag else "–"
        delta = _fmt_delta(mib, tag["param_size_mib"]) if tag else "–"
        rows.append(
            f"| `{name}` | {entry['batch_size']} | {entry['op_count']:,} | {tag_ops} "
            f"| {entry['param_count'] / 1e6:,.2f}M | {mib:,.1f} | {tag_mib} | {delta} |"
        )
    return README_HEAD + "\n".join(rows) + "\n" + README_TAIL


def write_readme(manifest: dict[str, Any], path: pathlib.Path) -> None:
    """Write the zoo README for ``manifest`` to ``path``."""
    path.write_text(render_readme(manifest), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Command line: rebuild the named models (default all) into the package."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"models to build (default: all of {list(MODELS)})"
    )
    parser.add_argument("--out-dir", type=pathlib.Path, default=None, help="zoo root to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in args.names or list(MODELS):
        generate(name, args.out_dir)


if __name__ == "__main__":
    main()
