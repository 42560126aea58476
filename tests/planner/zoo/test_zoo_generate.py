"""The generator reproduces the committed zoo."""

from __future__ import annotations

import json
import pathlib

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.zoo import catalog, get_model
from tagplan.planner.zoo.generate import build, render_readme


def test_readme_is_rendered_from_the_manifest() -> None:
    manifest = json.loads(catalog.MANIFEST_PATH.read_text(encoding="utf-8"))
    readme = (catalog.ZOO_DIR / "README.md").read_text(encoding="utf-8")
    assert readme == render_readme(manifest)


@pytest.mark.tf
@pytest.mark.parametrize("name", ["mlp", "small_cnn", "mlp_tf2"])
def test_regenerating_a_tiny_model_matches_the_manifest(name: str, tmp_path: pathlib.Path) -> None:
    tf = pytest.importorskip("tensorflow")
    from tagplan.planner.zoo.generate import generate

    if name == "mlp_tf2":  # other Keras work in the process first must not rename its slots
        import keras

        keras.optimizers.Adam()
    fresh = generate(name, tmp_path)
    committed = get_model(name)
    assert (tmp_path / "graphs" / f"{name}.pb.gz").is_file()
    assert catalog.load_manifest(tmp_path / "manifest.json")[name] == fresh
    assert fresh.op_count == committed.op_count
    assert fresh.param_count == committed.param_count
    assert fresh.param_bytes == committed.param_bytes
    assert fresh.inputs == committed.inputs
    assert fresh.captured_variables == committed.captured_variables
    if tf.__version__ == committed.tensorflow_version:
        assert fresh.graph_sha256 == committed.graph_sha256


def test_only_globally_pooled_classifiers_are_rebuilt_at_another_image_size() -> None:
    with pytest.raises(InvalidInput, match="not rebuilt at another image size"):
        build("vgg19", batch_size=2, image_size=64)
    with pytest.raises(InvalidInput, match="at least 75 pixels"):
        build("inception_v3", batch_size=2, image_size=64)
