"""Unit conversions between the external cluster schema and the internal model.

The schema names its unit in every field (``bandwidth_gbps``, ``latency_us``,
``memory_gib``, ``fp32_tflops``, ``memory_bandwidth_gb_per_s``); the engine works in
bytes, seconds and FLOP/s. Conversions happen once, when a :class:`Cluster` is built
(docs/design.md §2), with the constants below. Network rates are decimal bits
(1 Gbps = 1e9 bit/s = 1.25e8 bytes/s); memory sizes are binary (1 GiB = 2**30 bytes);
memory bandwidth is decimal bytes (1 GB/s = 1e9 bytes/s), as vendor datasheets quote it.
"""

from __future__ import annotations

__all__ = [
    "BYTES_PER_GB",
    "BYTES_PER_GBPS",
    "BYTES_PER_GIB",
    "FLOPS_PER_TFLOPS",
    "US_PER_SECOND",
    "gbps_to_bytes_per_s",
    "gib_to_bytes",
    "us_to_s",
]

BYTES_PER_GBPS: float = 1e9 / 8
"""Bytes per second in one gigabit per second."""
BYTES_PER_GIB: int = 2**30
"""Bytes in one gibibyte."""
BYTES_PER_GB: float = 1e9
"""Bytes in one (decimal) gigabyte, the unit of datasheet memory bandwidth."""
FLOPS_PER_TFLOPS: float = 1e12
"""FLOP/s in one TFLOP/s."""
US_PER_SECOND: float = 1e6
"""Microseconds in one second (divide by it: ``10 / 1e6`` is exactly ``1e-05``)."""


def gbps_to_bytes_per_s(gbps: float) -> float:
    """Convert a link rate in Gbit/s to bytes/s (100 Gbps -> 12.5e9 bytes/s)."""
    return float(gbps) * BYTES_PER_GBPS


def gib_to_bytes(gib: float) -> int:
    """Convert GiB to whole bytes (16 GiB -> 17_179_869_184)."""
    return round(float(gib) * BYTES_PER_GIB)


def us_to_s(us: float) -> float:
    """Convert microseconds to seconds."""
    return float(us) / US_PER_SECOND
