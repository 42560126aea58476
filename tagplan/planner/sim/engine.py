"""The compiled scheduling loop of the simulator (DESIGN.md §6).

Two list schedulers over the flat arrays of a :class:`~tagplan.planner.sim.taskgraph.TaskGraph`,
both non-preemptive. A task *holds* a set of resources while it runs:
resources ``0 .. num_devices - 1`` are the devices, ``num_devices + l`` is link ``l``.
A compute task holds its device (and any links listed for it); a transfer or collective
holds every link of its link set and no device. A task that holds nothing (a transfer
with an empty link set) starts as soon as it is ready. A task is *ready* when its last
predecessor has finished: ``ready(x) = max(finish(p) for p in pred(x))`` (0 for a
source).

**FIFO** (TAG §4.3.2, TensorFlow's executor). Each resource serves the tasks that need it
in the order they became ready, ties broken by task index:

.. math::

    \\mathrm{start}(x) = \\max\\big(\\mathrm{ready}(x),
        \\max_{r \\in \\mathrm{res}(x)} \\mathrm{free}(r)\\big),\\qquad
    \\mathrm{finish}(x) = \\mathrm{start}(x) + p_x

computed by popping one global heap keyed by ``(ready, index)``: ready times come out
non-decreasing, so the order in which a resource is claimed is its FIFO order. A task
that holds several links keeps its place in the queue of each, so a collective that waits
for a busy link also holds back later tasks on its other links (head-of-line blocking).

**Priority** (HeteroG §4.2: list scheduling by upward rank). Each resource keeps its own
waiting queue, a binary heap keyed by ``(-priority, ready, index)``. Time advances from
one finish event to the next; at each event time the finished tasks release their
resources, their successors that became ready join the queues of their resources, and
then every resource that was released or received a task looks at the head of its queue:
the head starts when it is also the head of the queue of every other resource it needs
and all of them are free. So a free resource picks, among the tasks *already waiting* for
it, the one of highest priority, even if it became ready later. As in FIFO mode the head
reserves its resources: a lower-priority task does not slip past a waiting collective.
The head is decided by one total order, so the globally first waiting task always heads
all its queues and the loop cannot deadlock. With equal priorities and positive durations
both modes give the same schedule.

Each loop costs ``O((V + E + H) log V)`` for ``V`` tasks, ``E`` dependencies and ``H`` held
resources. :func:`schedule` returns ``(start_s, finish_s, busy_s, scheduled)`` where
``busy_s`` is per resource (the summed durations of the tasks that held it) and
``scheduled`` counts the tasks that ran: fewer than ``num_tasks`` means the dependencies
form a cycle.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["schedule", "upward_rank_kernel"]

_COMPUTE = 0  # taskgraph.COMPUTE, repeated as a literal for the compiled code


@njit(cache=True)
def _num_resources(x, kind, link_ptr):
    return (1 if kind[x] == _COMPUTE else 0) + link_ptr[x + 1] - link_ptr[x]


@njit(cache=True)
def _resource(x, j, kind, device, link_ptr, link_index, num_devices):
    """The ``j``-th resource task ``x`` holds: its device first (compute), then its links."""
    if kind[x] == _COMPUTE:
        if j == 0:
            return np.int64(device[x])
        j -= 1
    return np.int64(num_devices) + link_index[link_ptr[x] + j]


@njit(cache=True)
def _heap_push(key, val, size, k, v):
    """Push ``(k, v)`` onto the min-heap ``(key, val)`` of ``size`` entries; new size."""
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        pk = key[parent]
        if pk < k or (pk == k and val[parent] < v):
            break
        key[i] = pk
        val[i] = val[parent]
        i = parent
    key[i] = k
    val[i] = v
    return size + 1


@njit(cache=True)
def _heap_pop(key, val, size):
    """Remove the least ``(key, val)`` (at index 0) from the heap; new size."""
    size -= 1
    k = key[size]
    v = val[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (
            key[right] < key[child] or (key[right] == key[child] and val[right] < val[child])
        ):
            child = right
        ck = key[child]
        if k < ck or (k == ck and v < val[child]):
            break
        key[i] = ck
        val[i] = val[child]
        i = child
    if size > 0:
        key[i] = k
        val[i] = v
    return size


@njit(cache=True)
def _before(a, b, priority, ready):
    """Queue order of the priority mode: higher priority, then earlier ready, then index."""
    if priority[a] != priority[b]:
        return priority[a] > priority[b]
    if ready[a] != ready[b]:
        return ready[a] < ready[b]
    return a < b


@njit(cache=True)
def _queue_push(store, base, size, x, priority, ready):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        p = store[base + parent]
        if _before(p, x, priority, ready):
            break
        store[base + i] = p
        i = parent
    store[base + i] = x
    return size + 1


@njit(cache=True)
def _queue_pop(store, base, size, priority, ready):
    size -= 1
    x = store[base + size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and _before(store[base + right], store[base + child], priority, ready):
            child = right
        c = store[base + child]
        if _before(x, c, priority, ready):
            break
        store[base + i] = c
        i = child
    if size > 0:
        store[base + i] = x
    return size


@njit(cache=True)
def _fifo(
    kind,
    device,
    duration,
    link_ptr,
    link_index,
    succ_ptr,
    succ_index,
    num_devices,
    remaining,
    ready,
    start,
    finish,
    busy,
):
    n = len(kind)
    free = np.zeros(len(busy))
    heap_t = np.empty(n)
    heap_x = np.empty(n, dtype=np.int64)
    size = 0
    for x in range(n):
        if remaining[x] == 0:
            size = _heap_push(heap_t, heap_x, size, 0.0, x)
    scheduled = 0
    while size > 0:
        t = heap_t[0]
        x = heap_x[0]
        size = _heap_pop(heap_t, heap_x, size)
        scheduled += 1
        nres = _num_resources(x, kind, link_ptr)
        s = t
        for j in range(nres):
            r = _resource(x, j, kind, device, link_ptr, link_index, num_devices)
            if free[r] > s:
                s = free[r]
        f = s + duration[x]
        start[x] = s
        finish[x] = f
        for j in range(nres):
            r = _resource(x, j, kind, device, link_ptr, link_index, num_devices)
            free[r] = f
            busy[r] += duration[x]
        for k in range(succ_ptr[x], succ_ptr[x + 1]):
            y = succ_index[k]
            if f > ready[y]:
                ready[y] = f
            remaining[y] -= 1
            if remaining[y] == 0:
                size = _heap_push(heap_t, heap_x, size, ready[y], y)
    return scheduled


@njit(cache=True)
def _by_priority(
    kind,
    device,
    duration,
    priority,
    link_ptr,
    link_index,
    succ_ptr,
    succ_index,
    num_devices,
    remaining,
    ready,
    start,
    finish,
    busy,
):
    n = len(kind)
    num_res = len(busy)
    # One waiting queue per resource, each a heap in its own slice of ``store``: a task
    # waits at most once in the queue of each resource it holds, so the slice sizes are
    # the number of tasks that use the resource.
    base = np.zeros(num_res + 1, dtype=np.int64)
    for x in range(n):
        for j in range(_num_resources(x, kind, link_ptr)):
            base[_resource(x, j, kind, device, link_ptr, link_index, num_devices) + 1] += 1
    for r in range(num_res):
        base[r + 1] += base[r]
    store = np.empty(base[num_res], dtype=np.int64)
    qsize = np.zeros(num_res, dtype=np.int64)
    held = np.zeros(num_res, dtype=np.bool_)
    touched = np.empty(num_res, dtype=np.int64)
    marked = np.zeros(num_res, dtype=np.bool_)
    ntouched = 0
    event_t = np.empty(n)
    event_x = np.empty(n, dtype=np.int64)
    nevents = 0
    arriving = np.empty(n, dtype=np.int64)
    narriving = 0
    for x in range(n):
        if remaining[x] == 0:
            arriving[narriving] = x
            narriving += 1
    scheduled = 0
    t = 0.0
    while True:
        # Tasks that became ready at ``t`` join the queues of their resources.
        for i in range(narriving):
            x = arriving[i]
            ready[x] = t
            nres = _num_resources(x, kind, link_ptr)
            if nres == 0:
                start[x] = t
                finish[x] = t + duration[x]
                nevents = _heap_push(event_t, event_x, nevents, finish[x], x)
                scheduled += 1
                continue
            for j in range(nres):
                r = _resource(x, j, kind, device, link_ptr, link_index, num_devices)
                qsize[r] = _queue_push(store, base[r], qsize[r], x, priority, ready)
                if not marked[r]:
                    marked[r] = True
                    touched[ntouched] = r
                    ntouched += 1
        narriving = 0
        # Each free resource whose queue may have changed offers its head a start.
        for i in range(ntouched):
            r = touched[i]
            marked[r] = False
            if held[r] or qsize[r] == 0:
                continue
            h = store[base[r]]
            nres = _num_resources(h, kind, link_ptr)
            can_start = True
            for j in range(nres):
                q = _resource(h, j, kind, device, link_ptr, link_index, num_devices)
                if held[q] or store[base[q]] != h:
                    can_start = False
                    break
            if not can_start:
                continue
            for j in range(nres):
                q = _resource(h, j, kind, device, link_ptr, link_index, num_devices)
                qsize[q] = _queue_pop(store, base[q], qsize[q], priority, ready)
                held[q] = True
                busy[q] += duration[h]
            start[h] = t
            finish[h] = t + duration[h]
            nevents = _heap_push(event_t, event_x, nevents, finish[h], h)
            scheduled += 1
        ntouched = 0
        if nevents == 0:
            break
        # Advance to the next finish time; release every task finishing then.
        t = event_t[0]
        while nevents > 0 and event_t[0] == t:
            x = event_x[0]
            nevents = _heap_pop(event_t, event_x, nevents)
            for j in range(_num_resources(x, kind, link_ptr)):
                r = _resource(x, j, kind, device, link_ptr, link_index, num_devices)
                held[r] = False
                if not marked[r]:
                    marked[r] = True
                    touched[ntouched] = r
                    ntouched += 1
            for k in range(succ_ptr[x], succ_ptr[x + 1]):
                y = succ_index[k]
                remaining[y] -= 1
                if remaining[y] == 0:
                    arriving[narriving] = y
                    narriving += 1
    return scheduled


@njit(cache=True)
def schedule(
    kind,
    device,
    duration,
    priority,
    link_ptr,
    link_index,
    succ_ptr,
    succ_index,
    num_devices,
    num_links,
    use_priority,
):
    """Start and finish time of every task, busy seconds per resource, tasks scheduled.

    ``kind`` int8, ``device`` int32, ``duration`` / ``priority`` float64, the CSR arrays
    int32 or int64 as in :class:`TaskGraph`. See the module docstring for the two rules.
    """
    n = len(kind)
    remaining = np.zeros(n, dtype=np.int64)
    for k in range(len(succ_index)):
        remaining[succ_index[k]] += 1
    ready = np.zeros(n)
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    busy = np.zeros(num_devices + num_links)
    if use_priority:
        scheduled = _by_priority(
            kind,
            device,
            duration,
            priority,
            link_ptr,
            link_index,
            succ_ptr,
            succ_index,
            num_devices,
            remaining,
            ready,
            start,
            finish,
            busy,
        )
    else:
        scheduled = _fifo(
            kind,
            device,
            duration,
            link_ptr,
            link_index,
            succ_ptr,
            succ_index,
            num_devices,
            remaining,
            ready,
            start,
            finish,
            busy,
        )
    return start, finish, busy, scheduled


@njit(cache=True)
def upward_rank_kernel(duration, succ_ptr, succ_index):
    """``rank(x) = p_x + max(rank(s) for s in succ(x))`` in reverse topological order.

    Returns ``(rank, ordered)``; ``ordered < len(duration)`` means a cycle.
    """
    n = len(duration)
    indegree = np.zeros(n, dtype=np.int64)
    for k in range(len(succ_index)):
        indegree[succ_index[k]] += 1
    order = np.empty(n, dtype=np.int64)
    tail = 0
    for x in range(n):
        if indegree[x] == 0:
            order[tail] = x
            tail += 1
    head = 0
    while head < tail:
        x = order[head]
        head += 1
        for k in range(succ_ptr[x], succ_ptr[x + 1]):
            y = succ_index[k]
            indegree[y] -= 1
            if indegree[y] == 0:
                order[tail] = y
                tail += 1
    rank = np.zeros(n)
    for i in range(tail - 1, -1, -1):
        x = order[i]
        best = 0.0
        for k in range(succ_ptr[x], succ_ptr[x + 1]):
            if rank[succ_index[k]] > best:
                best = rank[succ_index[k]]
        rank[x] = duration[x] + best
    return rank, tail
