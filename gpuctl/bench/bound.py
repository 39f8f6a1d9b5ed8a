"""An upper bound on the GPU allocation any placement of an arrival sequence can reach.

Under the protocol (`gpuctl.bench.protocol`) pods arrive, each is placed for good or dropped, and
nothing departs, so the allocation only grows. At column x the published KPI is a mean of the
allocation over the events of that column, so it is at most the allocation after the column's
last event, which is at most the most GPU that any subset of the pods arrived by then can take
on the fleet (and each event's at most its arrivals less the least loss at the column's first
event: `column_bound`). This module bounds that from above with a linear program solved by
HiGHS (through scipy):

    variables   x[k, t] >= 0: pods of class k (identical pods) placed on nodes of type t
                (identical nodes: the 1,213 openb nodes are 16 types); only where a pod of k
                fits an empty node of t (card model, card count, CPU, host memory);
                y[t, p] >= 0: cards of type t that hold the slices of card pattern p
    demand      sum over t of x[k, t] <= the arrived pods of class k
    cards       per type t: the slices of each size on t fit the patterns' slots for it, and
                the patterns and the whole-card pods share the type's cards
    capacity    per type t and per resource: the type's total (CPU, memory, card units)
    objective   maximise the GPU (milli) placed

A card pattern (Gilmore and Gomory) is a multiset of the slice sizes that fits on one card and
to which no further slice fits, so a card's holes that no slice of the pods can fill are
counted: a slice of 810 leaves 190 that only slices of 190 or less fill, two of 470 leave 60 (on
openb workloads, seed 42, this takes 0.1 (multigpu70) to 1.2 (gpushare100) points off the bound
at x=100 against the cuts below alone). The per-node rows are strengthened with dual-feasible
functions (Fekete and Schepers, 2001), which stay valid for every real packing: a node holds
items whose sizes sum to at most one node, so for a dual-feasible function f their f-values sum
to at most 1. With `u1` (1 above half, 1/2 at half, 0 below) this says, say, that two pods each
asking for more than half a node's CPU never share it. A node type with more patterns than
`PATTERN_LIMIT` gets the same cuts per card instead (two slices of more than half a card never
share one, ...).

Pods that use no GPU never add to the objective and are left out (a placement that drops them
takes no less GPU). The LP optimum, rounded down to an integer number of milli-GPU, is a sound
bound; `exact_allocation` solves the same question exactly (a MIP over single nodes and cards),
for small instances, to check it. `configuration_bound` solves the configuration LP (whole nodes'
contents, a node's CPU, memory and cards together) by column generation, for analysis: on the
openb workloads checked it gives the node-type LP's bound to 0.001 point at 30-100 times the CPU
(`benchmarks/placement/config_bound.py`), so `--bound` keeps the node-type LP.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from gpuctl.bench.openb import MILLI_PER_GPU, OpenbNode, OpenbPod
from gpuctl.bench.protocol import gpu_capacity_milli
from gpuctl.errors import UsageError

MISSING = "scipy is not installed: --bound needs its HiGHS solver (pip install 'gpuctl[bench]')"

PodClass = tuple[int, int, int, int, str]  # cpu, memory, cards, milli per card, models
NodeClass = tuple[int, int, int, str]  # cpu, memory, cards, model


def _scipy(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(MISSING) from None


def available() -> bool:
    try:
        importlib.import_module("scipy.optimize")
    except ImportError:
        return False
    return True


# --- dual-feasible functions --------------------------------------------------------------------

Dff = Callable[[Fraction], Fraction]


def _u(k: int) -> Dff:
    """Fekete and Schepers' u^(k): x when (k+1)x is an integer, else floor((k+1)x)/k."""

    def f(x: Fraction) -> Fraction:
        y = (k + 1) * x
        return x if y.denominator == 1 else Fraction(math.floor(y), k)

    return f


def _identity(x: Fraction) -> Fraction:
    return x


DFFS: tuple[Dff, ...] = (_identity, _u(1), _u(2), _u(3), _u(4))


# --- the LP -------------------------------------------------------------------------------------


def pod_class(p: OpenbPod) -> PodClass:
    """The LPs' class of a pod: CPU, memory, cards, milli per card, card models."""
    return (p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec)


def node_class(n: OpenbNode) -> NodeClass:
    """The LPs' type of a node: CPU, memory, cards, card model."""
    return (n.cpu_milli, n.memory_mib, n.gpus, n.model)


def _fits(pod: PodClass, node: NodeClass) -> bool:
    cpu, mem, cards, _, spec = pod
    models = tuple(m for m in spec.split("|") if m)
    return (
        cpu <= node[0] and mem <= node[1] and cards <= node[2] and (not models or node[3] in models)
    )


def _whole(pod: PodClass) -> bool:
    return pod[3] >= MILLI_PER_GPU


@dataclasses.dataclass(frozen=True, slots=True)
class Bound:
    milli: int  # no placement of the pods allocates more (milli-GPU)
    arrived_milli: int  # the GPU the pods ask for
    seconds: float


class _Rows:
    """The rows of a linear program, built one at a time: `low <= sum(v * x[j]) <= high`."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.low: list[float] = []
        self.high: list[float] = []

    def between(self, entries: Sequence[tuple[int, float]], low: float, high: float) -> None:
        r = len(self.high)
        for j, v in entries:
            if v:
                self.rows.append(r)
                self.cols.append(j)
                self.vals.append(v)
        self.low.append(low)
        self.high.append(high)

    def at_most(self, entries: Sequence[tuple[int, float]], high: float) -> None:
        self.between(entries, -math.inf, high)

    def upper(self, sparse: Any, columns: int) -> tuple[Any, Any]:
        """The matrix (scipy's `sparse` module builds it) and the upper limits."""
        shape = (len(self.high), columns)
        matrix = sparse.csr_array((self.vals, (self.rows, self.cols)), shape=shape)
        return matrix, np.array(self.high)


def allocation_bound(nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod]) -> Bound:
    """An upper bound on the GPU (milli) any placement of `pods` onto `nodes` allocates: the LP
    of `forced_bound` with no pod forced."""
    return forced_bound(nodes, pods, 0)


def forced_bound(nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], forced: int) -> Bound:
    """An upper bound on the GPU (milli) any placement of `pods` onto `nodes` that places each
    of the first `forced` pods allocates (the others are optional). Raises ValueError when no
    placement places the forced pods.

    The LP over node types of the module's docstring, with:

    * per class, at most its pods and at least its pods among the first `forced`. Pods without
      GPU are in it when forced (they take CPU and memory); otherwise they are left out;
    * per node type, its cards hold card patterns (Gilmore and Gomory): y[t, p] cards of type t
      hold the slices of pattern p (sizes summing to at most one card; only maximal ones, as a
      pattern with a free slot only relaxes), the slices of each size placed on t are at most
      the patterns' slots for it, and patterns and whole-card pods share the type's cards. So a
      card's holes that no slice of the pods can fill are counted (two slices of 470 leave 60
      that only a slice of 60 or less fills), where the dual-feasible cuts see only some. Past
      `PATTERN_LIMIT` patterns to walk for a type, the type's cards get the dual-feasible rows
      instead (one card at a time, summed over the type's cards);
    * per node type, the per-node rows: the node's cards in card units, CPU and memory, under
      each dual-feasible function.

    A pod of several slices counts as that many slices, each on some card of the type (their
    being on distinct cards of one node is relaxed).
    """
    opt = _scipy("scipy.optimize")
    sparse = _scipy("scipy.sparse")
    started = time.perf_counter()
    classes: dict[PodClass, list[int]] = {}  # class -> [at least, at most] placed
    for i, p in enumerate(pods):
        if p.num_gpu or i < forced:
            bounds = classes.setdefault(pod_class(p), [0, 0])
            bounds[0] += i < forced
            bounds[1] += 1
    cpu_only = any(not k[2] for k in classes)
    types = Counter(node_class(n) for n in nodes if n.gpus or cpu_only)
    arrived = sum(p.gpu_request_milli for p in pods)
    pod_keys, type_keys = sorted(classes), sorted(types)
    xs = [(k, t) for k, pk in enumerate(pod_keys) for t, tk in enumerate(type_keys)]
    xs = [(k, t) for k, t in xs if _fits(pod_keys[k], type_keys[t])]
    placeable = {k for k, _ in xs}
    if any(classes[pk][0] and k not in placeable for k, pk in enumerate(pod_keys)):
        raise ValueError("no placement places every forced pod: one fits no node")
    if not xs:
        return Bound(0, arrived, time.perf_counter() - started)
    # the card patterns of each type, over the slice sizes of the classes that fit it (None:
    # too many, the type's cards get the dual-feasible rows)
    ys: list[tuple[int, dict[int, int]]] = []
    patterned: set[int] = set()
    for t, tk in enumerate(type_keys):
        sizes = tuple(
            sorted(
                {pod_keys[k][3] for k, tt in xs if tt == t and _slice(pod_keys[k])}, reverse=True
            )
        )
        if not tk[2]:
            continue
        maximal = _maximal_patterns(sizes, PATTERN_LIMIT)
        if maximal is not None:
            patterned.add(t)
            ys.extend((t, slots) for slots in maximal)
    lp = _Rows()
    row = lp.at_most

    y0 = len(xs)  # the y columns follow the x columns
    for k, pk in enumerate(pod_keys):
        mine = [j for j, (kk, _) in enumerate(xs) if kk == k]
        low, high = classes[pk]
        row([(j, 1.0) for j in mine], high)
        if low:
            row([(j, -1.0) for j in mine], -low)
    for t, tk in enumerate(type_keys):
        here = [(j, pod_keys[k]) for j, (k, tt) in enumerate(xs) if tt == t]
        count, (cpu, mem, cards, _) = types[tk], tk
        if cards and t in patterned:
            patterns = [(y0 + j, slots) for j, (tt, slots) in enumerate(ys) if tt == t]
            for s in sorted({p[3] for _, p in here if _slice(p)}):
                slices = [(j, float(p[2])) for j, p in here if _slice(p) and p[3] == s]
                row(slices + [(j, -float(slots.get(s, 0))) for j, slots in patterns], 0)
            whole = [(j, float(p[2])) for j, p in here if _whole(p)]
            row(whole + [(j, 1.0) for j, _ in patterns], count * cards)
        for f in DFFS:
            if cards and t not in patterned:
                row([(j, float(_card_value(p, f))) for j, p in here], count * cards)
            if cards:
                row([(j, float(f(_units(p) / cards))) for j, p in here], count)
            row([(j, float(f(Fraction(p[0], cpu or 1)))) for j, p in here], count)
            row([(j, float(f(Fraction(p[1], mem or 1)))) for j, p in here], count)
    gain = np.array([-float(pod_keys[k][2] * pod_keys[k][3]) for k, _ in xs] + [0.0] * len(ys))
    matrix, rhs = lp.upper(sparse, len(gain))
    result = opt.linprog(gain, A_ub=matrix, b_ub=rhs, bounds=(0, None), method="highs")
    if result.status == 2:
        raise ValueError("no placement places every forced pod (the bound's LP is infeasible)")
    if result.status != 0:
        raise RuntimeError(f"HiGHS did not solve the bound's LP: {result.message}")
    # The LP's optimum, with room for the solver's tolerance, rounded down to whole milli.
    value = -float(result.fun)
    milli = min(arrived, math.floor(value * (1 + 1e-9) + 1e-6))
    return Bound(milli, arrived, time.perf_counter() - started)


# Past this many card patterns to walk for a node type (openb's 20 slice sizes walk 6,958, of which
# 1,871 are maximal), the type's cards get the dual-feasible rows instead: looser, but the LP and
# the walk stay small.
PATTERN_LIMIT = 50_000


def configuration_bound(
    nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], *, rounds: int = 1_000
) -> Bound:
    """An upper bound on the GPU (milli) any placement of `pods` onto `nodes` allocates, never
    above `allocation_bound`: the configuration LP, whose columns are whole nodes' contents.

        variables   l[t, q] >= 0: nodes of type t that hold configuration q, a multiset of
                    pods that fits one node of t with its CPU, memory and cards together (the
                    slices on card patterns, the whole-card pods on the other cards)
        demand      per class, the configurations' pods at most the arrived ones
        nodes       per type, at most its nodes
        objective   maximise the GPU (milli) placed

    The node-type LP of `allocation_bound` pools a type's CPU, memory and cards (with the
    dual-feasible cuts); here a node's resources bind together, so it can only be tighter.
    Solved by column generation: the LP over the configurations found so far gives prices for
    the classes, and per type a MIP (HiGHS) finds the configuration worth most at those prices.
    Whatever the prices, the arrived pods at their prices plus each type's nodes at the best
    configuration's worth bounds the LP from above (Farley's bound), so the bound is sound at
    every round, with the MIP's own upper bound on that worth, not its best solution. It stops
    when no configuration is worth more than its node, or after `rounds`.

    Pods without GPU are left out, as in `allocation_bound`; a pod of several slices counts
    as that many slices (their being on distinct cards is relaxed). A type with more card
    patterns than `PATTERN_LIMIT` keeps the node-type LP's bound.
    """
    started = time.perf_counter()
    pooled, best, _ = _configurations(nodes, pods, rounds)
    arrived = sum(p.gpu_request_milli for p in pods)
    milli = min(arrived, pooled.milli, math.floor(best * (1 + 1e-9) + 1e-6))
    return Bound(milli, arrived, time.perf_counter() - started)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeConfiguration:
    """One column of the configuration LP's optimum: `nodes` (an LP weight, not a whole number)
    nodes of type `node` (`node_class`), each holding `pods` (per `pod_class`, how many)."""

    node: NodeClass
    pods: dict[PodClass, int]
    nodes: float


def configuration_plan(
    nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], *, rounds: int = 1_000
) -> list[NodeConfiguration]:
    """The configurations the configuration LP of `configuration_bound` uses at its optimum
    (empty where it keeps the node-type LP's bound instead): how it would fill the fleet's
    nodes with `pods`."""
    _, _, plan = _configurations(nodes, pods, rounds)
    return plan


def _configurations(
    nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], rounds: int
) -> tuple[Bound, float, list[NodeConfiguration]]:
    """The column generation of `configuration_bound`: (the node-type LP's bound, the best of
    Farley's bounds, the configurations of the last LP with their weights)."""
    opt = _scipy("scipy.optimize")
    sparse = _scipy("scipy.sparse")
    pooled = allocation_bound(nodes, pods)
    asked = Counter(pod_class(p) for p in pods if p.num_gpu)
    types = Counter(node_class(n) for n in nodes if n.gpus)
    pod_keys, type_keys = sorted(asked), sorted(types)
    if not pod_keys or not type_keys:
        return pooled, float(pooled.milli), []
    value = np.array([float(k[2] * k[3]) for k in pod_keys])
    available = np.array([float(asked[k]) for k in pod_keys])
    pricers = []
    for tk in type_keys:
        fit = [k for k, pk in enumerate(pod_keys) if _fits(pk, tk)]
        sizes = tuple(sorted({pod_keys[k][3] for k in fit if _slice(pod_keys[k])}, reverse=True))
        patterns = _maximal_patterns(sizes, PATTERN_LIMIT)
        if patterns is None:
            return pooled, float(pooled.milli), []
        pricers.append(_Pricer(tk, pod_keys, fit, sizes, patterns, available, opt))
    best = float(pooled.milli)
    columns: list[tuple[int, dict[int, int]]] = []
    weights: Any = np.zeros(0)
    seen: set[tuple[int, tuple[tuple[int, int], ...]]] = set()
    prices = np.zeros(len(pod_keys))
    node_prices = np.zeros(len(type_keys))
    for _ in range(rounds):
        farley = float(prices @ available)
        added = 0
        for t, pricer in enumerate(pricers):
            found, worth, most = pricer.best(value - prices)
            farley += types[type_keys[t]] * max(0.0, most)
            key = (t, tuple(sorted(found.items())))
            if found and worth - node_prices[t] > 1e-6 and key not in seen:
                seen.add(key)
                columns.append((t, found))
                added += 1
        best = min(best, farley)
        if not added:
            break
        lp = _Rows()
        for k in range(len(pod_keys)):
            lp.at_most(
                [(j, float(q[k])) for j, (_, q) in enumerate(columns) if k in q], asked[pod_keys[k]]
            )
        for t, tk in enumerate(type_keys):
            lp.at_most([(j, 1.0) for j, (tt, _) in enumerate(columns) if tt == t], types[tk])
        gain = np.array([-float(sum(value[k] * n for k, n in q.items())) for _, q in columns])
        matrix, rhs = lp.upper(sparse, len(columns))
        result = opt.linprog(gain, A_ub=matrix, b_ub=rhs, bounds=(0, None), method="highs")
        if result.status != 0:
            raise RuntimeError(f"HiGHS did not solve the configuration LP: {result.message}")
        weights = result.x
        duals = np.maximum(-np.asarray(result.ineqlin.marginals), 0.0)
        prices, node_prices = duals[: len(pod_keys)], duals[len(pod_keys) :]
    plan = [
        NodeConfiguration(type_keys[t], {pod_keys[k]: n for k, n in q.items()}, float(w))
        for (t, q), w in zip(columns, weights, strict=False)
        if w > 1e-9
    ]
    return pooled, best, plan


class _Pricer:
    """The configuration of one node type worth most at given per-pod worths: a MIP over pods
    per class and cards per card pattern (HiGHS through scipy)."""

    def __init__(
        self,
        node: NodeClass,
        pod_keys: Sequence[PodClass],
        fit: Sequence[int],
        sizes: Sequence[int],
        patterns: Sequence[dict[int, int]],
        available: Any,
        opt: Any,
    ) -> None:
        self.fit, self.patterns, self.opt = list(fit), list(patterns), opt
        cpu, mem, cards, _ = node
        keys = [pod_keys[k] for k in self.fit]
        rows = [
            [float(k[0]) for k in keys] + [0.0] * len(patterns),
            [float(k[1]) for k in keys] + [0.0] * len(patterns),
            [float(k[2]) if _whole(k) else 0.0 for k in keys] + [1.0] * len(patterns),
        ]
        for s in sizes:
            rows.append(
                [float(k[2]) if _slice(k) and k[3] == s else 0.0 for k in keys]
                + [-float(p.get(s, 0)) for p in patterns]
            )
        self.rows = np.array(rows)
        self.high = np.array([float(cpu), float(mem), float(cards)] + [0.0] * len(sizes))
        self.upper = np.array([available[k] for k in self.fit] + [float(cards)] * len(patterns))

    def best(self, worth: Any) -> tuple[dict[int, int], float, float]:
        """(the configuration found as pods per class, its worth, an upper bound on the most
        any configuration is worth)."""
        gain = np.array([float(worth[k]) for k in self.fit] + [0.0] * len(self.patterns))
        if not self.fit or gain.max() <= 0:
            return {}, 0.0, 0.0
        upper = np.where(gain[: len(self.fit)] > 0, self.upper[: len(self.fit)], 0.0)
        opt = self.opt
        result = opt.milp(
            -gain,
            constraints=opt.LinearConstraint(self.rows, -np.inf, self.high),
            integrality=np.ones(len(gain)),
            bounds=opt.Bounds(0, np.concatenate([upper, self.upper[len(self.fit) :]])),
        )
        if result.status != 0 or result.x is None:
            raise RuntimeError(f"HiGHS did not solve a configuration's MIP: {result.message}")
        found = {
            self.fit[j]: round(x) for j, x in enumerate(result.x[: len(self.fit)]) if round(x) > 0
        }
        worth_found = float(sum(worth[k] * n for k, n in found.items()))
        dual = getattr(result, "mip_dual_bound", None)
        most = -float(dual) if dual is not None and math.isfinite(dual) else -float(result.fun)
        return found, worth_found, max(most, worth_found)


@functools.lru_cache(maxsize=64)
def _maximal_patterns(sizes: tuple[int, ...], limit: int) -> list[dict[int, int]] | None:
    """The card patterns over `sizes` (descending) to which no further slice fits, as slots per
    size; None when there are more than `limit` patterns (maximal or not) to walk. Kept per sizes
    (node types share theirs, and the LPs of one run ask again): callers only read them."""
    if not sizes:
        return []
    try:
        patterns = _patterns(sizes, [MILLI_PER_GPU // s for s in sizes], limit)
    except _TooManyPatterns:
        return None
    out = []
    for pattern in patterns:
        used = sum(n * s for n, s in zip(pattern, sizes, strict=True))
        if MILLI_PER_GPU - used < sizes[-1]:  # maximal: no further slice fits
            out.append({s: n for n, s in zip(pattern, sizes, strict=True) if n})
    return out


def _card_value(pod: PodClass, f: Dff) -> Fraction:
    """What a pod adds to its node type's card rows under f (summed over the type's cards):
    1 for each whole card it takes, f(its share) for each card it holds a slice of."""
    if _whole(pod):
        return Fraction(pod[2])
    return pod[2] * f(Fraction(pod[3], MILLI_PER_GPU))


def _slice(pod: PodClass) -> bool:
    """A pod holding part of each of its cards (a share of no card takes no slot)."""
    return bool(pod[2]) and 0 < pod[3] < MILLI_PER_GPU


def _units(pod: PodClass) -> Fraction:
    """A pod's GPU in card units, over all its cards."""
    return pod[2] * (Fraction(1) if _whole(pod) else Fraction(pod[3], MILLI_PER_GPU))


# --- per column of the protocol -----------------------------------------------------------------


def column_events(arrivals: Sequence[OpenbPod], capacity_milli: int, x: int) -> range | None:
    """The indices of the arrivals whose events the KPI at column x averages (the column itself,
    or x-1..x+1 when it has none, as `replay.allocation_curve` reads it); None when the run
    never reaches them. They are consecutive: the arrived GPU only grows."""
    where: dict[int, list[int]] = {}
    arrived = 0
    for i, pod in enumerate(arrivals):
        arrived += pod.gpu_request_milli
        c = round(arrived / capacity_milli * 100)
        if x - 1 <= c <= x + 1:
            where.setdefault(c, []).append(i)
    picked = where.get(x) or [i for c in (x - 1, x + 1) for i in where.get(c, ())]
    return range(min(picked), max(picked) + 1) if picked else None


def column_prefix(
    arrivals: Sequence[OpenbPod], capacity_milli: int, x: int
) -> tuple[OpenbPod, ...] | None:
    """The arrivals up to the last event that the KPI at column x averages over; None when the
    run never reaches it."""
    events = column_events(arrivals, capacity_milli, x)
    return None if events is None else tuple(arrivals[: events[-1] + 1])


def column_bound(
    nodes: Sequence[OpenbNode], arrivals: Sequence[OpenbPod], x: int
) -> tuple[float | None, float]:
    """The bound on the KPI at column x in % of capacity (2 decimals, as the KPI: rounding is
    monotone, so no run's KPI exceeds it), and the seconds it took.

    The KPI is the mean of the column's events, so each event is bounded on its own: by the
    bound after the column's last event (the allocation only grows), and by the event's
    arrivals less the least loss at the column's first event (arrived less the bound there).
    A run's loss (arrived less allocated) never falls, as a pod arriving is either placed or
    lost, so no run loses less at a later event than the least any run loses at the first.
    Where a column's first event already loses, this takes up to half a column off the bound
    on the last event alone (multigpu70 at x=100: 0.25 points on average over seeds 42-51).
    """
    capacity = gpu_capacity_milli(nodes)
    events = column_events(arrivals, capacity, x)
    if events is None:
        return None, 0.0
    last = allocation_bound(nodes, arrivals[: events[-1] + 1])
    first = last if len(events) == 1 else allocation_bound(nodes, arrivals[: events[0] + 1])
    arrived = sum(p.gpu_request_milli for p in arrivals[: events[0]])
    loss = 0
    per_event: list[float] = []
    for i in events:
        arrived += arrivals[i].gpu_request_milli
        if i == events[0]:
            loss = arrived - first.milli
        per_event.append(round(100 * min(last.milli, arrived - loss) / capacity, 2))
    return round(sum(per_event) / len(per_event), 2), first.seconds + (
        last.seconds if first is not last else 0.0
    )


def forced_ceiling(
    nodes: Sequence[OpenbNode], arrivals: Sequence[OpenbPod], must: int, x: int = 130
) -> float | None:
    """An upper bound on the KPI at column x (% of capacity, 2 decimals) of any run over
    `arrivals` that places each of the first `must` arrivals, however its pods are moved
    meanwhile; None when no arrival falls in that column.

    The same assumption as `packing_ceiling`: a run places every pod that arrived before its
    first failed pod (a run's own first failure gives `must`), so any consolidation of that run,
    or any better run one compares it with, places them too. Then the node-type LP of
    `allocation_bound` holds those pods (GPU and CPU-only ones: these take CPU and memory)
    placed and the later arrivals of the column optional. Unlike the packing ceiling it sees
    nodes, CPU, memory, card models and multi-GPU pods; unlike the packing ceiling it sees a
    card's holes only through the dual-feasible cuts. The lower of the two is the ceiling.
    """
    capacity = gpu_capacity_milli(nodes)
    prefix = column_prefix(arrivals, capacity, x)
    if prefix is None:
        return None
    bound = forced_bound(nodes, prefix, min(must, len(prefix)))
    return round(100 * bound.milli / capacity, 2)


# --- the exact optimum, for small instances ----------------------------------------------------


def exact_allocation(
    nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], *, forced: int = 0
) -> int:
    """The most GPU (milli) any placement of `pods` onto `nodes` allocates, exactly: a MIP over
    single nodes and cards (HiGHS through scipy), the first `forced` pods placed (those without
    GPU too). For checking the bound on small instances. Raises ValueError when no placement
    places the forced pods."""
    opt = _scipy("scipy.optimize")
    sparse = _scipy("scipy.sparse")
    gpu_pods = [p for i, p in enumerate(pods) if p.num_gpu or i < forced]
    must = [i < forced for i, p in enumerate(pods) if p.num_gpu or i < forced]
    names: list[tuple[str, int, int, int]] = []  # ("y", pod, node, -1) or ("z", pod, node, card)
    for i, p in enumerate(gpu_pods):
        for n, node in enumerate(nodes):
            if not _fits(pod_class(p), node_class(node)):
                continue
            names.append(("y", i, n, -1))
            names.extend(("z", i, n, c) for c in range(node.gpus))
    if any(m and not any(k[1] == i for k in names) for i, m in enumerate(must)):
        raise ValueError("no placement places every forced pod: one fits no node")
    if not names:
        return 0
    index = {key: j for j, key in enumerate(names)}
    lp = _Rows()
    row = lp.between

    def use(p: OpenbPod) -> int:
        return MILLI_PER_GPU if p.gpu_milli >= MILLI_PER_GPU else p.gpu_milli

    for i, p in enumerate(gpu_pods):
        ys = [(index[key], 1.0) for key in names if key[0] == "y" and key[1] == i]
        row(ys, 1 if must[i] else 0, 1)
        for j, _ in ys:
            _, _, n, _ = names[j]
            zs = [(index[("z", i, n, c)], 1.0) for c in range(nodes[n].gpus)]
            row([*zs, (j, -float(p.num_gpu))], 0, 0)
    for n, node in enumerate(nodes):
        for c in range(node.gpus):
            here = [(index[k], float(use(gpu_pods[k[1]]))) for k in names if k[2:] == (n, c)]
            row(here, 0, MILLI_PER_GPU)
        on_n = [k for k in names if k[0] == "y" and k[2] == n]
        row([(index[k], float(gpu_pods[k[1]].cpu_milli)) for k in on_n], 0, node.cpu_milli)
        row([(index[k], float(gpu_pods[k[1]].memory_mib)) for k in on_n], 0, node.memory_mib)
    gain = np.array(
        [-float(gpu_pods[k[1]].gpu_request_milli) if k[0] == "y" else 0.0 for k in names]
    )
    matrix, hi = lp.upper(sparse, len(names))
    result = opt.milp(
        gain,
        constraints=opt.LinearConstraint(matrix, np.array(lp.low), hi),
        integrality=np.ones(len(names)),
        bounds=opt.Bounds(0, 1),
    )
    if result.status == 2:
        raise ValueError("no placement places every forced pod")
    if result.status != 0:
        raise RuntimeError(f"HiGHS did not solve the exact MIP: {result.message}")
    return round(-float(result.fun))


# --- the consolidation benchmark's packing ceiling ----------------------------------------------


def packing_ceiling(
    arrivals: Sequence[OpenbPod], must: int, capacity_milli: int, cards: int
) -> float:
    """An upper bound on the allocation (% of capacity, 2 decimals) of any run over `arrivals`
    that places each of the first `must` arrivals, however its pods are moved meanwhile.

    The assumption, not a theorem: a run places every pod that arrived before its first failed
    pod (a run's own first failure gives `must`), so any consolidation of that run, or any
    better run one compares it with, places those pods too. Then the cards holding slices (a
    pod's share of a card under a whole one) hold the slices among the first `must` arrivals
    and any of the later ones; the free milli on those cards is at least the least waste of a
    packing of such slices onto at most `cards` cards: a linear program over card patterns
    (Gilmore and Gomory), solved by HiGHS, with CPU, memory, card models, nodes and whole-card
    pods ignored (each only adds constraints). A pod over several cards counts as a slice per
    card, each optional apart, which also only relaxes. The allocation is at most the
    capacity less that waste. `ceiling` counts only the holes beside slices of 800 milli or
    more; this one counts every hole that no packing of the slices can fill.
    """
    opt = _scipy("scipy.optimize")
    sparse = _scipy("scipy.sparse")
    every: Counter[int] = Counter()
    needed: Counter[int] = Counter()
    for i, p in enumerate(arrivals):
        if p.num_gpu and p.gpu_milli < MILLI_PER_GPU:
            every[p.gpu_milli] += p.num_gpu
            if i < must and p.num_gpu == 1:
                needed[p.gpu_milli] += 1
    if not needed:
        return 100.0
    sizes = sorted(every, reverse=True)
    patterns = _patterns(sizes, [every[s] for s in sizes])
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for j, pattern in enumerate(patterns):
        for i, k in enumerate(pattern):
            if k:
                rows += [i, len(sizes) + i]
                cols += [j, j]
                vals += [-float(k), float(k)]
        rows.append(2 * len(sizes))
        cols.append(j)
        vals.append(1.0)
    rhs = [-float(needed[s]) for s in sizes] + [float(every[s]) for s in sizes] + [float(cards)]
    waste = np.array(
        [float(MILLI_PER_GPU - sum(k * s for k, s in zip(p, sizes, strict=True))) for p in patterns]
    )
    matrix = sparse.csr_array((vals, (rows, cols)), shape=(len(rhs), len(patterns)))
    result = opt.linprog(waste, A_ub=matrix, b_ub=np.array(rhs), bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"HiGHS did not solve the packing ceiling's LP: {result.message}")
    # The least waste, with room for the solver's tolerance, rounded up to whole milli.
    least = max(0, math.ceil(float(result.fun) * (1 - 1e-9) - 1e-6))
    return round(100.0 * (capacity_milli - least) / capacity_milli, 2)


class _TooManyPatterns(Exception):
    pass


def _patterns(
    sizes: Sequence[int], counts: Sequence[int], limit: int | None = None
) -> list[tuple[int, ...]]:
    """Every non-empty multiset of the sizes (at most `counts` of each) that fits on one card.
    Raises _TooManyPatterns past `limit` of them."""
    out: list[tuple[int, ...]] = []
    current: list[int] = []

    def walk(i: int, left: int) -> None:
        if i == len(sizes):
            if any(current):
                out.append(tuple(current))
                if limit is not None and len(out) > limit:
                    raise _TooManyPatterns
            return
        for k in range(min(left // sizes[i], counts[i]) + 1):
            current.append(k)
            walk(i + 1, left - k * sizes[i])
            current.pop()

    walk(0, MILLI_PER_GPU)
    return out
