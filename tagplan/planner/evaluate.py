"""Score one strategy: resolve, compile to tasks, simulate (TAG §4.3's virtual runtime)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, replace

import numpy as np

from tagplan.planner.compile.pipeline import phase_barriers
from tagplan.planner.compile.placement import Placement, place
from tagplan.planner.compile.symmetry import Symmetry
from tagplan.planner.compile.task_compiler import CompiledTasks, TaskCompiler
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.cost.memory import FRAMEWORK_RESERVE_BYTES
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.cost.work import GraphWork, graph_work
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.sim.simulate import SimResult, simulate, upward_rank
from tagplan.planner.step_bound import StepBound, StepBoundParts
from tagplan.planner.strategy import ResolvedStrategy, Strategy, resolve
from tagplan.planner.topology import Cluster
from tagplan.planner.topology.twins import TwinMachines

__all__ = ["Evaluation", "Evaluator", "relabeled", "resolve_planned", "warm_up"]


def resolve_planned(
    strategy: Strategy, ir: GraphIR, cluster: Cluster, *, work: GraphWork | None = None
) -> ResolvedStrategy:
    """:func:`~tagplan.planner.strategy.resolve` as the planner evaluates a strategy: the
    default model-parallel split balanced by the ops' FLOPs (``work``, or
    :func:`~tagplan.planner.cost.work.graph_work` of ``ir``). Whatever places or compiles a
    planned strategy (a GraphDef after the answer, ``tagplan compile``, ``tagplan
    verify``) resolves it so; resolved with every op weighing the same, a model-parallel
    group would be split elsewhere than where it was evaluated."""
    flops = (graph_work(ir) if work is None else work).flops
    return resolve(strategy, ir, cluster, op_work=flops)


@dataclass(frozen=True, eq=False)
class Evaluation:
    strategy: Strategy
    resolved: ResolvedStrategy
    compiled: CompiledTasks
    result: SimResult

    @property
    def step_time_s(self) -> float:
        return self.result.step_time_s


class Evaluator:
    """Everything fixed for one (graph, cluster) pair: cost and communication models, and
    the task compiler that keeps what strategies share (see :class:`TaskCompiler`).

    ``by_class`` (the default) compiles and simulates each symmetry class of GPUs once
    (:mod:`~tagplan.planner.compile.symmetry`): the same step, per-GPU memory and OOM as
    per GPU, at a cost that grows with the classes rather than the GPUs; the task graph
    then has tasks on the classes' first GPUs only, so a timeline wants ``by_class=False``.
    """

    def __init__(
        self,
        ir: GraphIR,
        cluster: Cluster,
        *,
        costs: OpCostModel | None = None,
        comm: CommModel | None = None,
        use_priority: bool = False,
        reserve_bytes: int = FRAMEWORK_RESERVE_BYTES,
        by_class: bool = True,
    ) -> None:
        self.ir, self.cluster = ir, cluster
        self.costs = costs or OpCostModel(ir, cluster)
        self.comm = comm or CommModel(cluster)
        self.compiler = TaskCompiler(ir, cluster, costs=self.costs, comm=self.comm)
        self.use_priority = use_priority
        self.reserve_bytes = reserve_bytes
        self.by_class = by_class
        self._step_bound: StepBound | None = None
        self._placed: tuple[Strategy, ResolvedStrategy, Placement] | None = None
        self.twins = TwinMachines(cluster)
        self._twin_map: tuple[Placement, np.ndarray | None] | None = None

    def placed(self, strategy: Strategy) -> tuple[ResolvedStrategy, Placement]:
        """``strategy`` resolved as the planner resolves it (:func:`resolve_planned`) and
        placed, kept for the next call with the same object: the search bounds a strategy
        and then simulates it, and both start from its placement."""
        kept = self._placed
        if kept is not None and kept[0] is strategy:
            return kept[1], kept[2]
        resolved = resolve_planned(strategy, self.ir, self.cluster, work=self.costs.work)
        placement = place(self.ir, resolved)
        self._placed = (strategy, resolved, placement)
        return resolved, placement

    def twin_map(self, strategy: Strategy) -> np.ndarray | None:
        """The device map that moves ``strategy``'s placement onto the lowest of its
        machines' twins (:meth:`~tagplan.planner.topology.twins.TwinMachines.relabel`),
        or ``None`` where there is none to move onto or it has a pipeline (whose stages
        name their GPUs). Costs a placement (kept for :meth:`evaluate`)."""
        resolved, placement = self.placed(strategy)
        kept = self._twin_map
        if kept is not None and kept[0] is placement:
            return kept[1]
        found = None if resolved.pipeline is not None else self.twins.relabel(placement.inst_device)
        self._twin_map = (placement, found)
        return found

    def identity(self, strategy: Strategy) -> bytes:
        """A digest of everything the compile and the simulation read of ``strategy``:
        its placement (every op's instances: GPU, rows, mode) moved onto the lowest twin
        machines (:meth:`twin_map`), each op's group, each group's resolved collective,
        gradient synchronization and bucket size, its pipeline stages and micro-batches,
        and the parameters broadcast as sufficient factors. The decisions' other fields
        (device groups, option, replicas, batch shares, the parameter server's GPU,
        model-parallel placement) reach the compiler through the placement alone, so two
        strategies of one identity compile to the same task graph up to the names of
        twin GPUs and simulate to the same step and out-of-memory verdict, with the same
        peak memory on GPUs in the same place (:func:`relabeled`): a search simulates
        only the first of them. Costs a placement (kept for :meth:`evaluate`)."""
        resolved, placement = self.placed(strategy)
        twin_map = self.twin_map(strategy)
        device = placement.inst_device if twin_map is None else twin_map[placement.inst_device]
        # SHA-256: measured at 4.5 ms over 6 MB of instance arrays, half of BLAKE2b's time
        digest = hashlib.sha256()
        for column in (
            placement.op_mode,
            placement.inst_ptr,
            device.astype(placement.inst_device.dtype),
            placement.inst_lo,
            placement.inst_hi,
            resolved.op_group,
            resolved.group_stage,
            resolved.group_micro_batches,
            resolved.sfb_parameters,
        ):
            digest.update(len(column).to_bytes(8, "little"))  # parsed one way only
            digest.update(np.ascontiguousarray(column))
        decisions = [
            (str(collective), str(d.gradient_sync), d.bucket_bytes)
            for collective, d in zip(
                resolved.group_collective, resolved.group_decisions, strict=True
            )
        ]
        pipeline = resolved.pipeline
        digest.update(repr(decisions).encode())
        digest.update(b"" if pipeline is None else pipeline.model_dump_json().encode())
        return digest.digest()

    def evaluate(self, strategy: Strategy, *, by_class: bool | None = None) -> Evaluation:
        """Resolve, compile and simulate ``strategy`` (``by_class`` overrides the
        evaluator's choice for this one)."""
        resolved, placement = self.placed(strategy)
        classes = self.by_class if by_class is None else by_class
        compiled = self.compiler.compile(resolved, by_class=classes, placement=placement)
        graph = compiled.task_graph
        if self.use_priority:
            graph.task_priority[:] = upward_rank(graph)
        result = simulate(
            graph,
            device_memory_bytes=self.cluster.device_memory_bytes,
            reserve_bytes=self.reserve_bytes,
            use_priority=self.use_priority,
            task_copies=compiled.task_copies,
        )
        if compiled.symmetry is not None:
            result = _per_device(result, compiled.symmetry, graph.num_devices)
        return Evaluation(strategy, resolved, compiled, result)

    @property
    def step_bound(self) -> StepBound:
        """The bound on a placement's step (:mod:`~tagplan.planner.step_bound`), prepared
        on first use."""
        if self._step_bound is None:
            self._step_bound = StepBound(self.ir, self.cluster, self.costs, self.comm)
        return self._step_bound

    def compute_bound_s(self, strategy: Strategy) -> float:
        """A lower bound on ``strategy``'s simulated step without compiling it: the most
        compute any GPU runs. The task graph gives every op instance on a GPU a compute
        task of the op's time on that GPU's type at the instance's rows (as here), and a
        GPU runs its tasks one at a time, so no step is shorter; transfers, waits and the
        auxiliary ops only add. Costs a placement, not a compile; refuses a pipeline the
        graph cannot run as :meth:`evaluate` does
        (:class:`~tagplan.planner.errors.InvalidInput`)."""
        resolved, placement = self.placed(strategy)
        phase_barriers(self.ir, resolved, placement)
        return self.step_bound.compute_s(placement)

    def step_bound_s(self, strategy: Strategy) -> float:
        """A lower bound on the step of ``strategy``, one without a pipeline, that counts
        compute, the bytes that must reach each GPU and machine, and the longest chain of
        instances (:class:`~tagplan.planner.step_bound.StepBound`). Costs a placement and
        a walk over the instances, a tenth to a third of an evaluation; what the search checks
        before it simulates a strategy."""
        return self.step_bound_parts(strategy).step_time_s

    def step_bound_parts(self, strategy: Strategy) -> StepBoundParts:
        """:meth:`step_bound_s` and what it is made of."""
        if strategy.pipeline is not None:
            raise InvalidInput("the step bound is for strategies without a pipeline")
        resolved, placement = self.placed(strategy)
        sfb = bool(resolved.sfb_parameters.size)  # gradients broadcast, not AllReduced
        return self.step_bound.parts(placement, resolved, collectives=not sfb)


def relabeled(
    result: SimResult, source: np.ndarray | None, target: np.ndarray | None, cluster: Cluster
) -> SimResult:
    """The simulation of a strategy whose twin map (:meth:`Evaluator.twin_map`) is
    ``target`` from that of one of the same identity whose twin map is ``source``
    (``None``: no GPU moved): every GPU's figures and its ports' from the GPU at its
    place, every machine's links from the machine at its place."""
    if source is None and target is None:
        return result
    num_devices = cluster.num_devices
    everything = np.arange(num_devices)
    to_place = everything if target is None else target
    from_place = np.empty(num_devices, dtype=np.int64)
    from_place[everything if source is None else source] = everything
    device = from_place[to_place]  # per GPU, the GPU at its place in the simulated one
    machine_of = cluster.device_machine
    machine = np.empty(cluster.num_machines, dtype=np.int64)
    machine[machine_of] = machine_of[device]
    m = cluster.num_machines
    links = np.concatenate(
        [device, num_devices + device, 2 * num_devices + machine, 2 * num_devices + m + machine]
    )
    return replace(
        result,
        device_busy_s=result.device_busy_s[device],
        device_idle_fraction=result.device_idle_fraction[device],
        link_busy_s=result.link_busy_s[links],
        link_idle_fraction=result.link_idle_fraction[links],
        peak_memory_bytes=result.peak_memory_bytes[device],
        overflow_bytes=result.overflow_bytes[device],
    )


def _per_device(result: SimResult, symmetry: Symmetry, num_devices: int) -> SimResult:
    """A simulation by class with every GPU's figures (memory, busy time, its ports) taken
    from its class's first GPU (each group's idle time before transfers is averaged over
    the per-GPU graph's edges as simulated, with the tasks' copies); machine links and the
    schedule are as simulated."""
    ports = np.concatenate([symmetry.representative, num_devices + symmetry.representative])
    links = np.arange(len(result.link_busy_s))
    links[: 2 * num_devices] = ports
    return replace(
        result,
        device_busy_s=symmetry.per_device(result.device_busy_s),
        device_idle_fraction=symmetry.per_device(result.device_idle_fraction),
        link_busy_s=result.link_busy_s[links],
        link_idle_fraction=result.link_idle_fraction[links],
        peak_memory_bytes=symmetry.per_device(result.peak_memory_bytes),
        overflow_bytes=symmetry.per_device(result.overflow_bytes),
    )


_WARM_CLUSTER = {
    "machines": [
        {"name": "a", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 100},
        {"name": "b", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
    ],
    "network": {"bandwidth_gbps": 10},
}

_warm = False  # warm_up() has run in this process


def warm_up() -> float:
    """Compile the simulator's kernels in this process, once: numba loads them from its
    cache on first use (about a quarter of a second), or builds them where the cache is
    empty (about ten seconds on a fresh install); evaluating the zoo's tiny MLP under data
    parallelism with AllReduce and with a parameter server, and bounding them
    (:meth:`Evaluator.step_bound_s`), makes every kernel ready.
    Returns the seconds it took (0 once done in this process).

    A worker calls it when it starts, so no job pays it out of its budget, and a planner
    before it times the reference evaluation: timed with the kernels' compile, an
    evaluation would seem to cost several times more than it does, and the planner would
    leave the baselines and the search out."""
    global _warm
    if _warm:
        return 0.0
    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.graph.source import load_graph_source
    from tagplan.planner.search.baselines import baseline_strategy
    from tagplan.planner.topology import load_cluster

    started = time.perf_counter()
    source = load_graph_source("zoo:mlp")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    evaluator = Evaluator(ir, load_cluster(_WARM_CLUSTER), use_priority=True)
    for name in ("dp-nccl", "dp-ps"):
        strategy = baseline_strategy(name, ir, evaluator.cluster, evaluator.costs)
        evaluator.evaluate(strategy)
        evaluator.step_bound_s(strategy)
    _warm = True
    return time.perf_counter() - started
