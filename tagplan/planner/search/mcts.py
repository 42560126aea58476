"""Monte-Carlo tree search over op-group decisions (TAG §4.2.2).

A vertex is a partial strategy: decisions for the first ``level`` op groups, taken in
descending compute time; an edge is an :class:`~.actions.Action` for the next group.
Each iteration

1. **selects** from the root the edge of highest PUCT score
   ``U(s, a) = Q(s, a) + c · G(s, a) · sqrt(Σ_a' N(s, a')) / (1 + N(s, a))``
   until it leaves the expanded tree (an unvisited edge scores the mean value of its
   vertex, "first-play urgency", so a uniform prior still explores);
2. **evaluates** the reached vertex with the simulator: the op groups not decided yet take
   the decision of the most expensive group (TAG §4.2.2, footnote 2); the reward is the
   speed-up over the reference strategy (DP-NCCL), or, when a GPU runs out of memory,
   minus the overflow as a fraction of the overflowing GPUs' capacity — worse than any
   plan that fits, and less bad the closer it comes to fitting;
3. **expands** the vertex by one level, asking the :class:`~.prior.Prior` for ``G``
   (above and below a stage layout, its :class:`~.prior.LayoutPrior` part, where it has
   one), with the reached strategy's runtime feedback (a strategy ruled out by its bound,
   below, lends its parent's, or the best strategy's);
4. **backs up** the reward along the path (N and the running mean Q).

A plan's first tree (``sweep``) starts with the uniform strategies, each its root edge's
first visit, least step bound first while one could still win (:mod:`.uniform_sweep`):
on a root of hundreds of edges the best of them may lie deep in the candidate order.

With :class:`~.layout_branches.LayoutBranches` (an allocation of several units) the root
decides the layout first: TAG's per-group decisions as above, or one of the pipeline
layouts, below which the tree decides the micro-batches and each stage's gradient
synchronization (:mod:`.layout_branches`). That root weighs its edges by the **best**
reward found below each, not the mean: its branches are whole families of strategies of
different spread (TAG's tree holds thousands of strategies, most of them poor; a layout
a few dozen, all alike), and what a plan keeps is the best of a branch. An unvisited
layout scores as the reference (reward 1), so the pipelines are tried when TAG's
decisions have not beaten the reference yet or once the exploration term says so. The
pipelines get at most a share of the simulation time while TAG's decisions have a plan
that fits (:meth:`~.layout_branches.LayoutBranches.may_simulate`): past it, the root
holds their edges. A branch of pipelines is not simulated, and its edge is closed, when
the time left cannot simulate any of them or each one's busiest GPU computes no less
than the best step that fits so far (none can win:
:meth:`~.layout_branches.LayoutBranches.least`); a vertex whose edges are all closed
closes its own.

Strategies are evaluated once: many vertices complete to the same strategy (a decision
equal to the inherited one), and those cost a dictionary look-up; different decisions
that place and synchronize every op alike (an op group whose ops follow other groups'
placement, a parameter server or an AllReduce for a group with no gradient) compile to the
same task graph, and a strategy whose compile identity
(:meth:`~tagplan.planner.evaluate.Evaluator.identity`) is one met before takes that one's
score at the cost of a placement (a transposition, counted in ``transposed``). Once a strategy of
TAG's decisions has been simulated, a new one is simulated only if its step bound
(:mod:`~tagplan.planner.step_bound`, a tenth to a third of an evaluation) is below the best
of theirs that fits and the best found before the search (the baselines'); otherwise it
is scored by the bound (its reward scaled by how far this tree's simulated steps were above
their bounds: :meth:`StrategySearch._ruled_out`), and counted in ``bounded`` rather
than ``evaluations``; it is never the search's best. Search stops at an iteration or wall-clock
budget (a strategy of TAG's decisions not simulated yet is not started when the mean of
the tree's simulations so far would end it past the budget: one evaluation of a large
allocation takes seconds), when ``cancel()`` returns true (then
:class:`~tagplan.planner.errors.Cancelled`), or once it has **converged**: with
``patience`` ``p``, when the best strategy found at iteration ``i`` has not been improved
on for ``max(p, i)`` iterations, an iteration ruled out by the bound counting a quarter
(it costs a fraction of a simulation and only says what cannot win: a tree whose bounds
rule out its next strategies goes on searching rather than converging on its first
simulation). The window grows with the tree: a search that needed
``i`` iterations to find its best gets as many again to beat it, so a quick answer on a
small space returns quickly and a slow one is not cut short. With layouts the rule counts
the iterations through TAG's decisions and their best only: the pipelines' branches are
small and close as they are simulated (a whole strategy simulated is closed: visiting it
again tells nothing), and an early pipeline that beats TAG's first strategies must not
shorten the window TAG's decisions get. When every edge is closed the search has seen
every strategy of its tree. The outcome's ``stop_reason`` says which rule ended it.

Once the tree has converged or is exhausted, the search **refines** its best strategy of
TAG's decisions by single-group moves: the incumbent with one op group's action changed,
each group's actions ranked by the prior at the incumbent, the moves going round the op
groups (every group's first-ranked action, then every group's second, ..., the groups
with the most parameter bytes first: their actions move the most traffic), a move kept
as soon as it steps faster (first improvement), until every move of the incumbent has
been tried (a local optimum), the budget ends, or the refinement converges as the tree
does, with a window of its own: it starts when the refinement starts, restarts only at
a move that steps 0.2% faster (moves that shave microseconds off are kept but do not
hold a plan to its budget), and holds at least half the patience. Within the first
quarter of the search's budget it is at first half the tree's iterations and, after a
gain, grows as the tree's does (the single moves that pay on a cheap graph often come
hundreds of moves apart), but holds no more moves than fit in a tenth of the budget at
their mean time (on a large graph a move costs a tenth of a second and a window as long
as the tree's search doubles the plan time, mostly for nothing); past that quarter it
is only its least, so the refinement goes on only while moves keep paying. Each move is
an iteration (counted in ``refined`` too), scored as the tree scores a strategy: looked
up, transposed, ruled out by its step bound, or simulated. Why:
most op groups' actions lie on plateaus (dozens of actions give the same or nearly the
same step), so a tree whose vertices all look alike spreads its visits evenly and seldom
reaches the deep levels, where the small op groups are decided; the best plan often
differs from the tree's in a few of those. Traced on the wide-and-deep model over a
4-machine cluster, the tree converged at 5.08 ms after 204 iterations and kept it through
2,000, while moves from it reached 4.75 ms (4.73 run to a local optimum; docs/design.md §7).

Equal PUCT scores — every unvisited edge under a uniform prior — are broken in the
candidate generator's order (most promising placements first) or, with
``shuffle_ties``, by a generator seeded with ``seed``: TAG's "pure MCTS" of Table 7,
and what makes root-parallel trees (docs/design.md §7) explore differently. Either way a
seed and an iteration budget give the same search every time; :func:`best_outcome`
merges the trees' results.

When every strategy seen runs out of memory, :func:`make_feasible` moves op groups to
model parallelism over every GPU, the group holding the most parameters on an
overflowing GPU first, until the step fits.

Why one module: selection, the closing of edges, expansion and backup read and write the
same vertex statistics and the same score table, and the rules that stop a search
(convergence, exhaustion, the deadline) are read off them in the one loop; split, each
part would reach into the others' state.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from tagplan.planner.errors import BudgetExhausted, Cancelled, InvalidInput, PlannerError
from tagplan.planner.evaluate import Evaluation, Evaluator, relabeled
from tagplan.planner.search.actions import Action, ActionSpace
from tagplan.planner.search.grouping import Grouping
from tagplan.planner.search.layout_branches import LayoutBranches, is_pipelined_key
from tagplan.planner.search.prior import (
    LayoutPrior,
    LayoutQuery,
    Prior,
    PriorQuery,
    SearchContext,
    UniformPrior,
)
from tagplan.planner.search.uniform_sweep import UniformSweep, sweep_order
from tagplan.planner.sim.simulate import SimResult
from tagplan.planner.strategy import OpGroup, Option, Strategy, load_strategy

__all__ = [
    "SearchOutcome",
    "SearchProgress",
    "StrategySearch",
    "best_outcome",
    "make_feasible",
]

DEFAULT_C_PUCT = 1.5
# a step time counts as an improvement when it is shorter by more than this fraction
_IMPROVEMENT = 1e-6
# ... and restarts the refinement's window when shorter by at least this fraction: single
# moves often shave a few microseconds off, which must not hold a plan to its budget
_REFINEMENT_IMPROVEMENT = 2e-3
# ... and its window grows as the tree's only within this share of the search's budget:
# past it, the refinement goes on only while moves keep paying (module docstring)
_REFINEMENT_LONG_SHARE = 0.25
# ... and no longer than the moves that fit in this share of the budget at the refinement's
# mean move time: a long window of moves that cost a tenth of a second each would double a
# plan's time, where the same window of millisecond moves costs a fraction of a second
_REFINEMENT_WINDOW_SHARE = 0.1
# the share of the search's budget the sweep's step bounds may take (module docstring)
_SWEEP_BOUND_SHARE = 0.1
_REJECTED_REWARD = -1e3  # a strategy the engine refused: never preferred
_REFERENCE_REWARD = 1.0  # a strategy as fast as the reference
# what a strategy ruled out by its step bound counts for in the convergence window, against
# a simulated one: its bound costs a tenth to a third of a simulation and tells only that
# it cannot win, so a tree whose bounds rule out its next strategies goes on searching
_RULED_OUT_ITERATION = 0.25


@dataclass(frozen=True)
class SearchProgress:
    iterations: int
    evaluations: int
    best_step_time_s: float | None  # best that fits in memory so far
    best_speedup: float | None  # over the reference strategy
    elapsed_s: float


@dataclass(frozen=True)
class SearchOutcome:
    """The best strategy one tree found, in a form that travels as JSON between workers."""

    seed: int
    # action index of every op group (by group id), or a pipelined key (layout_branches)
    actions: tuple[int, ...]
    strategy_json: str
    step_time_s: float
    oom: bool
    overflow_bytes: int
    iterations: int
    evaluations: int
    rejected: int  # strategies the engine refused (each one is a bug to look at)
    first_better_iteration: int | None  # first iteration that beat the reference
    elapsed_s: float
    # "budget", "iterations", "converged", "exhausted", "target", "skipped"
    stop_reason: str = "budget"
    bounded: int = 0  # strategies not simulated: their step bound could not win
    transposed: int = 0  # strategies not simulated: they compile as one simulated before
    refined: int = 0  # iterations spent on single-group moves from the best (refinement)
    swept: int = 0  # iterations the sweep of uniform strategies chose (uniform_sweep)

    @property
    def strategy(self) -> Strategy:
        return load_strategy(self.strategy_json)

    @property
    def pipelined(self) -> bool:
        return is_pipelined_key(self.actions)

    @classmethod
    def skipped(cls, seed: int) -> SearchOutcome:
        """A tree that did not run (no time was left for it): no iterations, no strategy."""
        return cls(
            seed=seed,
            actions=(),
            strategy_json="",
            step_time_s=0.0,  # no step: the outcome is never merged (JSON has no infinity)
            oom=True,
            overflow_bytes=0,
            iterations=0,
            evaluations=0,
            rejected=0,
            first_better_iteration=None,
            elapsed_s=0.0,
            stop_reason="skipped",
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SearchOutcome:
        return cls(**{**data, "actions": tuple(data["actions"])})


def best_outcome(outcomes: Sequence[SearchOutcome]) -> SearchOutcome:
    """Root-parallel merge: the fastest plan that fits, else the smallest overflow."""
    if not outcomes:
        raise InvalidInput("no search outcomes to merge")
    return min(outcomes, key=lambda o: (o.oom, o.overflow_bytes, o.step_time_s, o.seed))


@dataclass(frozen=True)
class _Scored:
    step_time_s: float
    oom: bool
    overflow_bytes: int
    reward: float
    feedback: SimResult | None  # without per-task times: the cache holds many
    # not simulated: its step bound is no less than the best step found (the step is the
    # bound, a lower bound; the reward the bound's scaled, StrategySearch._ruled_out)
    bounded: bool = False
    bound_s: float | None = None  # simulated: the step bound it passed first, if any
    # the strategy (key) this one compiles identically to, whose score it took
    same_as: tuple[int, ...] | None = None


_NO_TASKS = np.zeros(0)


class _BoundPayoff:
    """Whether a strategy's step bound is worth computing: the chance that it rules the
    strategy out (over the last :attr:`WINDOW` bounds, Laplace-smoothed) times a
    simulation's mean time, against the bound's own mean time (on 64 GPUs a bound costs
    a tenth to a third of an evaluation, and where the best is hard to beat it seldom
    rules anything out). Each bound is judged against the best step of its time, so a
    new best forgets the outcomes (:meth:`forget`), and every :attr:`RETRY`-th strategy
    it would skip is bounded anyway. Only a search bounded by time alone weighs it: the
    times differ from run to run, and a seed and an iteration budget give the same
    search every time."""

    WINDOW = 16
    RETRY = 8

    def __init__(self) -> None:
        self.outcomes: deque[bool] = deque(maxlen=self.WINDOW)
        self.seconds = 0.0
        self.bounds = 0
        self.skipped = 0

    def worth(self, simulation_s: float) -> bool:
        """Whether to bound a strategy whose simulation would take ``simulation_s``."""
        if not self.bounds:
            return True
        chance = (sum(self.outcomes) + 1) / (len(self.outcomes) + 2)
        if chance * simulation_s >= self.seconds / self.bounds:
            return True
        self.skipped += 1
        return self.skipped % self.RETRY == 0

    def forget(self) -> None:
        self.outcomes.clear()

    def record(self, ruled_out: bool, seconds: float) -> None:
        self.outcomes.append(ruled_out)
        self.seconds += seconds
        self.bounds += 1


class _Vertex:
    """Edge statistics of one expanded vertex: visits N, reward sums W, the best reward
    below each edge, prior G, and the edges closed (not worth simulating). ``by_best``:
    edges are valued by their best reward, unvisited ones as the reference (the layout
    root, module docstring); otherwise by their mean, unvisited ones by the vertex's."""

    __slots__ = (
        "best",
        "by_best",
        "children",
        "closed",
        "prior",
        "query",
        "reward_sum",
        "tie_break",
        "visits",
    )

    def __init__(
        self,
        prior: np.ndarray,
        tie_break: np.ndarray,
        query: PriorQuery | LayoutQuery | None = None,
        *,
        by_best: bool = False,
    ) -> None:
        self.prior, self.query, self.by_best = prior, query, by_best
        self.visits = np.zeros(len(prior), dtype=np.int64)
        self.reward_sum = np.zeros(len(prior))
        self.best = np.full(len(prior), -np.inf)
        self.children: dict[int, _Vertex] = {}
        self.tie_break = tie_break
        self.closed = np.zeros(len(prior), dtype=bool)

    def select(self, c_puct: float, held: np.ndarray | None = None) -> int:
        """The edge of highest score among those neither closed nor ``held``."""
        total = self.visits.sum()
        if self.by_best:  # on the scale of the best reward so far, as the prior's term is
            scale = max(float(self.best.max()), _REFERENCE_REWARD)
            q = np.where(self.visits > 0, self.best, _REFERENCE_REWARD) / scale
        else:
            mean = self.reward_sum.sum() / total if total else 0.0
            q = np.where(self.visits > 0, self.reward_sum / np.maximum(self.visits, 1), mean)
        u = q + c_puct * self.prior * math.sqrt(max(total, 1)) / (1 + self.visits)
        barred = self.closed if held is None else self.closed | held
        return int(np.argmax(np.where(barred, -np.inf, u + self.tie_break)))


class StrategySearch:
    """MCTS for one graph on one cluster (module docstring).

    ``reference_step_s`` is the step time of the reference strategy (DP-NCCL) that
    rewards are measured against. ``bar_s``, the best step that fits found before the
    search (the baselines'), rules out a strategy whose step bound is no less once the
    tree has simulated its first (a plan answers the faster of the two). ``scores`` (a
    dict) lets searches over the same evaluator, groups, actions and reference share what
    they simulated; their ``evaluations`` then count the shared strategies. ``layouts``
    puts pipelines in the tree (module docstring). ``sweep`` starts the tree with the
    uniform strategies in the order of their step bounds (:mod:`.uniform_sweep`).
    """

    def __init__(
        self,
        evaluator: Evaluator,
        grouping: Grouping,
        space: ActionSpace,
        *,
        reference_step_s: float,
        prior: Prior | None = None,
        seed: int = 0,
        c_puct: float = DEFAULT_C_PUCT,
        shuffle_ties: bool = False,
        name: str = "tagplan",
        scores: dict | None = None,
        layouts: LayoutBranches | None = None,
        bar_s: float | None = None,
        sweep: bool = False,
    ) -> None:
        self.evaluator, self.grouping, self.space = evaluator, grouping, space
        self.bar_s = bar_s
        self.sweep = sweep
        self.layouts = layouts
        self.reference_step_s = reference_step_s
        self.prior = prior or UniformPrior()
        self.seed, self.c_puct, self.name = seed, c_puct, name
        self.shuffle_ties = shuffle_ties
        self.context = SearchContext(grouping, space, reference_step_s)
        self.order = self.context.decision_order()
        self._root: _Vertex | None = None
        ir = evaluator.ir
        self._group_ops = [
            [ir.op_names[o] for o in grouping.ops(g)] for g in range(grouping.num_groups)
        ]
        self._scores: dict[tuple[int, ...], _Scored] = {} if scores is None else scores
        # strategies ruled out by their step bound, by key: this tree's own (another tree
        # sharing ``scores`` may have a slower best)
        self._bounded: dict[tuple[int, ...], _Scored] = {}
        self._passed: dict[tuple[int, ...], float] = {}  # bounds of strategies then simulated
        self._swept_bounds: dict[tuple[int, ...], float] = {}  # the sweep's, by key
        # simulated step over bound of each simulated strategy this tree met that passed a
        # bound first (in the shared scores, as another tree may have simulated it)
        self._step_over_bound: list[float] = []
        self._met: set[tuple[int, ...]] = set()
        # compile identity (Evaluator.identity) -> the first key met with it
        self._identities: dict[bytes, tuple[int, ...]] = {}
        self._twin_maps: dict[tuple[int, ...], np.ndarray | None] = {}  # of the firsts
        self._payoff = _BoundPayoff()
        self._timed = False  # whether the run in progress weighs bounds by their time
        self._rng = np.random.default_rng(seed)
        self.rejected = 0
        self._simulations = 0  # TAG's strategies simulated
        self._last_strategy: tuple[tuple[int, ...], Strategy] | None = None
        self._simulation_s = 0.0  # and the seconds they took

    # strategies -------------------------------------------------------------------------

    def complete(self, decided: Sequence[int]) -> tuple[int, ...]:
        """The action of every op group (by group id) for a partial decision list: undecided
        groups inherit the most expensive group's action."""
        full = [decided[0]] * self.grouping.num_groups
        for position, action in enumerate(decided):
            full[int(self.order[position])] = action
        return tuple(full)

    def strategy_of(self, key: tuple[int, ...]) -> Strategy:
        """The strategy giving op group ``g`` the action ``key[g]``, or the pipelined
        strategy of a pipelined key; the same object for the same key twice in a row (the
        evaluator then places it once for its bound and its simulation,
        :meth:`~tagplan.planner.evaluate.Evaluator.placed`)."""
        if self._last_strategy is not None and self._last_strategy[0] == key:
            return self._last_strategy[1]
        strategy = self._strategy_of(key)
        self._last_strategy = (key, strategy)
        return strategy

    def _strategy_of(self, key: tuple[int, ...]) -> Strategy:
        if is_pipelined_key(key):
            if self.layouts is None:
                raise InvalidInput("a pipelined key in a search without layouts")
            return self.layouts.strategy(key)
        actions = self.space.actions
        groups = [
            OpGroup(ops=ops, decision=self.space.decision(actions[a]))
            for ops, a in zip(self._group_ops, key, strict=True)
        ]
        return Strategy(name=self.name, groups=groups)

    def score(self, key: tuple[int, ...]) -> _Scored:
        """Simulate the strategy of ``key`` once; later calls hit the cache (or what ruled
        it out, :meth:`_ruled_out`)."""
        found = self._scored(key)
        if found is None:
            started = time.perf_counter()
            found = self._scores[key] = replace(
                self._simulate(key), bound_s=self._passed.pop(key, None)
            )
            if not is_pipelined_key(key):
                self._simulations += 1
                self._simulation_s += time.perf_counter() - started
        return found

    def _scored(self, key: tuple[int, ...]) -> _Scored | None:
        """What is known of ``key``: its simulation, or the bound that ruled it out."""
        found = self._scores.get(key)
        return self._bounded.get(key) if found is None else found

    def _transposed(self, key: tuple[int, ...]) -> _Scored | None:
        """The score of a strategy of TAG's decisions this tree met before whose task
        graph ``key``'s strategy compiles to as well (the same
        :meth:`~tagplan.planner.evaluate.Evaluator.identity`: decisions that place and
        synchronize alike, such as two actions for an op group whose ops follow other
        groups' placement, or alike on twin machines), kept under ``key`` too: it would
        simulate to the same step and memory, and its bound is that one's; its runtime
        feedback moved onto ``key``'s GPUs (:func:`~tagplan.planner.evaluate.relabeled`).
        ``None`` where no strategy met before compiles alike, or that one has no score
        yet."""
        if is_pipelined_key(key):
            return None
        strategy = self.strategy_of(key)
        try:
            identity = self.evaluator.identity(strategy)
        except PlannerError:
            return None  # the simulation refuses it and says why
        twin_map = self.evaluator.twin_map(strategy)
        same = self._identities.setdefault(identity, key)
        if same == key:
            self._twin_maps[key] = twin_map
            return None
        found = self._scored(same)
        if found is None:
            return None
        feedback = found.feedback
        if feedback is not None:  # its GPUs where this strategy has them
            source = self._twin_maps[same]
            feedback = relabeled(feedback, source, twin_map, self.evaluator.cluster)
        found = replace(found, same_as=same, feedback=feedback)
        if found.bounded:
            self._bounded[key] = found
        else:
            self._scores[key] = found
        return found

    def _ruled_out(self, key: tuple[int, ...], beat_s: float) -> _Scored | None:
        """The score of a strategy of TAG's decisions whose step bound
        (:meth:`~tagplan.planner.evaluate.Evaluator.step_bound_s`: compute, the bytes that
        must reach each GPU and machine, the longest chain; a tenth to a third of an
        evaluation) is at least ``beat_s``: it cannot be the plan, so it is not simulated.
        Its reward is that of the bound scaled by the median ratio of simulated step to
        bound among the simulated strategies this tree has met that passed a bound first
        (:meth:`_meet`; the bound alone until there is one): a bound is often half the step
        or less, and a reward of the bound
        alone would draw the tree back to regions it has ruled out, where it spends its
        convergence window. ``None`` when the bound leaves it a chance. A search under a
        time budget that finds the whole bound not worth computing
        (:class:`_BoundPayoff`) checks the busiest GPU's compute alone
        (:meth:`~tagplan.planner.evaluate.Evaluator.compute_bound_s`, from the placement's
        instance times: a strategy that computes an op group whole on every GPU is ruled
        out by it)."""
        if is_pipelined_key(key):
            return None
        mean_s = self._simulation_s / self._simulations if self._simulations else 0.0
        bound_s = self._swept_bounds.get(key)
        try:
            if bound_s is None and self._timed and not self._payoff.worth(mean_s):
                bound_s = self.evaluator.compute_bound_s(self.strategy_of(key))
                if bound_s < beat_s:
                    return None
            else:
                if bound_s is None:
                    started = time.perf_counter()
                    bound_s = self.evaluator.step_bound_s(self.strategy_of(key))
                    if math.isfinite(beat_s):  # the tree's first is bounded for the ratio only
                        self._payoff.record(bound_s >= beat_s, time.perf_counter() - started)
                if bound_s < beat_s:
                    self._passed[key] = bound_s
                    return None
        except PlannerError:
            return None  # the simulation refuses it and says why
        ratios = self._step_over_bound
        estimate_s = bound_s * (float(np.median(ratios)) if ratios else 1.0)
        reward = self.reference_step_s / max(estimate_s, 1e-12)
        found = self._bounded[key] = _Scored(bound_s, False, 0, reward, None, bounded=True)
        return found

    def _meet(self, key: tuple[int, ...], scored: _Scored) -> None:
        """Note the ratio of step to bound of a simulated strategy the tree meets for the
        first time, whichever tree simulated it, so that the same walk scales ruled-out
        rewards alike."""
        if scored.bounded or scored.same_as is not None or key in self._met:
            return
        self._met.add(key)
        if scored.bound_s and not scored.oom:
            self._step_over_bound.append(scored.step_time_s / scored.bound_s)

    def _would_overrun(self, key: tuple[int, ...], deadline: float) -> bool:
        """Whether simulating ``key`` (of TAG's decisions, not simulated yet) for as long
        as the tree's simulations took on average would end past ``deadline``."""
        if not self._simulations or is_pipelined_key(key):
            return False
        return time.perf_counter() + self._simulation_s / self._simulations > deadline

    def _simulate(self, key: tuple[int, ...]) -> _Scored:
        try:
            result = self.evaluator.evaluate(self.strategy_of(key)).result
        except PlannerError:
            self.rejected += 1
            return _Scored(math.inf, True, 0, _REJECTED_REWARD, None)
        overflow = int(result.overflow_bytes.sum())
        if result.oom:
            over = result.overflow_bytes > 0
            capacity = float(self.evaluator.cluster.device_memory_bytes[over].sum())
            reward = -overflow / max(capacity, 1.0)
        else:
            reward = self.reference_step_s / max(result.step_time_s, 1e-12)
        slim = replace(result, start_s=_NO_TASKS, finish_s=_NO_TASKS)
        return _Scored(result.step_time_s, bool(result.oom), overflow, reward, slim)

    def _depth(self, path: Sequence[int]) -> int:
        """The edges from the root to a leaf of the branch ``path`` (non-empty) is in."""
        if self.layouts is None:
            return self.grouping.num_groups
        if path[0] == 0:
            return 1 + self.grouping.num_groups
        return 1 + len(self.layouts.level_sizes(path[0] - 1))

    def _key(self, path: Sequence[int]) -> tuple[int, ...]:
        """The strategy a vertex reached by ``path`` stands for (its levels completed)."""
        if self.layouts is None:
            return self.complete(path)
        if path[0] == 0:
            return self.complete(path[1:] or [0])
        return self.layouts.key(path[0] - 1, path[1:])

    def _expand(self, path: tuple[int, ...], feedback: SimResult | None) -> _Vertex:
        """The vertex ``path`` reaches, with its prior: the layouts' at the root (when there
        are any) and below a layout (:meth:`_layout_prior`), the prior's probabilities for
        TAG's decisions."""
        query = None
        root = self.layouts is not None and not path
        if self.layouts is not None and (root or path[0] > 0):
            query = LayoutQuery(self.context, self.layouts, path)
            prior = self._layout_prior(query)
        else:
            decided = path[1:] if self.layouts is not None else path
            query = PriorQuery(
                context=self.context,
                order=self.order,
                level=len(decided),
                decided=decided,
                actions=self.space.actions,
                feedback=feedback if decided else None,
            )
            prior = self._probabilities(query)
        n = len(prior)
        ties = self._rng.random(n) if self.shuffle_ties else -np.arange(n) / n
        return _Vertex(prior, ties * 1e-9, query, by_best=root)

    def _probabilities(self, query: PriorQuery) -> np.ndarray:
        """The prior's probabilities for ``query``, checked: one per candidate action."""
        prior = np.asarray(self.prior.probabilities(query), dtype=np.float64)
        if prior.shape != (len(self.space),) or not np.isclose(prior.sum(), 1.0):
            raise InvalidInput("a prior must give one probability per action, summing to 1")
        return prior

    def _moves(self, incumbent: Callable[[], tuple[int, ...]]) -> Iterator[tuple[int, ...]]:
        """The refinement's strategies (module docstring): the incumbent with one op group's
        action changed. Each op group ranks its actions as the prior sees the incumbent
        (ties in the candidate generator's order); the moves go round the op groups, the
        most parameter bytes first (ties in the tree's decision order), each one's
        first-ranked action, then each one's second, and so on, strategies already known
        left out. The rankings are taken again at the start of the round
        after a move was kept (a GNN prior costs milliseconds a group). It ends once
        every move of the incumbent has been tried without it changing."""
        groups = self.grouping.num_groups
        moves = groups * len(self.space)
        params = self.grouping.group_param_bytes[self.order]
        levels = np.lexsort((np.arange(groups), -params)).tolist()  # most parameters first
        current, since, stale = incumbent(), 0, False
        rankings: dict[int, list[int]] = {}
        for position in itertools.count():
            if incumbent() != current:  # a move was kept: every move is new again
                current, since, stale = incumbent(), 0, True
            rank, turn = divmod(position % moves, groups)
            level = levels[turn]
            if stale and turn == 0:  # ranked again once per round, not at every move kept
                rankings.clear()
                since, stale = 0, False
            if since == moves:
                return
            since += 1
            if level not in rankings:
                rankings[level] = self._move_order(current, level).tolist()
            group = int(self.order[level])
            action = rankings[level][rank]
            key = (*current[:group], action, *current[group + 1 :])
            if action != current[group] and self._scored(key) is None:
                yield key

    def _move_order(self, key: tuple[int, ...], level: int) -> np.ndarray:
        """The candidate actions of the op group decided at ``level``, most probable first
        as the prior sees the strategy ``key`` decided up to that level."""
        query = PriorQuery(
            context=self.context,
            order=self.order,
            level=level,
            decided=tuple(int(key[g]) for g in self.order[:level]),
            actions=self.space.actions,
            feedback=self._scored(key).feedback,
        )
        prior = self._probabilities(query)
        return np.lexsort((np.arange(len(prior)), -prior))

    def _layout_prior(self, query: LayoutQuery) -> np.ndarray:
        """The prior of a vertex of the pipelined part of the tree: the search's prior
        where it has an opinion there, the layouts' own otherwise."""
        if isinstance(self.prior, LayoutPrior):
            learned = self.prior.layout_probabilities(query)
            if learned is not None:
                count = query.branches.choices(query.path)
                learned = np.asarray(learned, dtype=np.float64)
                if learned.shape != (count,) or not np.isclose(learned.sum(), 1.0):
                    raise InvalidInput(
                        "a layout prior must give one probability per candidate, summing to 1"
                    )
                return learned
        return query.branches.prior(query.path)

    def _not_worth_simulating(
        self,
        path: Sequence[int],
        key: tuple[int, ...],
        deadline: float,
        best_key: tuple[int, ...] | None,
    ) -> bool:
        """Whether the pipelines below ``path`` (the strategy ``key`` stands for among
        them, not simulated yet) all end after ``deadline`` or are all bounded at no less
        than the best step that fits so far: their branch cannot give the plan."""
        if self.layouts is None or not is_pipelined_key(key) or key in self._scores:
            return False
        bound_s, cost_s = self.layouts.least(path[0] - 1, path[1:])
        if time.perf_counter() + cost_s > deadline:
            return True
        best = None if best_key is None else self._scored(best_key)
        return best is not None and not best.oom and bound_s >= best.step_time_s

    def _pipelines_may_run(
        self, spent_s: dict[bool, float], flat_best: tuple[int, ...] | None
    ) -> bool:
        """Within the pipelines' share of the simulation time, or nothing of TAG's fits."""
        assert self.layouts is not None
        if flat_best is None or self._scored(flat_best).oom:
            return True
        return self.layouts.may_simulate(spent_s[True], spent_s[False])

    @staticmethod
    def _close(path: Sequence[tuple[_Vertex, int]]) -> None:
        """Close the last edge of ``path``, and each edge above whose vertex is closed."""
        for vertex, edge in reversed(path):
            vertex.closed[edge] = True
            if not vertex.closed.all():
                return

    def visit_targets(self, min_visits: int) -> list[tuple[PriorQuery | LayoutQuery, np.ndarray]]:
        """The training targets of TAG §4.2.2 from the last :meth:`run`: at every vertex
        whose edges were visited at least ``min_visits`` times in all, the query the prior
        was asked there (a :class:`~.prior.LayoutQuery` above and below the layouts) and
        the visit distribution ``π(a) = N(s, a) / Σ N(s, ·)``. Vertices in depth-first
        order, children by action index, so a seed gives the same list."""
        targets: list[tuple[PriorQuery | LayoutQuery, np.ndarray]] = []
        stack = [] if self._root is None else [self._root]
        while stack:
            vertex = stack.pop()
            total = int(vertex.visits.sum())
            if total >= min_visits and vertex.query is not None:
                targets.append((vertex.query, vertex.visits / total))
            stack.extend(vertex.children[a] for a in sorted(vertex.children, reverse=True))
        return targets

    # the search ---------------------------------------------------------------------------

    def run(
        self,
        *,
        iterations: int | None = None,
        budget_s: float | None = None,
        stop_below_s: float | None = None,
        patience: int | None = None,
        progress: Callable[[SearchProgress], None] | None = None,
        cancel: Callable[[], bool] | None = None,
        start: Sequence[int] | None = None,
    ) -> SearchOutcome:
        """Search until ``iterations`` or ``budget_s`` runs out (at least one is required),
        a strategy that fits steps faster than ``stop_below_s``, or the search has
        converged with ``patience`` (module docstring; ``None``: never).

        ``start`` (an action per op group, by group id: a warm start) is the first
        iteration and the first incumbent: the search never returns anything worse, and
        since the start leaves the tree as it was, the iterations after it are those of a
        cold search — a warm start reaches any step a cold search reaches one iteration
        later at most, and at once when the start is that good."""
        if iterations is None and budget_s is None:
            raise InvalidInput("give an iteration or a time budget")
        if patience is not None and patience < 1:
            raise InvalidInput(f"patience must be at least 1, got {patience}")
        start_key = None if start is None else tuple(int(a) for a in start)
        if start_key is not None and (
            len(start_key) != self.grouping.num_groups
            or not all(0 <= a < len(self.space) for a in start_key)
        ):
            raise InvalidInput(
                f"a start needs one action (of {len(self.space)}) per op group "
                f"({self.grouping.num_groups}), got {start_key}"
            )
        started = time.perf_counter()
        deadline = started + budget_s if budget_s is not None else math.inf
        long_until = started + _REFINEMENT_LONG_SHARE * (deadline - started)
        self._timed = iterations is None  # an iteration budget gives the same search
        root = self._root = self._expand((), None)
        if self.layouts is not None:  # TAG's decisions start as a tree without layouts does
            root.children[0] = self._expand((0,), None)
        best_key: tuple[int, ...] | None = None
        first_better: int | None = None
        done = improved_at = flat_done = refined_from = 0  # flat: through TAG's decisions
        flat_best: tuple[int, ...] | None = None
        cut_s = 0.0 if self.layouts is None else self.layouts.cut_s
        spent_s = {True: cut_s, False: 0.0}  # estimated seconds: the pipelines', TAG's
        held = np.arange(len(root.prior)) > 0  # the layouts, while over their share
        stop_reason = "budget"
        moves: Iterator[tuple[int, ...]] | None = None  # the refinement, once it starts
        settled: str | None = None  # why the tree stopped: the refinement then starts
        refined = 0
        refine_started = math.inf
        sweep = self._sweep(started, deadline) if self.sweep else None
        while True:
            if iterations is not None and done >= iterations:
                stop_reason = "iterations"
                break
            if time.perf_counter() >= deadline:
                break
            if cancel is not None and cancel():
                raise Cancelled("planning was cancelled")
            if settled is None and root.closed.all():
                settled = "exhausted"
            if settled is not None and moves is None:
                if flat_best is None:
                    stop_reason = settled
                    break
                moves = self._moves(lambda: flat_best)  # noqa: B023 (the incumbent as it moves)
                improved_at = refined_from = flat_done  # the refinement's window is its own
                refine_started = time.perf_counter()
            path: list[tuple[_Vertex, int]] = []
            decided: list[int] = []
            child: _Vertex | None = root  # a move or the start leaves the tree as it was
            starting = start_key is not None and done == 0
            sweeping = False
            if starting:
                key = start_key
                scored = self.score(key)
            elif moves is not None:
                key = next(moves, None)
                if key is None:
                    stop_reason = settled
                    break
            elif sweep is not None and (action := sweep.next(self._beat_s(flat_best))) is not None:
                sweeping = True
                vertex = root if self.layouts is None else root.children[0]
                path = [(vertex, action)] if self.layouts is None else [(root, 0), (vertex, action)]
                decided = [edge for _, edge in path]
                child = vertex.children.get(action)
                key = self._key(decided)
            else:
                vertex = root
                hold = (
                    self.layouts is not None
                    and not root.closed[0]
                    and not self._pipelines_may_run(spent_s, flat_best)
                )
                while True:
                    action = vertex.select(self.c_puct, held if hold and vertex is root else None)
                    path.append((vertex, action))
                    decided.append(action)
                    child = vertex.children.get(action)
                    if child is None or len(decided) == self._depth(decided):
                        break
                    vertex = child
                key = self._key(decided)
                if self._not_worth_simulating(decided, key, deadline, best_key):
                    self._close(path)
                    continue
            if not starting:
                beat_s = self._beat_s(flat_best)
                known = self._scored(key) or self._transposed(key)
                if known is None:  # the first is bounded too, for the ratios of step to bound
                    known = self._ruled_out(key, math.inf if beat_s is None else beat_s)
                if known is None and best_key is not None and self._would_overrun(key, deadline):
                    break
                if self.layouts is not None and known is None:
                    spent_s[is_pipelined_key(key)] += self.layouts.cost_s(key)
                scored = known or self.score(key)
                self._meet(key, scored)
                refined += moves is not None
                if sweeping and not (scored.bounded or scored.oom):
                    sweep.simulated(action, scored.step_time_s)
            if child is None and len(decided) < self._depth(decided):
                feedback = scored.feedback
                if scored.bounded:
                    feedback = self._stand_in_feedback(vertex, flat_best)
                vertex.children[action] = self._expand(tuple(decided), feedback)
            for node, edge in path:
                node.visits[edge] += 1
                node.reward_sum[edge] += scored.reward
                node.best[edge] = max(node.best[edge], scored.reward)
            if decided and len(decided) == self._depth(decided):
                self._close(path)  # a whole strategy, simulated: visiting again tells nothing
            done += 1
            simulated = not scored.bounded  # a bound is never the best: it only rules out
            if not is_pipelined_key(key):
                flat_done += 1 if simulated else _RULED_OUT_ITERATION
                by = _IMPROVEMENT if moves is None else _REFINEMENT_IMPROVEMENT
                if simulated and (flat_best is None or self._improves(key, flat_best, by)):
                    improved_at = flat_done
                    self._payoff.forget()
                if simulated and (flat_best is None or self._better(key, flat_best)):
                    flat_best = key
            if simulated and (best_key is None or self._better(key, best_key)):
                best_key = key
            if (
                first_better is None
                and simulated
                and not scored.oom
                and scored.step_time_s < self.reference_step_s
            ):
                first_better = done
            if progress is not None:
                progress(self._progress(done, best_key, started))
            if stop_below_s is not None and not scored.oom and scored.step_time_s < stop_below_s:
                stop_reason = "target"
                break
            if moves is None:
                window = self._window(patience, improved_at, None, long_until, math.inf)
            else:
                fit = self._moves_fit(deadline - started, refine_started, refined)
                window = self._window(patience, improved_at, refined_from, long_until, fit)
            converged = flat_done - improved_at >= window
            if patience is not None and converged:
                if moves is not None:
                    stop_reason = settled
                    break
                settled = "converged"
        if best_key is None:
            raise BudgetExhausted("the budget allowed no search iteration")
        best = self._scores[best_key]
        return SearchOutcome(
            seed=self.seed,
            actions=best_key,
            strategy_json=self.strategy_of(best_key).to_json(),
            step_time_s=best.step_time_s,
            oom=best.oom,
            overflow_bytes=best.overflow_bytes,
            iterations=done,
            evaluations=sum(s.same_as is None for s in self._scores.values()),
            rejected=self.rejected,
            first_better_iteration=first_better,
            elapsed_s=time.perf_counter() - started,
            stop_reason=stop_reason,
            bounded=sum(s.same_as is None for s in self._bounded.values()),
            transposed=sum(
                s.same_as is not None for s in (*self._scores.values(), *self._bounded.values())
            ),
            refined=refined,
            swept=0 if sweep is None else len(sweep.taken),
        )

    def _improves(
        self, key: tuple[int, ...], than: tuple[int, ...], by: float = _IMPROVEMENT
    ) -> bool:
        """``key`` is better than ``than`` by more than rounding: it fits where ``than``
        does not, overflows less, or steps faster by more than the fraction ``by``."""
        a, b = self._scored(key), self._scored(than)
        if a.oom or b.oom:
            return (a.oom, a.overflow_bytes) < (b.oom, b.overflow_bytes)
        return a.step_time_s < b.step_time_s * (1 - by)

    def _better(self, key: tuple[int, ...], than: tuple[int, ...]) -> bool:
        a, b = self._scored(key), self._scored(than)
        return (a.oom, a.overflow_bytes, a.step_time_s) < (b.oom, b.overflow_bytes, b.step_time_s)

    def _stand_in_feedback(
        self, parent: _Vertex, flat_best: tuple[int, ...] | None
    ) -> SimResult | None:
        """The runtime feedback a vertex whose strategy was ruled out is expanded with (the
        prior's features describe a simulation): its parent's, else that of the best
        strategy simulated so far, which ruled it out."""
        if isinstance(parent.query, PriorQuery) and parent.query.feedback is not None:
            return parent.query.feedback
        best = None if flat_best is None else self._scored(flat_best)
        return None if best is None else best.feedback

    def _beat_s(self, flat_best: tuple[int, ...] | None) -> float | None:
        """The step a strategy of TAG's decisions must beat to be simulated, once one of
        theirs has been (the tree's first is simulated, so that its outcome has a best):
        the faster of the best of theirs that fits (the bar their convergence is judged
        by) and ``bar_s``."""
        if flat_best is None:
            return None
        best = self._scores[flat_best]
        bars = [best.step_time_s] if not best.oom else []
        bars += [self.bar_s] if self.bar_s is not None else []
        return min(bars, default=None)

    def _window(
        self,
        patience: int | None,
        improved_at: float,
        refined_from: float | None,
        long_until: float,
        moves_fit: float,
    ) -> float:
        """The convergence window after the last improvement at ``improved_at`` (module
        docstring): the tree's grows with it; the refinement's (from ``refined_from``)
        holds at least half the patience, at first half the tree's iterations, after a
        gain as many as before it, but no more than ``moves_fit``, and past the long share
        of the budget no more than its least."""
        if refined_from is None:
            return max(patience or 0, improved_at)
        least = max((patience or 0) // 2, 1)
        if time.perf_counter() >= long_until:
            return least
        long = refined_from / 2 if improved_at == refined_from else improved_at
        return max(least, min(long, moves_fit))

    def _sweep(self, started: float, deadline: float) -> UniformSweep:
        """The sweep of the uniform strategies (:mod:`.uniform_sweep`), their step bounds
        computed within :data:`_SWEEP_BOUND_SHARE` of the budget (all of them without one)
        and kept for :meth:`_ruled_out`."""
        groups = self.grouping.num_groups

        def bound_s(action: int) -> float:
            return self.evaluator.step_bound_s(self.strategy_of((action,) * groups))

        ends_at = started + _SWEEP_BOUND_SHARE * (deadline - started)
        options = {a: action.option for a, action in enumerate(self.space.actions)}
        sweep = sweep_order(bound_s, len(self.space), ends_at, options)
        self._swept_bounds = {(a,) * groups: b for a, b in sweep.bounds_s.items()}
        return sweep

    def _moves_fit(self, budget_s: float, refine_started: float, refined: int) -> float:
        """How many refinement moves fit in its window's share of ``budget_s`` at the mean
        time of its moves so far (before the first, of the tree's simulations)."""
        if refined:
            move_s = (time.perf_counter() - refine_started) / refined
        else:
            move_s = self._simulation_s / self._simulations if self._simulations else 0.0
        return _REFINEMENT_WINDOW_SHARE * budget_s / move_s if move_s > 0 else math.inf

    def _progress(self, done: int, best_key: tuple[int, ...], started: float) -> SearchProgress:
        best = self._scores[best_key]
        fits = not best.oom
        return SearchProgress(
            iterations=done,
            evaluations=len(self._scores),
            best_step_time_s=best.step_time_s if fits else None,
            best_speedup=self.reference_step_s / best.step_time_s if fits else None,
            elapsed_s=time.perf_counter() - started,
        )


def make_feasible(
    search: StrategySearch,
    key: tuple[int, ...],
    *,
    time_left_s: Callable[[], float] | None = None,
) -> tuple[tuple[int, ...], Evaluation]:
    """Turn op groups of ``key`` to model parallelism over every device group, most
    parameter bytes first among the groups that use an overflowing GPU, until the step
    fits, every group is model-parallel, or ``time_left_s()`` reaches zero. Returns the
    last key and its evaluation."""
    spread = Action(tuple(range(search.evaluator.cluster.num_groups)), Option.MODEL_PARALLEL)
    if spread not in search.space.actions:
        raise InvalidInput("the action space lacks model parallelism over every device group")
    spread_index = search.space.actions.index(spread)
    params = search.grouping.group_param_bytes
    current = list(key)
    while True:
        evaluation = search.evaluator.evaluate(search.strategy_of(tuple(current)))
        result = evaluation.result
        movable = [g for g, a in enumerate(current) if a != spread_index]
        out_of_time = time_left_s is not None and time_left_s() <= 0
        if not result.oom or not movable or out_of_time:
            return tuple(current), evaluation
        over = np.flatnonzero(result.overflow_bytes > 0)
        on_overflow = [
            g for g in movable if np.intersect1d(evaluation.resolved.devices(g), over).size
        ]
        current[max(on_overflow or movable, key=lambda g: (params[g], -g))] = spread_index
