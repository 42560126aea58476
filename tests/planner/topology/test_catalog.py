"""The built-in GPU catalog and gpu_types additions/overrides."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tagplan.planner.topology import GpuTypeSpec, builtin_catalog, gpu_type_table
from tagplan.planner.topology.catalog import known_type_names, lookup_gpu_type

REQUIRED = [
    "P100",
    "V100-16GB",
    "V100-32GB",
    "GTX-1080Ti",
    "T4",
    "A100-40GB",
    "A100-80GB",
    "A10",
    "L4",
    "H100",
    "H200",
    "RTX-3090",
    "A40",
    "L40S",
]


class TestBuiltinCatalog:
    def test_has_required_types(self) -> None:
        assert set(REQUIRED) <= set(builtin_catalog())

    @pytest.mark.parametrize("name", REQUIRED)
    def test_entries_are_complete_and_cited(self, name: str) -> None:
        spec = builtin_catalog()[name]
        assert spec.source and len(spec.source) > 10
        assert spec.fp32_tflops > 0 and spec.memory_bandwidth_gb_per_s > 0
        assert spec.memory_gib > 0 and spec.fp16_tflops is not None

    def test_datasheet_figures(self) -> None:
        cat = builtin_catalog()
        assert (cat["V100-32GB"].fp32_tflops, cat["V100-32GB"].fp16_tflops) == (15.7, 125)
        assert cat["V100-16GB"].memory_gib == 16 and cat["V100-32GB"].memory_gib == 32
        assert cat["P100"].memory_bandwidth_gb_per_s == 732
        assert cat["A100-80GB"].memory_bandwidth_gb_per_s == 2039
        assert cat["H100"].fp16_tflops == 989.5  # dense, not the 2x sparse figure
        assert cat["H200"].memory_gib == 141
        assert cat["T4"].fp16_tflops == 65

    def test_is_read_only(self) -> None:
        with pytest.raises(TypeError):
            builtin_catalog()["X"] = builtin_catalog()["T4"]  # type: ignore[index]


class TestTypeTable:
    def test_addition(self) -> None:
        extra = GpuTypeSpec(name="X1", fp32_tflops=1, memory_bandwidth_gb_per_s=100, memory_gib=8)
        table = gpu_type_table([extra])
        assert table["X1"] is extra and "T4" in table

    def test_override_keeps_builtin_spelling(self) -> None:
        extra = GpuTypeSpec(
            name="v100-32gb", fp32_tflops=14, memory_bandwidth_gb_per_s=900, memory_gib=32
        )
        table = gpu_type_table([extra])
        assert table["V100-32GB"].fp32_tflops == 14
        assert "v100-32gb" not in table
        assert builtin_catalog()["V100-32GB"].fp32_tflops == 15.7  # untouched

    def test_lookup_ignores_case(self) -> None:
        table = gpu_type_table()
        assert lookup_gpu_type("gtx-1080ti", table) is table["GTX-1080Ti"]
        assert lookup_gpu_type("nope", table) is None
        assert known_type_names(table)[0] == "A10"

    @pytest.mark.parametrize("field", ["fp32_tflops", "memory_bandwidth_gb_per_s", "memory_gib"])
    def test_rejects_non_positive_figures(self, field: str) -> None:
        figures = {"fp32_tflops": 1.0, "memory_bandwidth_gb_per_s": 1.0, "memory_gib": 1.0}
        with pytest.raises(ValidationError, match=field):
            GpuTypeSpec(name="X", **{**figures, field: 0})

    def test_rejects_bad_name(self) -> None:
        with pytest.raises(ValidationError, match="must start with a letter"):
            GpuTypeSpec(name="A 100", fp32_tflops=1, memory_bandwidth_gb_per_s=1, memory_gib=1)
