"""The cluster input schema (docs/design.md §2): the GPUs a scheduler allocated.

Every field names its unit (``_gbps``, ``_us``, ``_tflops``, ``_gib``, ``_gb_per_s``);
:class:`~tagplan.planner.topology.cluster.Cluster` converts them once to bytes and
seconds. Unknown fields are refused so a misspelt unit (``bandwidth_gbs``) is an error,
not a silently ignored value.

A machine's GPUs are given either as ``{type, count}`` (indices ``0..count-1``) or as a
list ``[{index, type}, ...]`` for a fragmented allocation (e.g. GPUs 2 and 5 of a box,
or a box with mixed types). Machines hang off one switch: two machines talk at
``network.bandwidth_gbps`` unless a ``network.links`` entry overrides that pair.

Defaults:

- ``intra_latency_us`` = 2 us (:data:`DEFAULT_INTRA_LATENCY_US`): the start-up cost of a
  CUDA peer-to-peer copy, about the same over NVLink and PCIe;
- ``network.latency_us`` = 10 us (:data:`DEFAULT_NETWORK_LATENCY_US`): one switch hop in
  a datacenter, between RDMA (a few us) and kernel TCP (tens of us).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from .catalog import GpuTypeSpec, gpu_type_table, known_type_names, lookup_gpu_type

__all__ = [
    "DEFAULT_INTRA_LATENCY_US",
    "DEFAULT_NETWORK_LATENCY_US",
    "MAX_BANDWIDTH_GBPS",
    "MAX_GPUS_PER_MACHINE",
    "MAX_LATENCY_US",
    "ClusterSpec",
    "GpuCount",
    "GpuSlot",
    "GpuTypeSpec",
    "LinkSpec",
    "MachineSpec",
    "NetworkSpec",
]

DEFAULT_INTRA_LATENCY_US: float = 2.0
"""Latency between two GPUs of one machine when the spec gives none, in microseconds."""
DEFAULT_NETWORK_LATENCY_US: float = 10.0
"""Latency between two machines when the spec gives none, in microseconds."""

_MACHINE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

MAX_GPUS_PER_MACHINE = 4096
"""Above any machine built (an NVL576 rack domain has 576); GPU indices stay below it."""
MAX_BANDWIDTH_GBPS = 1e6
"""1 Pb/s, far above any link; keeps bytes-per-second figures finite in float64."""
MAX_LATENCY_US = 1e7
"""10 s."""

Bandwidth = Annotated[float, Field(gt=0, le=MAX_BANDWIDTH_GBPS, allow_inf_nan=False)]
Latency = Annotated[float, Field(ge=0, le=MAX_LATENCY_US, allow_inf_nan=False)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuCount(_Spec):
    """``count`` GPUs of one ``type``, numbered ``0..count-1``."""

    type: str
    count: Annotated[int, Field(strict=True, le=MAX_GPUS_PER_MACHINE)]


class GpuSlot(_Spec):
    """One GPU by its index on the machine (as the driver numbers it)."""

    index: Annotated[int, Field(strict=True, ge=0, lt=MAX_GPUS_PER_MACHINE)]
    type: str


def _gpus_form(value: Any) -> str | None:
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, dict | GpuCount):
        return "count"
    return None


GpusSpec = Annotated[
    Annotated[GpuCount, Tag("count")] | Annotated[list[GpuSlot], Tag("list")],
    Discriminator(
        _gpus_form,
        custom_error_type="gpus_form",
        custom_error_message="gpus must be {type, count} or a list of {index, type}",
    ),
]


class MachineSpec(_Spec):
    """One machine: its GPUs and the bandwidth/latency between any two of them."""

    name: str
    gpus: GpusSpec
    intra_bandwidth_gbps: Bandwidth
    intra_latency_us: Latency = DEFAULT_INTRA_LATENCY_US

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        value = value.strip()
        if not _MACHINE_NAME_RE.match(value):
            raise ValueError(
                f"machine name {value!r} must start with a letter or digit and contain only "
                "letters, digits and . _ -"
            )
        return value

    @model_validator(mode="after")
    def _check_gpus(self) -> MachineSpec:
        if isinstance(self.gpus, GpuCount):
            if self.gpus.count < 1:
                raise ValueError(
                    f"machine {self.name!r} has no GPUs (count is {self.gpus.count}); "
                    "a machine needs at least one GPU"
                )
            return self
        if not self.gpus:
            raise ValueError(f"machine {self.name!r} has no GPUs (the gpus list is empty)")
        seen: set[int] = set()
        for slot in self.gpus:
            if slot.index in seen:
                raise ValueError(f"machine {self.name!r} lists GPU index {slot.index} twice")
            seen.add(slot.index)
        return self

    def gpu_slots(self) -> list[tuple[int, str]]:
        """``(index, type)`` of every GPU, by increasing index."""
        if isinstance(self.gpus, GpuCount):
            return [(i, self.gpus.type) for i in range(self.gpus.count)]
        return sorted((slot.index, slot.type) for slot in self.gpus)


class LinkSpec(_Spec):
    """An override of the network figures between two machines."""

    between: tuple[str, str]
    bandwidth_gbps: Bandwidth
    latency_us: Latency | None = None

    @model_validator(mode="after")
    def _check_ends(self) -> LinkSpec:
        if self.between[0] == self.between[1]:
            raise ValueError(
                f"a link joins two different machines, got between: [{self.between[0]}, "
                f"{self.between[1]}] (use intra_bandwidth_gbps inside a machine)"
            )
        return self


class NetworkSpec(_Spec):
    """The network between machines: a default for every pair, plus per-pair overrides."""

    bandwidth_gbps: Bandwidth
    latency_us: Latency = DEFAULT_NETWORK_LATENCY_US
    links: list[LinkSpec] = Field(default_factory=list)


class ClusterSpec(_Spec):
    """A GPU allocation as a scheduler sends it (docs/design.md §2).

    Validation checks what a model can: unique machine names, links between known
    machines, GPU types known to the catalog (or defined under ``gpu_types``), a
    network whenever there are two machines or more. GPU type names are rewritten to
    their catalog spelling.
    """

    gpu_types: list[GpuTypeSpec] = Field(default_factory=list)
    machines: list[MachineSpec] = Field(default_factory=list)
    network: NetworkSpec | None = None

    @model_validator(mode="after")
    def _check_cluster(self) -> ClusterSpec:
        if not self.machines:
            raise ValueError("the cluster has no machines; list at least one under 'machines'")
        self._check_machine_names()
        self._check_network()
        self._normalize_gpu_types()
        return self

    def _check_machine_names(self) -> None:
        seen: set[str] = set()
        for machine in self.machines:
            if machine.name in seen:
                raise ValueError(
                    f"duplicate machine name {machine.name!r}; machine names must be unique"
                )
            seen.add(machine.name)

    def _check_network(self) -> None:
        if self.network is None:
            if len(self.machines) > 1:
                raise ValueError(
                    "network.bandwidth_gbps is required when the cluster has more than one machine"
                )
            return
        names = [m.name for m in self.machines]
        pairs: set[frozenset[str]] = set()
        for i, link in enumerate(self.network.links):
            for end in link.between:
                if end not in names:
                    raise ValueError(
                        f"network.links[{i}] names unknown machine {end!r}; "
                        f"the machines are: {', '.join(names)}"
                    )
            pair = frozenset(link.between)
            if pair in pairs:
                raise ValueError(
                    f"network.links[{i}] repeats the pair {link.between[0]!r}-"
                    f"{link.between[1]!r}; give each pair of machines at most one link"
                )
            pairs.add(pair)

    def _normalize_gpu_types(self) -> None:
        folded = [t.name.casefold() for t in self.gpu_types]
        for i, name in enumerate(folded):
            if name in folded[:i]:
                raise ValueError(f"gpu_types defines {self.gpu_types[i].name!r} twice")
        table = gpu_type_table(self.gpu_types)
        for machine in self.machines:
            slots = [machine.gpus] if isinstance(machine.gpus, GpuCount) else machine.gpus
            for slot in slots:
                spec = lookup_gpu_type(slot.type, table)
                if spec is None:
                    raise ValueError(
                        f"machine {machine.name!r}: unknown GPU type {slot.type!r}; known "
                        f"types: {', '.join(known_type_names(table))} (define others under "
                        "gpu_types)"
                    )
                slot.type = spec.name
        # Entries that replace a built-in type take the built-in spelling.
        self.gpu_types = [lookup_gpu_type(t.name, table) or t for t in self.gpu_types]

    def type_table(self) -> dict[str, GpuTypeSpec]:
        """Every GPU type this spec can name: the catalog plus ``gpu_types``."""
        return gpu_type_table(self.gpu_types)
