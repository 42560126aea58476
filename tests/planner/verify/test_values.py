"""The verification's value store: what goes in comes back, bit for bit, and nothing is
left on disk."""

from __future__ import annotations

import numpy as np

from tagplan.planner.verify.values import ValueStore


def test_values_come_back_with_their_dtype_shape_and_bits(tmp_path) -> None:
    store = ValueStore(tmp_path / "values")
    values = {
        "dense/kernel": np.random.default_rng(0).standard_normal((3, 5)),
        "dense/kernel/Adam": np.zeros((3, 5), np.float32),
        "beta1_power": np.float32(0.9),
        "global_step": np.int64(7),
        "mask": np.array([True, False]),
    }
    for name, value in values.items():
        store.put(name, value)
    assert list(store) == list(values) and len(store) == 5 and "mask" in store
    for name, value in values.items():
        back = store.get(name)
        assert back.dtype == np.asarray(value).dtype and back.shape == np.shape(value)
        assert back.tobytes() == np.asarray(value).tobytes()
        assert store.nbytes(name) == np.asarray(value).nbytes
    store.put("global_step", np.int64(8))  # a name written again replaces its value
    assert store.get("global_step") == 8 and len(store) == 5


def test_removing_a_store_deletes_its_files(tmp_path) -> None:
    store = ValueStore(tmp_path / "values")
    store.put("x", np.ones(1000))
    assert any((tmp_path / "values").iterdir())
    store.remove()
    assert not (tmp_path / "values").exists() and len(store) == 0 and "x" not in store
