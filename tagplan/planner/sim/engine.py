"""The compiled scheduling loops of the simulator (docs/design.md §6, TAG §4.3.2).

The loops schedule the flat arrays of a :class:`~tagplan.planner.sim.taskgraph.TaskGraph`.
Resources ``0 .. num_devices - 1`` are the devices, ``num_devices + l`` is link ``l``. A
task is *ready* when its last predecessor has finished:
``ready(x) = max(finish(p) for p in pred(x))`` (0 for a source). A compute task holds its
device, non-preemptively; how communication uses links is the *link model*.

**Shared links** (the default). A transfer ``x`` starts when it is ready (a collective when
its communicator is free, below) and holds no device. Its duration ``p_x`` splits into a
latency part ``a_x`` and a bandwidth part ``w_x = p_x - a_x``; on each link ``l`` of its
set it has a share ``u_{x,l} \\in (0, 1]``, the fraction of the link's bandwidth it uses at
its uncontended speed. It first pays its latency, using no bandwidth, then is an *active
flow* that moves at a speed ``\\phi_x(t) \\in (0, 1]`` (a fraction of its uncontended speed) until

.. math::

    \\int \\phi_x(t)\\,dt = w_x,\\qquad
    \\sum_{x \\ni l} \\phi_x(t)\\, u_{x,l} \\le 1 \\ \\ \\forall l,\\qquad \\phi_x(t) \\le 1,

the speeds being the *max-min fair* solution of these constraints, recomputed whenever a
flow becomes active or ends, by progressive filling: raise every speed together; when a
link is full, freeze the speeds of its flows at the current level; stop at 1. So ``k``
equal flows into one link each move at ``1/k`` and all finish after ``k w``; a flow alone
finishes after ``p_x``, as in the cost model. The rule is work-conserving: every active
flow moves (``\\phi_x > 0``), so a link with traffic is never idle, and each flow either
moves at full speed or crosses a full link on which no flow is faster. Link ``l``'s busy
time is ``\\sum_x u_{x,l} w_x``, the bytes it carried over its bandwidth.

A *collective* is one flow over all its links: a ring AllReduce of ``S`` bytes among ``k``
devices moves ``V = 2(k-1)S/k`` bytes over every link of the ring, at the rate ``R`` of its
slowest path when uncontended, so ``u_{x,l} = \\min(1, R / c_l)`` for a link of bandwidth
``c_l``, ``w_x = \\min(p_x, V / R)`` and ``a_x = p_x - w_x`` (``2(k-1)\\alpha`` for the
closed form of :func:`~tagplan.planner.cost.comm.ring_allreduce_time_s`). When links are
shared it moves at the speed of its most contended link; alone it takes ``p_x`` as before.
Collectives with the same links and shares (one communicator: the same devices) run one at
a time, as a collective library runs a communicator's collectives in order on one stream;
collectives of other communicators and transfers share links with it. The compiler
(:mod:`~tagplan.planner.compile.links`) sets the shares and latencies.

Compute tasks wait in one queue per device, collectives in one per communicator; a free
device or communicator starts the head of its queue, ordered by ``(ready, index)`` (FIFO,
TensorFlow's executor) or by ``(-priority, ready, index)`` (HeteroG §4.2's list scheduling
by upward rank). Flows of one route (the same links and shares) always move at the same
speed, so the loop keeps one progress counter and one heap of finishing points per route,
and fills per route; each link keeps the routes with flows on it and their summed shares
as flows come and go, so the cost of a change is ``O(E + K L)`` for ``E`` route-link pairs
of the routes it freezes, ``K`` rounds of filling and ``L`` links in use, with no pass over
every route and link to rebuild them.

**Exclusive links** (``shared_links=False``: each link carries one transfer at a time, the
model before links were shared, kept for comparison). A transfer or collective *holds*
every link of its link set for its whole duration, non-preemptively. In FIFO mode each
resource serves the tasks that need it in the order they became ready, ties broken by
task index:

.. math::

    \\mathrm{start}(x) = \\max\\big(\\mathrm{ready}(x),
        \\max_{r \\in \\mathrm{res}(x)} \\mathrm{free}(r)\\big),\\qquad
    \\mathrm{finish}(x) = \\mathrm{start}(x) + p_x

computed by popping one global heap keyed by ``(ready, index)``: ready times come out
non-decreasing, so the order in which a resource is claimed is its FIFO order. A task
that holds several links keeps its place in the queue of each, so a collective that waits
for a busy link also holds back later tasks on its other links (head-of-line blocking).
In priority mode each resource keeps its own waiting queue, a binary heap keyed by
``(-priority, ready, index)``. Time advances from one finish event to the next; at each
event time the finished tasks release their resources, their successors that became
ready join the queues of their resources, and then every resource that was released or
received a task looks at the head of its queue: the head starts when it is also the head
of the queue of every other resource it needs and all of them are free. As in FIFO mode
the head reserves its resources: a lower-priority task does not slip past a waiting
collective. The head is decided by one total order, so the globally first waiting task
always heads all its queues and the loop cannot deadlock. With equal priorities and
positive durations both modes give the same schedule. A task that holds nothing (a
transfer with an empty link set) starts as soon as it is ready; ``busy_s`` of a link is
the summed durations of the tasks that held it.

Each exclusive loop costs ``O((V + E + H) log V)`` for ``V`` tasks, ``E`` dependencies and
``H`` held resources.
:func:`schedule` returns ``(start_s, finish_s, busy_s, scheduled)`` where ``busy_s`` is per
resource and ``scheduled`` counts the tasks that ran: fewer than ``num_tasks`` means the
dependencies form a cycle.

Why one module: numba compiles a kernel together with the kernels it calls; the three
loops share the heaps, the waiting queues and the resource indexing above, and keeping
them in one module keeps every njit call inside one compilation cache file and one place
to read the scheduling rules side by side.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

__all__ = ["schedule", "upward_rank_kernel"]

_COMPUTE = 0  # taskgraph.COMPUTE and COLLECTIVE, repeated as literals for the compiled code
_COLLECTIVE = 2


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


_FULL_ROOM = 1e-9  # a link with less spare capacity than this (of 1) is full


@njit(cache=True)
def _release(x, succ_ptr, succ_index, remaining, arriving, narriving):
    """Successors of the finished task ``x`` that became ready join ``arriving``."""
    for k in range(succ_ptr[x], succ_ptr[x + 1]):
        y = succ_index[k]
        remaining[y] -= 1
        if remaining[y] == 0:
            arriving[narriving] = y
            narriving += 1
    return narriving


@njit(cache=True)
def _same_route(a, b, link_ptr, link_index, link_share):
    """Whether tasks ``a`` and ``b`` list the same links with the same shares."""
    if link_ptr[a + 1] - link_ptr[a] != link_ptr[b + 1] - link_ptr[b]:
        return False
    for j in range(link_ptr[a + 1] - link_ptr[a]):
        ea, eb = link_ptr[a] + j, link_ptr[b] + j
        if link_index[ea] != link_index[eb] or link_share[ea] != link_share[eb]:
            return False
    return True


@njit(cache=True)
def _routes(kind, link_ptr, link_index, link_share, route):
    """Number the distinct routes (links with shares) of the communication tasks.

    ``route[x]`` gets the route of task ``x`` (-1 for one without links); returns the
    number of routes and a task of each. Flows of one route have the same constraints,
    so max-min fairness gives them the same speed: the loop shares links among routes.
    """
    n = len(kind)
    count = 0
    for x in range(n):
        if kind[x] != _COMPUTE and link_ptr[x + 1] > link_ptr[x]:
            count += 1
    size = 1
    while size < 2 * count:
        size *= 2
    table = np.full(size, -1, dtype=np.int64)
    first = np.empty(count, dtype=np.int64)
    nroutes = 0
    for x in range(n):
        route[x] = -1
        if kind[x] == _COMPUTE or link_ptr[x + 1] == link_ptr[x]:
            continue
        h = np.uint64(14695981039346656037)
        for e in range(link_ptr[x], link_ptr[x + 1]):
            h = (h ^ np.uint64(link_index[e])) * np.uint64(1099511628211)
            h = (h ^ np.uint64(link_share[e] * 1e12)) * np.uint64(1099511628211)
        slot = np.int64(h & np.uint64(size - 1))
        while True:
            y = table[slot]
            if y < 0:
                table[slot] = x
                route[x] = nroutes
                first[nroutes] = x
                nroutes += 1
                break
            if _same_route(x, y, link_ptr, link_index, link_share):
                route[x] = route[y]
                break
            slot = (slot + 1) & (size - 1)
    return nroutes, first


class _Links(NamedTuple):
    """The links' state between calls of :func:`_fill`, kept as routes get and lose
    flows rather than rebuilt at every call, and its work arrays.

    Each link lists the routes with flows on it in its row of ``members``
    (``members[ptr[l] : ptr[l] + count[l]]``, a row as long as the routes that may use
    it), and keeps ``load[l]``, the summed shares of those routes' flows; ``used`` lists the
    links with flows (``nused[0]`` of them), ``where[l]`` a link's place in it.
    """

    ptr: np.ndarray  # int64, num_links + 1: each link's row of ``members``
    members: np.ndarray  # int64: routes with flows, by link
    count: np.ndarray  # int64 per link: routes with flows on it
    place: np.ndarray  # int64 per route-link pair (``pair_base``): its index in ``members``
    pair_base: np.ndarray  # int64, nroutes + 1: a route's first pair
    load: np.ndarray  # float64 per link: summed shares of the flows on it
    used: np.ndarray  # int64: the links with flows
    where: np.ndarray  # int64 per link: its index in ``used``
    nused: np.ndarray  # int64, one entry: how many links ``used`` lists
    # work arrays of one call of :func:`_fill`
    level_load: np.ndarray  # float64 per link: summed shares of its unfrozen flows
    room: np.ndarray  # float64 per link: spare capacity
    unfrozen: np.ndarray  # int64 per link: unfrozen routes on it
    frozen: np.ndarray  # bool per route


@njit(cache=True)
def _links(nroutes, first, link_ptr, link_index, num_links):
    """The links' state with no flows, rows sized by the routes that may use each link."""
    rows = np.zeros(num_links + 1, dtype=np.int64)
    pair_base = np.zeros(nroutes + 1, dtype=np.int64)
    for c in range(nroutes):
        x = first[c]
        pair_base[c + 1] = pair_base[c] + link_ptr[x + 1] - link_ptr[x]
        for e in range(link_ptr[x], link_ptr[x + 1]):
            rows[link_index[e] + 1] += 1
    for link in range(num_links):
        rows[link + 1] += rows[link]
    return _Links(
        rows,
        np.empty(rows[num_links], dtype=np.int64),
        np.zeros(num_links, dtype=np.int64),
        np.empty(pair_base[nroutes], dtype=np.int64),
        pair_base,
        np.zeros(num_links),
        np.empty(num_links, dtype=np.int64),
        np.empty(num_links, dtype=np.int64),
        np.zeros(1, dtype=np.int64),
        np.empty(num_links),
        np.empty(num_links),
        np.zeros(num_links, dtype=np.int64),
        np.zeros(nroutes, dtype=np.bool_),
    )


@njit(cache=True)
def _route_joins(c, first, link_ptr, link_index, links):
    """Route ``c`` got its first flow: its links list it."""
    x = first[c]
    for j in range(link_ptr[x + 1] - link_ptr[x]):
        link = link_index[link_ptr[x] + j]
        k = links.ptr[link] + links.count[link]
        links.members[k] = c
        links.place[links.pair_base[c] + j] = k
        links.count[link] += 1
        if links.count[link] == 1:
            links.where[link] = links.nused[0]
            links.used[links.nused[0]] = link
            links.nused[0] += 1


@njit(cache=True)
def _route_leaves(c, first, link_ptr, link_index, links):
    """Route ``c`` lost its last flow: its links stop listing it (the last route of a
    link's row takes its place), and a link left without flows leaves ``used``."""
    x = first[c]
    for j in range(link_ptr[x + 1] - link_ptr[x]):
        link = link_index[link_ptr[x] + j]
        k = links.place[links.pair_base[c] + j]
        last = links.ptr[link] + links.count[link] - 1
        moved = links.members[last]
        links.members[k] = moved
        for i in range(links.pair_base[moved], links.pair_base[moved + 1]):
            if links.place[i] == last:
                links.place[i] = k
                break
        links.count[link] -= 1
        if links.count[link] == 0:
            links.load[link] = 0.0  # no drift left behind by the flows' sums
            links.nused[0] -= 1
            other = links.used[links.nused[0]]
            links.used[links.where[link]] = other
            links.where[other] = links.where[link]


@njit(cache=True)
def _fill(busy_routes, nbusy, first, nflows, link_ptr, link_index, link_share, speed, links):
    """Max-min fair speeds of the routes with flows, by progressive filling (module
    docstring): ``speed[c]`` for every route ``c`` of ``busy_routes[:nbusy]``, which carries
    ``nflows[c]`` flows along the links of its task ``first[c]``.

    Each round raises the level of the unfrozen routes to the point where the next links
    fill, then freezes the routes on those links, found in the links' lists of routes
    (:class:`_Links`, kept between calls with each link's load); so a call costs
    ``O(E + K L)`` for ``E`` pairs of a frozen route and a link, ``K`` rounds and ``L``
    links in use.
    """
    used, nused = links.used, links.nused[0]
    load, room, unfrozen, frozen = links.level_load, links.room, links.unfrozen, links.frozen
    for j in range(nused):
        link = used[j]
        load[link] = links.load[link]
        room[link] = 1.0
        unfrozen[link] = links.count[link]
    for i in range(nbusy):
        frozen[busy_routes[i]] = False
    nfree = nbusy
    level = 0.0
    while nfree > 0:
        step = 1.0 - level
        limited = False
        for j in range(nused):
            link = used[j]
            if unfrozen[link] > 0 and room[link] < step * load[link]:
                step = room[link] / load[link]
                limited = True
        level += step
        if not limited:  # the unfrozen routes reach full speed
            for i in range(nbusy):
                c = busy_routes[i]
                if not frozen[c]:
                    speed[c] = 1.0
            break
        for j in range(nused):
            link = used[j]
            if unfrozen[link] > 0:
                room[link] -= step * load[link]
        for j in range(nused):
            link = used[j]
            if unfrozen[link] == 0 or room[link] > _FULL_ROOM:
                continue
            for k in range(links.ptr[link], links.ptr[link] + links.count[link]):
                c = links.members[k]
                if frozen[c]:
                    continue
                frozen[c] = True
                speed[c] = level
                nfree -= 1
                x = first[c]
                for e in range(link_ptr[x], link_ptr[x + 1]):
                    unfrozen[link_index[e]] -= 1
                    load[link_index[e]] -= nflows[c] * link_share[e]


@njit(cache=True)
def _free(s, held, marked, touched, ntouched):
    """Server ``s`` (``-1`` for none) is free again: it will offer its queue's head a start."""
    if s < 0:
        return ntouched
    held[s] = False
    if not marked[s]:
        marked[s] = True
        touched[ntouched] = s
        ntouched += 1
    return ntouched


@njit(cache=True)
def _shared(
    kind,
    device,
    duration,
    latency,
    priority,
    link_ptr,
    link_index,
    link_share,
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
    num_links = len(busy) - num_devices
    # Flows by route. The flows of a route move at one speed, so each route keeps its
    # progress ``progress[c]`` (work done per flow since it got flows) and a heap of its
    # flows keyed by the progress at which each finishes, in its slice of ``flow_key``.
    route = np.empty(n, dtype=np.int64)
    nroutes, first = _routes(kind, link_ptr, link_index, link_share, route)
    rbase = np.zeros(nroutes + 1, dtype=np.int64)
    for x in range(n):
        if route[x] >= 0:
            rbase[route[x] + 1] += 1
    for c in range(nroutes):
        rbase[c + 1] += rbase[c]
    flow_key = np.empty(rbase[nroutes])
    flow_x = np.empty(rbase[nroutes], dtype=np.int64)
    nflows = np.zeros(nroutes, dtype=np.int64)
    progress = np.zeros(nroutes)
    speed = np.ones(nroutes)
    next_done = np.empty(nroutes)
    busy_routes = np.empty(nroutes, dtype=np.int64)
    nbusy = 0
    links = _links(nroutes, first, link_ptr, link_index, num_links)
    # Servers run one task at a time from a waiting queue (a heap in its slice of
    # ``store``): each device its compute tasks, each collective route (a communicator)
    # its collectives. Other transfers start when ready.
    num_servers = num_devices + nroutes
    server = np.full(n, -1, dtype=np.int64)
    for x in range(n):
        if kind[x] == _COMPUTE:
            server[x] = device[x]
        elif kind[x] == _COLLECTIVE and route[x] >= 0:
            server[x] = num_devices + route[x]
    base = np.zeros(num_servers + 1, dtype=np.int64)
    for x in range(n):
        if server[x] >= 0:
            base[server[x] + 1] += 1
    for s in range(num_servers):
        base[s + 1] += base[s]
    store = np.empty(base[num_servers], dtype=np.int64)
    qsize = np.zeros(num_servers, dtype=np.int64)
    held = np.zeros(num_servers, dtype=np.bool_)
    touched = np.empty(num_servers, dtype=np.int64)
    marked = np.zeros(num_servers, dtype=np.bool_)
    ntouched = 0
    # Timed events: a compute task's finish, the end of a transfer's latency, the finish
    # of a transfer that moves nothing over a link.
    event_t = np.empty(n)
    event_x = np.empty(n, dtype=np.int64)
    nevents = 0
    arriving = np.empty(n, dtype=np.int64)
    narriving = 0
    starting = np.empty(n, dtype=np.int64)
    nstarting = 0
    joining = np.empty(n, dtype=np.int64)
    njoining = 0
    rated_at = 0.0
    next_flow_t = np.inf
    changed = False
    for x in range(n):
        if remaining[x] == 0:
            arriving[narriving] = x
            narriving += 1
    scheduled = 0
    t = 0.0
    while True:
        # Tasks that became ready at ``t`` queue for their server or start.
        for i in range(narriving):
            x = arriving[i]
            ready[x] = t
            s = server[x]
            if s < 0:
                starting[nstarting] = x
                nstarting += 1
                continue
            qsize[s] = _queue_push(store, base[s], qsize[s], x, priority, ready)
            if not marked[s]:
                marked[s] = True
                touched[ntouched] = s
                ntouched += 1
        narriving = 0
        for i in range(ntouched):
            s = touched[i]
            marked[s] = False
            if held[s] or qsize[s] == 0:
                continue
            x = store[base[s]]
            qsize[s] = _queue_pop(store, base[s], qsize[s], priority, ready)
            held[s] = True
            starting[nstarting] = x
            nstarting += 1
        ntouched = 0
        # A starting task runs for its duration, or pays its latency and then flows.
        for i in range(nstarting):
            x = starting[i]
            start[x] = t
            scheduled += 1
            if kind[x] == _COMPUTE:
                busy[device[x]] += duration[x]
                finish[x] = t + duration[x]
                nevents = _heap_push(event_t, event_x, nevents, finish[x], x)
            elif route[x] < 0 or duration[x] <= latency[x]:
                nevents = _heap_push(event_t, event_x, nevents, t + duration[x], x)
            elif latency[x] > 0.0:
                nevents = _heap_push(event_t, event_x, nevents, t + latency[x], x)
            else:
                joining[njoining] = x
                njoining += 1
        nstarting = 0
        if njoining > 0 or changed:
            # Bring the routes' progress up to ``t``, add the new flows, share anew.
            for i in range(nbusy):
                c = busy_routes[i]
                progress[c] += speed[c] * (t - rated_at)
            rated_at = t
            for i in range(njoining):
                x = joining[i]
                c = route[x]
                if nflows[c] == 0:
                    busy_routes[nbusy] = c
                    nbusy += 1
                    progress[c] = 0.0
                    _route_joins(c, first, link_ptr, link_index, links)
                work = duration[x] - latency[x]
                nflows[c] = _heap_push(
                    flow_key[rbase[c] : rbase[c + 1]],
                    flow_x[rbase[c] : rbase[c + 1]],
                    nflows[c],
                    progress[c] + work,
                    x,
                )
                for e in range(link_ptr[x], link_ptr[x + 1]):
                    busy[num_devices + link_index[e]] += link_share[e] * work
                    links.load[link_index[e]] += link_share[e]
            njoining = 0
            changed = False
            _fill(
                busy_routes,
                nbusy,
                first,
                nflows,
                link_ptr,
                link_index,
                link_share,
                speed,
                links,
            )
            next_flow_t = np.inf
            for i in range(nbusy):
                c = busy_routes[i]
                next_done[c] = t + (flow_key[rbase[c]] - progress[c]) / speed[c]
                if next_done[c] < next_flow_t:
                    next_flow_t = next_done[c]
        if nevents == 0 and nbusy == 0:
            break
        t = next_flow_t
        if nevents > 0 and event_t[0] < t:
            t = event_t[0]
        while nevents > 0 and event_t[0] == t:
            x = event_x[0]
            nevents = _heap_pop(event_t, event_x, nevents)
            if kind[x] != _COMPUTE and route[x] >= 0 and duration[x] > latency[x]:
                joining[njoining] = x  # its latency is paid: it starts to flow
                njoining += 1
                continue
            finish[x] = t
            narriving = _release(x, succ_ptr, succ_index, remaining, arriving, narriving)
            ntouched = _free(server[x], held, marked, touched, ntouched)
        if next_flow_t <= t:
            # The routes whose first flows finish now: those flows leave.
            i = 0
            while i < nbusy:
                c = busy_routes[i]
                progress[c] += speed[c] * (t - rated_at)
                if next_done[c] <= t:
                    lo, hi = rbase[c], rbase[c + 1]
                    progress[c] = flow_key[lo]
                    while nflows[c] > 0 and flow_key[lo] <= progress[c]:
                        x = flow_x[lo]
                        finish[x] = t
                        nflows[c] = _heap_pop(flow_key[lo:hi], flow_x[lo:hi], nflows[c])
                        for e in range(link_ptr[x], link_ptr[x + 1]):
                            links.load[link_index[e]] -= link_share[e]
                        narriving = _release(
                            x, succ_ptr, succ_index, remaining, arriving, narriving
                        )
                        ntouched = _free(server[x], held, marked, touched, ntouched)
                    if nflows[c] == 0:
                        _route_leaves(c, first, link_ptr, link_index, links)
                        nbusy -= 1
                        busy_routes[i] = busy_routes[nbusy]
                        continue
                i += 1
            rated_at = t
            changed = True
            next_flow_t = np.inf
    return scheduled


@njit(cache=True)
def schedule(
    kind,
    device,
    duration,
    latency,
    priority,
    link_ptr,
    link_index,
    link_share,
    succ_ptr,
    succ_index,
    num_devices,
    num_links,
    use_priority,
    shared_links,
):
    """Start and finish time of every task, busy seconds per resource, tasks scheduled.

    ``kind`` int8, ``device`` int32, ``duration`` / ``latency`` / ``priority`` /
    ``link_share`` float64, the CSR arrays int32 or int64 as in :class:`TaskGraph`. See the
    module docstring for the rules; ``latency`` and ``link_share`` only matter when
    ``shared_links``.
    """
    n = len(kind)
    remaining = np.zeros(n, dtype=np.int64)
    for k in range(len(succ_index)):
        remaining[succ_index[k]] += 1
    ready = np.zeros(n)
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    busy = np.zeros(num_devices + num_links)
    if shared_links:
        scheduled = _shared(
            kind,
            device,
            duration,
            latency,
            priority if use_priority else np.zeros(n),
            link_ptr,
            link_index,
            link_share,
            succ_ptr,
            succ_index,
            num_devices,
            remaining,
            ready,
            start,
            finish,
            busy,
        )
    elif use_priority:
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
