"""The search state as a heterogeneous graph (TAG §4.2.1, Table 1), in numpy.

Three node types:

* **op** — one per op group: its compute time, parameter bytes, traffic and how long its
  gradient would take to synchronize over the allocation's links, relative to the model
  and to its own compute; whether it is decided, the one being decided now, its position
  in the decision order; and the simulator's runtime feedback of the vertex's strategy
  (the group's makespan and idle time before transferring its output, per step);
* **dev** — one per device group: its share of the GPUs and of the allocation's speed on
  this model, GPU memory against the model's parameters, its machine's bandwidth; and the
  feedback (peak memory against capacity, idle fraction);
* **act** — one per candidate action of the group being decided: its option, how many
  device groups, GPUs and how much of the speed it takes, the slowest link inside it.

Edges, each in both directions where the relation has two: op→op along the data between
groups (bytes, relative) and back; dev↔dev (bandwidth and latency, relative, and whether
they share a machine); op↔dev for every pair (the group's estimated time on that device
group relative to its mean time, whether the decision so far puts it there and with
which option); dev→act for the device groups an action uses.

Every feature is a ratio or the log of one (times against the group's or the step's,
bytes against the model's, bandwidth against the allocation's fastest link), and there
are no node ids, so a trained network applies to models and clusters it has not seen.
:data:`SCHEMA_VERSION` changes whenever a feature's meaning or position does; a
checkpoint records it and is refused under another.

:class:`StaticGraph` holds what one search keeps fixed; :func:`state_graph` adds a
vertex's decisions and feedback. Both are plain arrays, so training data is stored
without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.search.prior import PriorQuery, SearchContext
from tagplan.planner.strategy import Option

__all__ = [
    "ABLATIONS",
    "ACT_FEATURES",
    "DEV_FEATURES",
    "EDGE_FEATURES",
    "OP_FEATURES",
    "SCHEMA_VERSION",
    "StateGraph",
    "StaticGraph",
    "ablate",
    "clipped_log",
    "state_graph",
    "static_graph",
]

SCHEMA_VERSION = 1
OPTIONS: tuple[Option, ...] = tuple(Option)

OP_FEATURES = (
    "time_share",  # t_g / Σ t
    "log_time_vs_mean",  # log(t_g / mean t)
    "param_share",  # parameter bytes / the model's
    "log_params_vs_memory",  # log(4 · parameter bytes / smallest GPU memory)
    "log_sync_vs_compute_slow",  # log(gradient over the slowest link / t_g)
    "log_sync_vs_compute_fast",  # log(gradient over the fastest link / t_g)
    "bytes_in_share",
    "bytes_out_share",
    "order_position",  # position in the decision order / number of groups
    "decided",
    "current",
    "has_feedback",
    "makespan_vs_step",  # runtime feedback: group makespan / step
    "idle_before_transfer_vs_step",
    "progress",  # level / number of groups (search progress, on every node)
)
DEV_FEATURES = (
    "gpu_share",
    "speed_share",
    "log_speed_vs_mean",
    "log_memory_vs_params",  # log(GPU memory / 4 · the model's parameter bytes)
    "log_intra_bandwidth",  # vs the fastest link
    "log_uplink_bandwidth",
    "groups_on_machine_share",
    "has_feedback",
    "peak_memory_vs_capacity",  # runtime feedback: max over the group's GPUs
    "idle_fraction",
    "over_capacity",
)
ACT_FEATURES = (
    *(f"option_{o.value}" for o in OPTIONS),
    "group_share",
    "gpu_share",
    "speed_share",
    "log_min_bandwidth",  # the slowest link between its device groups (inside one: intra)
    "machine_share",
)
EDGE_FEATURES = {
    ("op", "feeds", "op"): ("log_bytes_vs_mean", "log_transfer_vs_compute"),
    ("op", "fed_by", "op"): ("log_bytes_vs_mean", "log_transfer_vs_compute"),
    ("dev", "link", "dev"): ("log_bandwidth", "latency_vs_max", "same_machine"),
    ("op", "on", "dev"): (
        "log_time_vs_mean",
        "placed",
        *(f"option_{o.value}" for o in OPTIONS),
    ),
    ("dev", "hosts", "op"): (
        "log_time_vs_mean",
        "placed",
        *(f"option_{o.value}" for o in OPTIONS),
    ),
    ("dev", "in", "act"): (),
}
ABLATIONS = ("none", "no-feedback", "no-device-graph")
"""Parts of the graph a network can be trained without, to measure what they are worth
(TAG Fig. 7): the simulator's runtime feedback; the device graph (device features and
every edge to or between device groups: the network then sees op groups and the actions'
own features only)."""
_FEEDBACK = {
    "op": ("has_feedback", "makespan_vs_step", "idle_before_transfer_vs_step"),
    "dev": ("has_feedback", "peak_memory_vs_capacity", "idle_fraction", "over_capacity"),
}
_TINY = 1e-12
_LOG_RANGE = 9.2  # ratios are read between 1e-4 and 1e4: beyond that only the sign matters


def clipped_log(x: np.ndarray | float) -> np.ndarray:
    """``log(x)`` clipped to ±:data:`_LOG_RANGE` (an empty group's time is 0)."""
    with np.errstate(divide="ignore"):
        value = np.log(np.maximum(np.asarray(x, dtype=np.float64), 0.0))
    return np.clip(value, -_LOG_RANGE, _LOG_RANGE)


@dataclass(frozen=True, eq=False)
class StaticGraph:
    """The parts of the graph one search keeps fixed (module docstring). Float32 features,
    int64 ``(2, E)`` edge indices."""

    op_x: np.ndarray  # (G, len(OP_FEATURES)) with the dynamic columns zero
    dev_x: np.ndarray  # (M, len(DEV_FEATURES)) likewise
    act_x: np.ndarray  # (A, len(ACT_FEATURES))
    op_edge_index: np.ndarray  # op -> op along the data
    op_back_index: np.ndarray  # the same edges reversed
    op_edge_attr: np.ndarray
    dev_edge_index: np.ndarray  # every ordered pair of distinct device groups
    dev_edge_attr: np.ndarray
    op_dev_log_time: np.ndarray  # (G, M): log(estimated time on d / the group's mean time)
    op_dev_index: np.ndarray  # (2, G·M): every (op group, device group) pair, row-major
    dev_op_index: np.ndarray  # the same pairs reversed
    act_members: np.ndarray  # (2, sum |S|): device group -> action
    act_device_groups: tuple[tuple[int, ...], ...]
    act_option: np.ndarray  # (A,) option index in OPTIONS
    group_gpus: np.ndarray  # the GPUs of device group 0, then of group 1, ...
    group_start: np.ndarray  # where each device group's GPUs start in ``group_gpus``


@dataclass(frozen=True, eq=False)
class StateGraph:
    """One vertex's graph: the static parts with its decisions and feedback filled in."""

    op_x: np.ndarray
    dev_x: np.ndarray
    act_x: np.ndarray
    edges: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]  # index, attr


def static_graph(context: SearchContext) -> StaticGraph:
    """The fixed part of the graph of one search."""
    grouping, space = context.grouping, context.space
    cluster = space.cluster
    g_count, m_count = grouping.num_groups, cluster.num_groups
    time_s = np.maximum(grouping.group_time_s, _TINY)
    params = grouping.group_param_bytes.astype(np.float64)
    model_params = max(params.sum(), 1.0)
    bandwidth = cluster.group_bandwidth_bytes_per_s
    fastest = float(bandwidth[np.isfinite(bandwidth)].max())
    slowest = float(bandwidth.min())
    bytes_in = np.bincount(grouping.edge_dst, grouping.edge_bytes, minlength=g_count)
    bytes_out = np.bincount(grouping.edge_src, grouping.edge_bytes, minlength=g_count)
    total_edge_bytes = max(float(grouping.edge_bytes.sum()), 1.0)
    position = np.empty(g_count)
    position[np.argsort(-grouping.group_time_s, kind="stable")] = np.arange(g_count) / g_count
    min_memory = float(cluster.device_memory_bytes.min())

    op_x = np.zeros((g_count, len(OP_FEATURES)))
    op_x[:, 0] = time_s / time_s.sum()
    op_x[:, 1] = clipped_log(time_s / time_s.mean())
    op_x[:, 2] = params / model_params
    op_x[:, 3] = clipped_log(4 * params / min_memory)
    op_x[:, 4] = clipped_log(2 * params / slowest / time_s)
    op_x[:, 5] = clipped_log(2 * params / fastest / time_s)
    op_x[:, 6] = bytes_in / total_edge_bytes
    op_x[:, 7] = bytes_out / total_edge_bytes
    op_x[:, 8] = position

    speed = space.group_speed
    members = tuple(cluster.group_devices(d) for d in range(m_count))
    machine_groups = np.bincount(cluster.group_machine, minlength=cluster.num_machines)
    group_memory = np.array([cluster.device_memory_bytes[m].min() for m in members])
    dev_x = np.zeros((m_count, len(DEV_FEATURES)))
    dev_x[:, 0] = cluster.group_size / cluster.num_devices
    dev_x[:, 1] = speed / speed.sum()
    dev_x[:, 2] = clipped_log(speed / speed.mean())
    dev_x[:, 3] = clipped_log(group_memory / (4 * model_params))
    dev_x[:, 4] = clipped_log(cluster.group_intra_bandwidth_bytes_per_s / fastest)
    between = cluster.machine_bandwidth_bytes_per_s.copy()
    if cluster.num_machines > 1:
        np.fill_diagonal(between, 0.0)  # the fastest way out of the machine
    uplink = between.max(axis=1)[cluster.group_machine]
    dev_x[:, 5] = clipped_log(uplink / fastest)
    dev_x[:, 6] = machine_groups[cluster.group_machine] / m_count

    edge_bytes = grouping.edge_bytes.astype(np.float64)
    mean_bytes = max(edge_bytes.mean(), 1.0) if len(edge_bytes) else 1.0
    op_edge_attr = np.stack(
        [
            clipped_log((edge_bytes + 1.0) / mean_bytes),
            clipped_log((edge_bytes + 1.0) / slowest / time_s[grouping.edge_src]),
        ],
        axis=1,
    ).reshape(-1, 2)
    src, dst = np.nonzero(~np.eye(m_count, dtype=bool))
    latency = cluster.group_latency_s[src, dst]
    dev_edge_attr = np.stack(
        [
            clipped_log(bandwidth[src, dst] / fastest),
            latency / max(float(cluster.group_latency_s.max()), _TINY),
            (cluster.group_machine[src] == cluster.group_machine[dst]).astype(np.float64),
        ],
        axis=1,
    ).reshape(-1, 3)

    # group g's time on device group d (its type's op times, the batch shared over d's
    # GPUs) against its time averaged over the cluster's types at the whole batch
    local_share = cluster.num_devices / cluster.group_size
    on_type = {
        t: np.bincount(grouping.op_group, seconds, minlength=g_count)
        for t, seconds in space.type_op_time_s.items()
    }
    time_on = np.stack([on_type[int(cluster.group_type[d])] for d in range(m_count)], axis=1)
    op_dev_log_time = clipped_log(time_on * local_share[None, :] / time_s[:, None])

    actions = space.actions
    act_x = np.zeros((len(actions), len(ACT_FEATURES)))
    act_option = np.array([OPTIONS.index(a.option) for a in actions], dtype=np.int64)
    act_x[np.arange(len(actions)), act_option] = 1.0
    col = len(OPTIONS)
    member_src: list[int] = []
    member_dst: list[int] = []
    for i, action in enumerate(actions):
        chosen = list(action.device_groups)
        member_src += chosen
        member_dst += [i] * len(chosen)
        inner = bandwidth[np.ix_(chosen, chosen)]
        act_x[i, col] = len(chosen) / m_count
        act_x[i, col + 1] = cluster.group_size[chosen].sum() / cluster.num_devices
        act_x[i, col + 2] = speed[chosen].sum() / speed.sum()
        act_x[i, col + 3] = clipped_log(inner.min() / fastest)
        act_x[i, col + 4] = len(set(cluster.group_machine[chosen].tolist())) / cluster.num_machines

    op_edge_index = np.stack([grouping.edge_src, grouping.edge_dst]).astype(np.int64)
    op_dev_index = np.stack(np.divmod(np.arange(g_count * m_count), m_count)).astype(np.int64)
    return StaticGraph(
        op_x=op_x.astype(np.float32),
        dev_x=dev_x.astype(np.float32),
        act_x=act_x.astype(np.float32),
        op_edge_index=op_edge_index,
        op_back_index=op_edge_index[::-1].copy(),
        op_edge_attr=op_edge_attr.astype(np.float32),
        dev_edge_index=np.stack([src, dst]).astype(np.int64),
        dev_edge_attr=dev_edge_attr.astype(np.float32),
        op_dev_log_time=op_dev_log_time.astype(np.float32),
        op_dev_index=op_dev_index,
        dev_op_index=op_dev_index[::-1].copy(),
        act_members=np.array([member_src, member_dst], dtype=np.int64).reshape(2, -1),
        act_device_groups=tuple(a.device_groups for a in actions),
        act_option=act_option,
        group_gpus=np.concatenate(members),
        group_start=np.cumsum([0, *map(len, members[:-1])]),
    )


def state_graph(static: StaticGraph, query: PriorQuery) -> StateGraph:
    """The graph of the vertex ``query`` stands for: which groups are decided and how,
    which one is next, and the runtime feedback of its strategy (TAG Table 1)."""
    g_count, m_count = static.op_x.shape[0], static.dev_x.shape[0]
    op_x = static.op_x.copy()
    dev_x = static.dev_x.copy()
    decided_groups = query.order[: query.level]
    op_x[decided_groups, OP_FEATURES.index("decided")] = 1.0
    if query.level < g_count:
        op_x[query.order[query.level], OP_FEATURES.index("current")] = 1.0
    op_x[:, OP_FEATURES.index("progress")] = query.level / g_count

    placed = np.zeros((g_count, m_count), dtype=np.float32)
    option = np.zeros((g_count, m_count, len(OPTIONS)), dtype=np.float32)
    for group, action in zip(decided_groups, query.decided, strict=True):
        chosen = list(static.act_device_groups[action])
        placed[group, chosen] = 1.0
        option[group, chosen, static.act_option[action]] = 1.0

    feedback = query.feedback
    if feedback is not None:
        step_s = max(feedback.step_time_s, _TINY)
        op_x[:, OP_FEATURES.index("has_feedback")] = 1.0
        makespan = np.zeros(g_count)
        idle = np.zeros(g_count)
        known = min(g_count, len(feedback.group_makespan_s))
        makespan[:known] = feedback.group_makespan_s[:known]
        known_idle = min(g_count, len(feedback.group_idle_before_transfer_s))
        idle[:known_idle] = feedback.group_idle_before_transfer_s[:known_idle]
        op_x[:, OP_FEATURES.index("makespan_vs_step")] = makespan / step_s
        op_x[:, OP_FEATURES.index("idle_before_transfer_vs_step")] = idle / step_s
        capacity = query.context.space.cluster.device_memory_bytes
        peak = feedback.peak_memory_bytes / np.maximum(capacity, 1)
        gpus, start = static.group_gpus, static.group_start
        group_peak = np.maximum.reduceat(peak[gpus], start)  # every device group has a GPU
        group_gpus = np.diff(start, append=len(gpus))
        group_idle = np.add.reduceat(feedback.device_idle_fraction[gpus], start) / group_gpus
        dev_x[:, DEV_FEATURES.index("has_feedback")] = 1.0
        dev_x[:, DEV_FEATURES.index("peak_memory_vs_capacity")] = np.minimum(group_peak, 4.0)
        dev_x[:, DEV_FEATURES.index("idle_fraction")] = group_idle
        dev_x[:, DEV_FEATURES.index("over_capacity")] = group_peak > 1.0

    op_dev_attr = np.concatenate(
        [
            static.op_dev_log_time.reshape(-1, 1),
            placed.reshape(-1, 1),
            option.reshape(-1, len(OPTIONS)),
        ],
        axis=1,
    ).astype(np.float32)
    edges = {
        ("op", "feeds", "op"): (static.op_edge_index, static.op_edge_attr),
        ("op", "fed_by", "op"): (static.op_back_index, static.op_edge_attr),
        ("dev", "link", "dev"): (static.dev_edge_index, static.dev_edge_attr),
        ("op", "on", "dev"): (static.op_dev_index, op_dev_attr),
        ("dev", "hosts", "op"): (static.dev_op_index, op_dev_attr),
        ("dev", "in", "act"): (static.act_members, np.zeros((static.act_members.shape[1], 0))),
    }
    return StateGraph(op_x=op_x, dev_x=dev_x, act_x=static.act_x, edges=edges)


def ablate(graph: StateGraph, ablation: str) -> StateGraph:
    """``graph`` without the part :data:`ABLATIONS` names (``none``: unchanged)."""
    if ablation == "none":
        return graph
    if ablation == "no-feedback":
        op_x, dev_x = graph.op_x.copy(), graph.dev_x.copy()
        op_x[:, [OP_FEATURES.index(f) for f in _FEEDBACK["op"]]] = 0.0
        dev_x[:, [DEV_FEATURES.index(f) for f in _FEEDBACK["dev"]]] = 0.0
        return StateGraph(op_x=op_x, dev_x=dev_x, act_x=graph.act_x, edges=graph.edges)
    if ablation == "no-device-graph":
        edges = {
            edge_type: (index[:, :0], attr[:0])
            if "dev" in (edge_type[0], edge_type[2])
            else (index, attr)
            for edge_type, (index, attr) in graph.edges.items()
        }
        dev_x = np.zeros_like(graph.dev_x)
        return StateGraph(op_x=graph.op_x, dev_x=dev_x, act_x=graph.act_x, edges=edges)
    raise ValueError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
