"""The candidates of the pipelined part of the search tree as the prior network reads them.

Above the stage layouts the tree's root chooses between TAG's per-group decisions and
each layout; below a layout it chooses the micro-batch count, then each stage's gradient
synchronization (:mod:`tagplan.planner.search.layout_branches`). Each candidate of such
a level is one row of :data:`LAYOUT_FEATURES`, with the device groups it runs on and the
op groups it concerns (weights over op groups: a stage's share of each group's compute,
or every group's share of the model's), which the network pools from its embeddings
of the search's static graph (:mod:`.model`'s layout head).

The features are ratios or clipped logs of ratios, as in :mod:`.features`:

* the level's kind (TAG's decisions, a layout, a micro-batch count, a stage's
  synchronization) and, for the last, whether it is a parameter server;
* the candidate's **compute bound** (its busiest GPU's compute, the bound the search
  prunes pipelines by) against the reference step; for TAG's decisions, the allocation's
  whole-model time at perfect data parallelism (``GPUs / Σ speed``);
* the pipeline's shape: stages against the allocation's units, its share of the GPUs,
  the fill-drain **bubble** ``(p - 1) / (m + p - 1)`` (GPipe §2.3) and ``log(m / p)``;
* the links it crosses: the slowest link between two consecutive stages against the
  fastest link, and the longest transfer between two stages (the bytes of every
  activation and gradient crossing, over their slowest link) against the bound;
* memory and synchronization: ``4 x`` the parameter bytes against the smallest GPU
  that holds them (weights, gradient, two optimizer slots) and twice them over the
  slowest link inside their stage against the bound, the worst stage (for TAG's
  decisions: the whole model on the allocation; for a stage's synchronization: that
  stage).

:data:`LAYOUT_SCHEMA_VERSION` changes with any feature's meaning or position; a
checkpoint with a layout head records it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.gnn.features import clipped_log
from tagplan.planner.search.grouping import op_edges
from tagplan.planner.search.layout_branches import SYNC_CHOICES, LayoutBranches
from tagplan.planner.search.pipeline_stages import StageLayout, stage_units
from tagplan.planner.search.prior import SearchContext
from tagplan.planner.strategy import Option

__all__ = [
    "LAYOUT_FEATURES",
    "LAYOUT_SCHEMA_VERSION",
    "LayoutCandidates",
    "LayoutStatics",
]

LAYOUT_SCHEMA_VERSION = 1
LAYOUT_FEATURES = (
    "kind_tag",
    "kind_layout",
    "kind_micro_batches",
    "kind_sync",
    "parameter_server",
    "log_bound_vs_reference",
    "stage_share",  # stages / the allocation's units
    "gpu_share",
    "bubble",  # (p - 1) / (m + p - 1)
    "log_micro_batches_vs_stages",
    "log_boundary_bandwidth",  # slowest link between consecutive stages / fastest link
    "log_boundary_transfer_vs_bound",
    "log_params_vs_memory",  # 4 x parameter bytes / smallest GPU holding them
    "log_sync_vs_bound",  # 2 x parameter bytes over the slowest link inside / bound
)
_PS = LAYOUT_FEATURES.index("parameter_server")
_TINY = 1e-12


@dataclass(frozen=True, eq=False)
class LayoutCandidates:
    """One level's candidates: features (``(C, len(LAYOUT_FEATURES))`` float32), the
    device groups each runs on, and its weights over the op groups (``(C, G)``, rows
    summing to 1)."""

    x: np.ndarray
    device_groups: tuple[tuple[int, ...], ...]
    focus: np.ndarray


@dataclass(frozen=True, eq=False)
class _Stages:
    """What one layout's features read: per stage its device groups, op-group compute
    (``(S, G)``), parameter bytes, smallest GPU memory, slowest inner link; the longest
    transfer between two stages (seconds) and the slowest link between consecutive
    ones."""

    device_groups: tuple[tuple[int, ...], ...]
    group_time: np.ndarray
    param_bytes: np.ndarray
    memory_bytes: np.ndarray
    inner_bandwidth: np.ndarray
    transfer_s: float
    boundary_bandwidth: float
    gpus: int


class LayoutStatics:
    """What the layout levels of one search read that does not change between its
    vertices: per-op compute and parameters, the op edges, each layout's stages (built
    on first use)."""

    def __init__(self, context: SearchContext, branches: LayoutBranches) -> None:
        self.context, self.branches = context, branches
        ir, cluster = branches.ir, branches.cluster
        space, grouping = context.space, context.grouping
        self.op_time_s = np.mean(list(space.type_op_time_s.values()), axis=0)
        self.op_param_bytes = np.bincount(
            ir.parameters.variable_op, weights=ir.parameters.bytes, minlength=ir.num_ops
        )
        src, dst, nbytes = op_edges(ir)
        self.edges = (src, dst, nbytes.astype(np.float64))
        self.op_group = grouping.op_group
        self.num_groups = grouping.num_groups
        bandwidth = cluster.group_bandwidth_bytes_per_s
        self.fastest = float(bandwidth[np.isfinite(bandwidth)].max())
        self.units = len(stage_units(cluster))
        speed = branches.device_speed
        ideal_s = cluster.num_devices / max(float(speed.sum()), _TINY)
        group_time = np.bincount(self.op_group, self.op_time_s, minlength=self.num_groups)
        self.whole_focus = group_time / max(float(group_time.sum()), _TINY)
        params = float(self.op_param_bytes.sum())
        self.tag_row = _row(
            "tag",
            log_bound_vs_reference=clipped_log(ideal_s / context.reference_step_s),
            gpu_share=1.0,
            log_params_vs_memory=clipped_log(4 * params / float(cluster.device_memory_bytes.min())),
            log_sync_vs_bound=clipped_log(2 * params / float(bandwidth.min()) / ideal_s),
        )
        self._stages: dict[int, _Stages] = {}

    def stages(self, layout: int) -> _Stages:
        found = self._stages.get(layout)
        if found is None:
            found = self._stages[layout] = self._stages_of(self.branches.layouts[layout])
        return found

    def _stages_of(self, layout: StageLayout) -> _Stages:
        cluster = self.branches.cluster
        bandwidth = cluster.group_bandwidth_bytes_per_s
        count = layout.num_stages
        op_stage = layout.op_stage
        groups = tuple(
            tuple(sorted({int(g) for g in cluster.group_of_device[gpus].tolist()}))
            for gpus in layout.stage_gpus
        )
        group_time = np.bincount(
            op_stage * self.num_groups + self.op_group,
            self.op_time_s,
            minlength=count * self.num_groups,
        ).reshape(count, self.num_groups)
        between = np.array(
            [[bandwidth[np.ix_(a, b)].min() for b in groups] for a in groups]
        )  # the slowest link between two stages' device groups; inside one on the diagonal
        src, dst, nbytes = self.edges
        a, b = op_stage[src], op_stage[dst]
        cut = a != b
        crossing = np.zeros((count, count))
        np.add.at(crossing, (np.minimum(a, b)[cut], np.maximum(a, b)[cut]), nbytes[cut])
        transfer_s = float((crossing / between).max()) if cut.any() else 0.0
        return _Stages(
            device_groups=groups,
            group_time=group_time,
            param_bytes=np.bincount(op_stage, self.op_param_bytes, minlength=count),
            memory_bytes=np.array(
                [float(cluster.device_memory_bytes[gpus].min()) for gpus in layout.stage_gpus]
            ),
            inner_bandwidth=np.diag(between).copy(),
            transfer_s=transfer_s,
            boundary_bandwidth=float(
                min(between[s, s + 1] for s in range(count - 1)) if count > 1 else self.fastest
            ),
            gpus=sum(len(gpus) for gpus in layout.stage_gpus),
        )

    def _row(self, layout: int, choice: int, kind: str, stage: int | None = None) -> np.ndarray:
        """A candidate of ``layout`` at its ``choice``-th micro-batch count; ``stage``: the
        one whose synchronization it decides."""
        branches, found = self.branches, self.stages(layout)
        stages = found.param_bytes.shape[0]
        micro_batches = branches.layouts[layout].micro_batches[choice]
        bound_s = max(branches.bound_s[layout][choice], _TINY)
        which = slice(None) if stage is None else slice(stage, stage + 1)
        return _row(
            kind,
            log_bound_vs_reference=clipped_log(bound_s / self.context.reference_step_s),
            stage_share=stages / self.units,
            gpu_share=found.gpus / branches.cluster.num_devices,
            bubble=(stages - 1) / (micro_batches + stages - 1),
            log_micro_batches_vs_stages=clipped_log(micro_batches / stages),
            log_boundary_bandwidth=clipped_log(found.boundary_bandwidth / self.fastest),
            log_boundary_transfer_vs_bound=clipped_log(found.transfer_s / bound_s),
            log_params_vs_memory=clipped_log(
                (4 * found.param_bytes[which] / found.memory_bytes[which]).max()
            ),
            log_sync_vs_bound=clipped_log(
                (2 * found.param_bytes[which] / found.inner_bandwidth[which]).max() / bound_s
            ),
        )

    def _focus(self, layout: int, stage: int | None) -> np.ndarray:
        if stage is None:
            return self.whole_focus
        time = self.stages(layout).group_time[stage]
        total = float(time.sum())
        return time / total if total > 0 else self.whole_focus

    def candidates(self, path: tuple[int, ...]) -> LayoutCandidates:
        """The candidates of the level ``path`` reaches (a
        :class:`~tagplan.planner.search.prior.LayoutQuery`'s path)."""
        branches = self.branches
        every_group = tuple(range(branches.cluster.num_groups))
        rows: list[np.ndarray] = []
        device_groups: list[tuple[int, ...]] = []
        focus: list[np.ndarray] = []
        if not path:
            rows.append(self.tag_row)
            device_groups.append(every_group)
            focus.append(self.whole_focus)
            for layout in range(len(branches)):
                rows.append(self._row(layout, 0, "layout"))
                device_groups.append(_union(self.stages(layout).device_groups))
                focus.append(self.whole_focus)
        elif len(path) == 1:
            layout = path[0] - 1
            used = _union(self.stages(layout).device_groups)
            for choice in range(len(branches.layouts[layout].micro_batches)):
                rows.append(self._row(layout, choice, "micro_batches"))
                device_groups.append(used)
                focus.append(self.whole_focus)
        else:
            layout, choice, stage = path[0] - 1, path[1], len(path) - 2
            for option in SYNC_CHOICES:
                row = self._row(layout, choice, "sync", stage)
                row[_PS] = float(option == Option.REPLICATE_PS)
                rows.append(row)
                device_groups.append(self.stages(layout).device_groups[stage])
                focus.append(self._focus(layout, stage))
        return LayoutCandidates(
            x=np.stack(rows).astype(np.float32),
            device_groups=tuple(device_groups),
            focus=np.stack(focus).astype(np.float32),
        )


def _row(kind: str, **values: float) -> np.ndarray:
    """A candidate's features: the one-hot of its ``kind``, ``values`` by name, 0 else."""
    values[f"kind_{kind}"] = 1.0
    return np.array([float(values.pop(name, 0.0)) for name in LAYOUT_FEATURES])


def _union(sets: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return tuple(sorted({g for s in sets for g in s}))
