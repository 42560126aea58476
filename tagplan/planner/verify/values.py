"""Where a verification keeps variable values (:mod:`.verify`): in files, one per variable,
read back when they are assigned or compared.

A step of BERT-Large holds 335M parameters and two Adam slots each: the initial and the
updated values of every variable are 4 GiB in float32 and 8 GiB in float64, on top of the
copies the sessions hold, once per mirror. Kept in memory, they decide whether a large
model can be verified at all; kept in a scratch directory, a verification holds only the
session's variables and the batch of values being moved in or out of it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["ValueStore"]


class ValueStore:
    """Named arrays in ``.npy`` files under ``directory``; ``get`` reads one back."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory
        self._files: dict[str, Path] = {}
        self._nbytes: dict[str, int] = {}

    def put(self, name: str, value: np.ndarray) -> None:
        path = self._files.get(name) or self._directory / f"{len(self._files)}.npy"
        np.save(path, np.asarray(value), allow_pickle=False)
        self._files[name] = path
        self._nbytes[name] = int(np.asarray(value).nbytes)

    def get(self, name: str) -> np.ndarray:
        return np.load(self._files[name], allow_pickle=False)

    def nbytes(self, name: str) -> int:
        return self._nbytes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def remove(self) -> None:
        """Delete the files; the store is empty afterwards."""
        shutil.rmtree(self._directory, ignore_errors=True)
        self._files.clear()
        self._nbytes.clear()
