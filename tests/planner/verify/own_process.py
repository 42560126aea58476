"""Verification in a process of its own: TensorFlow keeps the memory of a large model's
step (every variable once per mirror, its gradients, the collectives' buffers) for the
life of its process; run in a child, it goes back to the machine when the child ends, and
the suite's process stays small however many large models it verifies."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from tagplan.planner.verify.check import VerifyReport, verify_many


def verify_many_apart(*args: Any, **kwargs: Any) -> list[VerifyReport]:
    """:func:`~tagplan.planner.verify.check.verify_many` run in a fresh child process."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(verify_many, *args, **kwargs).result()
