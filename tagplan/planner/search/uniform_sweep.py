"""The uniform strategies a plan's first tree tries first, in the order of their step
bounds (docs/design.md §7, *The sweep*).

A uniform strategy gives every op group the same action: it is what the tree's root edge
of that action evaluates first, as the rollout gives the groups not decided yet the first
group's action (TAG §4.2.2, footnote 2). On a large heterogeneous allocation the root has
hundreds of edges, and a tree whose unvisited edges score the mean of the visited ones
seldom reaches those deep in the candidate generator's order (which a uniform prior's
ties follow): ResNet-101 on ``scale:128`` steps 20.8 ms with data parallelism over three
of its five A100 machines (the 197th of 224 candidates) and 21.6 ms over all five (the
17th), where Horovod's baseline over all 16 machines steps 42.4 ms, and a plan whose tree
met neither before it converged answered 42.4 ms.

Their step bounds (:meth:`~tagplan.planner.evaluate.Evaluator.step_bound_s`) cost about
a twenty-fifth of a simulation there and rank them well (Spearman 0.95 against the
simulated step over the 224), so :func:`sweep_order` bounds them within a share of the
search's budget and the tree's first iterations take the root's edges in that order
(:meth:`UniformSweep.next`) while one could still win: its bound, scaled by the smallest
ratio of step to bound simulated so far among strategies of its replication option, below
the best step that fits. What the tree learns from them (their rewards at the root, their
children's runtime feedback) is what it would have learned taking those edges itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from tagplan.planner.errors import PlannerError

__all__ = ["UniformSweep", "sweep_order"]


class UniformSweep:
    """Root actions, least step bound first (ties in the candidate generator's order),
    handed out while one could still beat the best step that fits.

    ``kinds[a]`` is the kind of action ``a``, the bounds of one kind alike in tightness
    (the replication option: on small_cnn over ``testbed`` the first parameter server
    swept steps 1.64x its bound, the first AllReduce 1.12x); without ``kinds`` every
    action is of one kind."""

    def __init__(self, bounds_s: dict[int, float], kinds: dict[int, object] | None = None) -> None:
        self.bounds_s = bounds_s
        self.kinds = kinds or {}
        self.order = sorted(bounds_s, key=lambda action: (bounds_s[action], action))
        self.taken: list[int] = []  # root actions handed out so far, in order
        self._position = 0
        self._tightest: dict[object, float] = {}  # kind -> least step / bound simulated

    def next(self, best_s: float | None) -> int | None:
        """The next root action to take, or ``None`` once the sweep is over: along the
        order, the first whose bound scaled by the tightest ratio of step to bound simulated
        for its kind (1 before one: the bound alone, which no strategy beats) is below
        ``best_s``, the best step that fits so far (``None`` before any: the first
        action). An action passed over is not taken later."""
        while self._position < len(self.order):
            action = self.order[self._position]
            self._position += 1
            ratio = self._tightest.get(self.kinds.get(action), 1.0)
            if best_s is None or self.bounds_s[action] * ratio < best_s:
                self.taken.append(action)
                return action
        return None

    def simulated(self, action: int, step_s: float) -> None:
        """Note the simulated step of the swept ``action``'s strategy."""
        bound_s = self.bounds_s[action]
        if bound_s > 0:
            kind = self.kinds.get(action)
            self._tightest[kind] = min(self._tightest.get(kind, math.inf), step_s / bound_s)


def sweep_order(
    bound_s: Callable[[int], float],
    actions: int,
    ends_at: float,
    kinds: dict[int, object] | None = None,
) -> UniformSweep:
    """The sweep over root actions ``0 .. actions - 1`` of ``kinds``, bounding each
    action's uniform strategy with ``bound_s`` in the candidate generator's order until
    ``ends_at`` (a ``time.perf_counter()`` instant); an action the engine refuses is left
    out (the tree meets it as any other)."""
    bounds: dict[int, float] = {}
    for action in range(actions):
        if time.perf_counter() >= ends_at:
            break
        try:
            bounds[action] = bound_s(action)
        except PlannerError:
            continue
    return UniformSweep(bounds, kinds)
