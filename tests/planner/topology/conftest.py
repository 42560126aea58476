"""Shared helpers for the topology tests: respelling a cluster without changing it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tagplan.planner.topology import ClusterSpec


def respell(spec: ClusterSpec, seed: int) -> dict[str, Any]:
    """The same cluster with machines renamed and reordered, GPUs renumbered (list form,
    shuffled), and links reordered with their ends swapped."""
    rng = np.random.default_rng(seed)
    data = spec.model_dump(mode="json", exclude_none=True)
    machines = data["machines"]
    new_names = [f"node-{i:02d}" for i in rng.permutation(len(machines))]
    rename = {m["name"]: new for m, new in zip(machines, new_names, strict=True)}
    for machine in machines:
        machine["name"] = rename[machine["name"]]
        gpus = machine["gpus"]
        types = (
            [gpus["type"]] * gpus["count"]
            if isinstance(gpus, dict)
            else [slot["type"] for slot in sorted(gpus, key=lambda s: s["index"])]
        )
        indices = rng.choice(16, size=len(types), replace=False)
        slots = [{"index": int(i), "type": t} for i, t in zip(indices, types, strict=True)]
        machine["gpus"] = [slots[int(k)] for k in rng.permutation(len(slots))]
    data["machines"] = [machines[int(k)] for k in rng.permutation(len(machines))]
    network = data.get("network")
    if network:
        links = network.get("links", [])
        for link in links:
            ends = [rename[end] for end in link["between"]]
            link["between"] = ends[::-1] if rng.random() < 0.5 else ends
        network["links"] = [links[int(k)] for k in rng.permutation(len(links))]
    return data


@pytest.fixture
def respelled() -> Callable[[ClusterSpec, int], dict[str, Any]]:
    """:func:`respell` as a fixture."""
    return respell
