"""Baechi's memory-constrained model-parallel placers (papers/baechi.md §2), as baselines.

Both place *co-placement units* (Baechi §3.2: ops TensorFlow colocates — a variable with
its reads and updates — move together; here also a parameter with its optimizer slots and
update region) and both are heterogeneity-aware in compute time:

* **m-TOPO** (§2.2): units in topological order fill the GPUs one after another; each
  GPU takes up to its share of the total memory — Baechi's cap Σ m / n + max m, with the
  share made proportional to the GPU's speed — and never more than it holds;
* **m-ETF** (§2.3): list scheduling; the next ready op goes to the GPU where it finishes
  earliest — its inputs transferred (latency + bytes / bandwidth of the path), the GPU
  free, then its own compute time on that GPU (earliest start is ETF's rule; finishing
  time is its form for GPUs of different speed) — among the GPUs with memory left for
  its unit.

Memory per unit is what Baechi charges: the variables it holds plus the outputs of its
ops. The result is a ``model-parallel`` strategy with every op placed.
"""

from __future__ import annotations

import heapq

import numpy as np

from tagplan.planner.cost.memory import FRAMEWORK_RESERVE_BYTES, op_memory
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.grouping import atoms_of
from tagplan.planner.strategy import GroupDecision, Option, Strategy
from tagplan.planner.topology import Cluster

__all__ = ["m_etf", "m_topo"]


def _device_times(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> np.ndarray:
    """Seconds of every op on every device (devices x ops), at the full batch."""
    by_type = {
        str(name): costs.op_times(str(name), ir.batch_size).seconds
        for name in set(cluster.type_names[t] for t in cluster.device_type)
    }
    return np.stack([by_type[str(cluster.type_names[t])] for t in cluster.device_type])


def _unit_memory(ir: GraphIR, units: np.ndarray) -> np.ndarray:
    memory = op_memory(ir)
    per_op = memory.output_bytes + memory.persistent_bytes
    return np.bincount(units, weights=per_op, minlength=int(units.max()) + 1)


def _capacity(cluster: Cluster) -> np.ndarray:
    return np.maximum(cluster.device_memory_bytes - FRAMEWORK_RESERVE_BYTES, 0).astype(float)


def _strategy(ir: GraphIR, cluster: Cluster, device_of_op: np.ndarray, name: str) -> Strategy:
    placement = {ir.op_names[op]: str(cluster.device_names[d]) for op, d in enumerate(device_of_op)}
    decision = GroupDecision(
        device_groups=list(range(cluster.num_groups)),
        option=Option.MODEL_PARALLEL,
        placement=placement,
    )
    return Strategy(name=name, default=decision)


def m_topo(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """Baechi §2.2's m-TOPO with speed-proportional memory shares."""
    units = atoms_of(ir)
    memory = _unit_memory(ir, units)
    times = _device_times(ir, cluster, costs)
    speed = 1.0 / np.maximum(times.sum(axis=1), 1e-30)
    share = speed / speed.sum()
    capacity = _capacity(cluster)
    caps = np.minimum(memory.sum() * share + memory.max(), capacity)
    used = np.zeros(cluster.num_devices)
    device_of_unit = np.full(len(memory), -1, dtype=np.int64)
    current = 0
    first_op = np.full(len(memory), ir.num_ops, dtype=np.int64)
    np.minimum.at(first_op, units, np.arange(ir.num_ops))
    for unit in np.argsort(first_op, kind="stable").tolist():
        while current < cluster.num_devices - 1 and used[current] + memory[unit] > caps[current]:
            current += 1
        device_of_unit[unit] = current
        used[current] += memory[unit]
    return _strategy(ir, cluster, device_of_unit[units], "m-topo")


def m_etf(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """Baechi §2.3's m-ETF over ops, with units kept together."""
    latency, bandwidth = cluster.latency_s, cluster.bandwidth_bytes_per_s
    units = atoms_of(ir)
    memory = _unit_memory(ir, units)
    times = _device_times(ir, cluster, costs)
    step_time = times.sum(axis=1)
    capacity = _capacity(cluster)
    devices = np.arange(cluster.num_devices)
    used = np.zeros(cluster.num_devices)
    free_at = np.zeros(cluster.num_devices)
    finish = np.zeros(ir.num_ops)
    device_of_op = np.full(ir.num_ops, -1, dtype=np.int64)
    device_of_unit = np.full(len(memory), -1, dtype=np.int64)
    waiting = np.diff(ir.op_input_ptr).astype(np.int64) + np.diff(ir.control_ptr)
    consumers_of_op: list[list[int]] = [[] for _ in range(ir.num_ops)]
    for op in range(ir.num_ops):
        for tensor in ir.inputs(op).tolist():
            consumers_of_op[int(ir.tensor_producer[tensor])].append(op)
        for pred in ir.control_preds(op).tolist():
            consumers_of_op[pred].append(op)
    ready = [(0.0, op) for op in np.flatnonzero(waiting == 0).tolist()]
    heapq.heapify(ready)
    while ready:
        _, op = heapq.heappop(ready)
        unit = int(units[op])
        if device_of_unit[unit] >= 0:
            candidates = devices[[device_of_unit[unit]]]
        else:
            fits = devices[used + memory[unit] <= capacity]
            candidates = fits if len(fits) else devices[[int(np.argmax(capacity - used))]]
        arrival = np.zeros(len(candidates))
        for tensor in ir.inputs(op).tolist():
            producer = int(ir.tensor_producer[tensor])
            source = int(device_of_op[producer])
            cost = (
                latency[source, candidates]
                + ir.tensor_bytes[tensor] / bandwidth[source, candidates]
            )
            arrival = np.maximum(arrival, finish[producer] + cost)
        for pred in ir.control_preds(op).tolist():
            arrival = np.maximum(arrival, finish[pred])
        start = np.maximum(arrival, free_at[candidates])
        end = start + times[candidates, op]
        # ties (ops that take no time) go to the faster GPU
        choice = int(np.lexsort((step_time[candidates], end))[0])
        device = int(candidates[choice])
        if device_of_unit[unit] < 0:
            device_of_unit[unit] = device
            used[device] += memory[unit]
        device_of_op[op] = device
        finish[op] = end[choice]
        free_at[device] = end[choice]
        for consumer in consumers_of_op[op]:
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                heapq.heappush(ready, (float(finish[op]), consumer))
    return _strategy(ir, cluster, device_of_op, "m-etf")
