"""Fragmentation: the share of free GPU capacity that the expected workload cannot use.

The measure follows FGD (Weng et al., USENIX ATC '23). A *target workload* is a set of job shapes
(`Demand`) with probabilities. For one node and one shape, the free capacity the shape cannot use is
*stranded*:

* the shape fits the node (its card-model constraint, enough host CPU/memory, and enough cards that
  can each hold one share): the free units of the cards too small for a share are stranded, the
  rest is usable;
* otherwise (including CPU-only shapes, which use no card at all): every free unit of the node is
  stranded.

A node's stranded amount is the probability-weighted sum over the shapes; the fleet's is the sum
over nodes. Units are whatever the cards count in: MiB on a real fleet, milli-GPU in the openb
benchmark. Callers convert for display.

Everything here is pure. `WorkloadIndex` is the fast path the policies use: the same definition,
computed with exact integer weights (so equal states give bit-equal results, whatever the order)
and memoised per node state.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Hashable, Iterable
from fractions import Fraction
from itertools import accumulate
from typing import TypeVar

from gpuctl.core.placement.fit import (
    Demand,
    NodeFree,
    Workload,
    card_fits,
    fits,
    host_fits,
    model_fits,
)

# ---------------------------------------------------------------------------------------------
# The definition


def _shape_stranded(node: NodeFree, demand: Demand) -> int:
    total = sum(node.free)
    if demand.gpus == 0 or not model_fits(node, demand) or not host_fits(node, demand):
        return total
    usable = [f for f, c in zip(node.free, node.capacity, strict=True) if card_fits(f, c, demand)]
    if len(usable) < demand.gpus:
        return total
    return total - sum(usable)


def node_stranded(node: NodeFree, workload: Workload) -> float:
    """Free units of `node` that the target workload cannot use (probability-weighted)."""
    return sum(p * _shape_stranded(node, d) for d, p in workload)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFragmentation:
    name: str
    stranded_units: float
    free_units: int
    capacity_units: int

    @property
    def pct_of_free(self) -> float | None:
        return None if self.free_units == 0 else 100.0 * self.stranded_units / self.free_units

    @property
    def pct_of_capacity(self) -> float | None:
        if self.capacity_units == 0:
            return None
        return 100.0 * self.stranded_units / self.capacity_units


@dataclasses.dataclass(frozen=True, slots=True)
class FragmentationReport:
    """Fleet-wide fragmentation; `None` percentages when there is nothing free (or no capacity)."""

    stranded_units: float
    free_units: int
    capacity_units: int
    pct_of_free: float | None
    pct_of_capacity: float | None
    nodes: tuple[NodeFragmentation, ...]


def fleet_fragmentation(nodes: Iterable[NodeFree], workload: Workload) -> FragmentationReport:
    """Per node and fleet-wide stranded capacity against `workload`."""
    index = WorkloadIndex(workload)
    per_node = tuple(
        NodeFragmentation(
            name=n.name,
            stranded_units=index.stranded(n),
            free_units=sum(n.free),
            capacity_units=sum(n.capacity),
        )
        for n in nodes
    )
    stranded = sum(n.stranded_units for n in per_node)
    free = sum(n.free_units for n in per_node)
    capacity = sum(n.capacity_units for n in per_node)
    return FragmentationReport(
        stranded_units=stranded,
        free_units=free,
        capacity_units=capacity,
        pct_of_free=None if free == 0 else 100.0 * stranded / free,
        pct_of_capacity=None if capacity == 0 else 100.0 * stranded / capacity,
        nodes=per_node,
    )


# ---------------------------------------------------------------------------------------------
# Target workloads


def shape_key(demand: Demand) -> tuple[int, int, int, str]:
    """The order used to break equal counts (descending): CPU, units per card, cards, models."""
    return (demand.cpu_milli, demand.mib_per_card, demand.gpus, "|".join(demand.gpu_models))


def workload_from_counts(
    counts: Iterable[tuple[Demand, int]], *, coverage_pct: int = 95
) -> Workload:
    """The target workload from observed shapes: the most frequent shapes that together cover
    `coverage_pct` % of all observations, with probabilities renormalised over the kept shapes.

    Equal counts are ordered by `shape_key`, descending, so the result is deterministic.
    Returns `()` when there are no observations (see `default_workload`).
    """
    if not 0 < coverage_pct <= 100:
        raise ValueError("coverage_pct must be in (0, 100]")
    merged: dict[Demand, int] = {}
    for demand, count in counts:
        if count < 0:
            raise ValueError("a shape count is never negative")
        if count:
            merged[demand] = merged.get(demand, 0) + count
    total = sum(merged.values())
    if total == 0:
        return ()
    kept = _most_frequent(merged, lambda seen: seen * 100 >= coverage_pct * total)
    cumulative = sum(c for _, c in kept)
    return tuple((d, c / cumulative) for d, c in kept)


_W = TypeVar("_W", int, float)


def _most_frequent(
    weights: dict[Demand, _W], enough: Callable[[_W], bool]
) -> list[tuple[Demand, _W]]:
    """The most frequent shapes, most first (equal weights ordered by `shape_key`, descending),
    up to and including the one with which the running total is `enough`."""
    ordered = sorted(weights.items(), key=lambda dw: (dw[1], shape_key(dw[0])), reverse=True)
    kept: list[tuple[Demand, _W]] = []
    for (demand, weight), seen in zip(ordered, accumulate(w for _, w in ordered), strict=True):
        kept.append((demand, weight))
        if enough(seen):
            break
    return kept


def default_workload(card_units: int) -> Workload:
    """A neutral workload for when nothing has been observed yet: mostly one-card jobs, some
    slices of a card and some multi-card jobs (`card_units` is one card's capacity)."""
    if card_units <= 0:
        raise ValueError("card_units must be positive")
    return (
        (Demand(gpus=1, mib_per_card=card_units, whole=True), 0.35),
        (Demand(gpus=1, mib_per_card=card_units // 2), 0.20),
        (Demand(gpus=1, mib_per_card=card_units // 4), 0.15),
        (Demand(gpus=2, mib_per_card=card_units, whole=True), 0.15),
        (Demand(gpus=4, mib_per_card=card_units, whole=True), 0.10),
        (Demand(gpus=8, mib_per_card=card_units, whole=True), 0.05),
    )


# ---------------------------------------------------------------------------------------------
# Host stranding


@dataclasses.dataclass(frozen=True, slots=True)
class HostRatio:
    """What the workload's card-using shapes ask of the host per card unit, on average
    (probability-weighted). 0 means "not asked" (the resource is then ignored)."""

    cpu_milli_per_unit: float
    mem_mib_per_unit: float


def host_ratio(workload: Workload) -> HostRatio:
    """CPU and host memory per card unit over the shapes that use cards (CPU-only shapes do not
    feed cards). A whole-card shape counts `gpus * mib_per_card` units, so give it the card size."""
    units = cpu = mem = 0.0
    for d, p in workload:
        u = d.gpus * d.mib_per_card
        if u <= 0:
            continue
        units += p * u
        cpu += p * d.cpu_milli
        mem += p * d.mem_mib
    if units <= 0:
        return HostRatio(0.0, 0.0)
    return HostRatio(cpu_milli_per_unit=cpu / units, mem_mib_per_unit=mem / units)


# The typical jobs, as FGD's target workload keeps them: the most frequent shapes that together
# make up this share of the jobs.
TYPICAL_SHARE = 0.95

Fillers = dict[int, tuple[Demand, ...]]  # card count -> the typical whole-card shapes of it


def whole_fillers(workload: Workload, share: float = TYPICAL_SHARE) -> Fillers:
    """The workload's typical whole-card shapes (among the most frequent shapes that make up
    `share` of its jobs; equal probabilities ordered by `shape_key`, descending), by card count."""
    merged: dict[Demand, float] = {}
    for demand, p in workload:
        merged[demand] = merged.get(demand, 0.0) + p
    total = sum(merged.values())
    out: dict[int, list[Demand]] = {}
    if total <= 0:
        return {}
    for demand, _ in _most_frequent(merged, lambda seen: seen >= share * total):
        if demand.gpus and (demand.whole or demand.gpus > 1):
            out.setdefault(demand.gpus, []).append(demand)
    return {k: tuple(v) for k, v in out.items()}


def host_stranded(node: NodeFree, ratio: HostRatio, fillers: Fillers | None = None) -> float:
    """Free card units that the node's remaining CPU and host memory cannot feed, at the
    workload's average CPU and memory per card unit (0 when the host has enough).

    Also 0 when every free card is whole and one of `fillers` (`whole_fillers`) takes exactly
    that many cards and fits the node now: a typical job feeds them all, whatever the average
    says. Without this a 4-card node whose host is under the average (32 cores, where the
    average asks 40 for 4 cards) counts a card stranded while empty, so the first small job to
    arrive gains by taking it, and the 4-card jobs that fit it find it broken (openb
    multigpu90/95: FGD led the default at x=100 until this)."""
    total = sum(node.free)
    usable = float(total)
    if node.cpu_free_milli is not None and ratio.cpu_milli_per_unit > 0:
        usable = min(usable, max(node.cpu_free_milli, 0) / ratio.cpu_milli_per_unit)
    if node.mem_free_mib is not None and ratio.mem_mib_per_unit > 0:
        usable = min(usable, max(node.mem_free_mib, 0) / ratio.mem_mib_per_unit)
    if usable >= total or not fillers:
        return total - usable
    return 0.0 if typical_fill(node, fillers) else total - usable


def typical_fill(node: NodeFree, fillers: Fillers) -> bool:
    """Every free card of `node` is whole, and one of `fillers` takes them all and fits it now
    (`host_stranded`'s exemption)."""
    whole = [c for f, c in zip(node.free, node.capacity, strict=True) if f == c and c > 0]
    return sum(whole) == sum(node.free) and any(fits(node, d) for d in fillers.get(len(whole), ()))


# ---------------------------------------------------------------------------------------------
# The fast path


DEAD_SHARE = 0.05  # a hole fewer than this share of the card-sharing jobs fit is dead
DEAD_WEIGHT = 2  # what a unit of dead hole costs, in units of stranded memory
HOST_WEIGHT = 1  # what a card unit the host cannot feed (`host_stranded`) costs, likewise


def _slice_sizes(workload: Workload) -> list[tuple[int, float]]:
    """(size per card, probability) of the workload's card-sharing shapes, smallest first."""
    return sorted((d.mib_per_card, p) for d, p in workload if d.gpus == 1 and not d.whole and p > 0)


def dead_hole_below(workload: Workload, share: float = DEAD_SHARE) -> int:
    """The hole size under which fewer than `share` of the workload's card-sharing jobs fit:
    the smallest slice size at which the share of slices no larger reaches it (0 when the
    workload shares no card: no hole is dead)."""
    sizes = _slice_sizes(workload)
    total = sum(p for _, p in sizes)
    seen = 0.0
    for size, p in sizes:
        seen += p
        if seen >= share * total:
            return size
    return 0


def consolidation_dead_range(workload: Workload) -> tuple[int, int]:
    """The holes consolidation counts as dead: from the smallest slice the workload asks for up
    to `dead_hole_below` (excluded). A smaller hole, one no job fits, is stranded in full by the
    stranded measure already: a move that frees a whole card and leaves such a hole is weighed
    by that measure alone (the placement, choosing a card for one slice, charges it too)."""
    sizes = _slice_sizes(workload)
    return (sizes[0][0] if sizes else 0), dead_hole_below(workload)


def dead_units(free: Iterable[int], below: int, at_least: int = 1) -> int:
    """The free memory of the cards whose hole is dead: at least `at_least`, less than `below`."""
    return sum(f for f in free if max(at_least, 1) <= f < below)


_Req = tuple[int, int, bool]  # what a shape asks of the cards: (cards, units per card, whole)


@dataclasses.dataclass(frozen=True, slots=True)
class _Group:
    """Shapes that ask the same of the cards (count, size, models); they differ only on the host."""

    req: _Req
    models: frozenset[str]
    hosts: tuple[tuple[int, int, int], ...]  # (cpu_milli, mem_mib, integer weight)
    weight: int  # the sum of the hosts' weights


class WorkloadIndex:
    """`node_stranded` for one workload, fast and exact.

    Probabilities are turned into exact integers over one power-of-two denominator, so a node's
    stranded amount is an exact integer numerator (`stranded_num`): equal states give equal
    numbers, and a change of zero is exactly zero. Results are memoised by node state.
    """

    __slots__ = (
        "_by_model",
        "_cache",
        "_cache_limit",
        "_cpu_only",
        "_cpu_steps",
        "_fit_weights",
        "_groups",
        "_mem_steps",
        "_older",
        "denominator",
        "fillers",
        "host_ratio",
        "workload",
    )

    def __init__(self, workload: Workload, *, cache_limit: int = 500_000) -> None:
        """`cache_limit`: node states remembered per generation; two generations are kept (the
        newest states and the ones before), so memory stays bounded for an index that lives long
        (the dashboard's, across polls) and the states in use stay warm."""
        self.workload = workload
        self._cache_limit = cache_limit
        fracs = [Fraction(p) for _, p in workload]
        if any(f < 0 for f in fracs):
            raise ValueError("a workload probability is never negative")
        self.denominator = max((f.denominator for f in fracs), default=1)
        weights = [int(f * self.denominator) for f in fracs]
        cpu_only = 0
        groups: dict[tuple[_Req, frozenset[str]], list[tuple[int, int, int]]] = {}
        for (demand, _), w in zip(workload, weights, strict=True):
            if demand.gpus == 0:
                cpu_only += w
                continue
            whole = demand.whole or demand.gpus > 1
            req = (demand.gpus, 0 if whole else demand.mib_per_card, whole)
            groups.setdefault((req, frozenset(demand.gpu_models)), []).append(
                (demand.cpu_milli, demand.mem_mib, w)
            )
        self._cpu_only = cpu_only
        self._groups = tuple(
            _Group(req=req, models=models, hosts=tuple(v), weight=sum(w for _, _, w in v))
            for (req, models), v in groups.items()
        )
        # Host resources matter only through "at least this much" tests: key the memo by step.
        self._cpu_steps = sorted({rc for g in self._groups for rc, _, _ in g.hosts})
        self._mem_steps = sorted({rm for g in self._groups for _, rm, _ in g.hosts})
        self._cache: dict[Hashable, int] = {}
        self._older: dict[Hashable, int] = {}
        self._by_model: dict[str | None, tuple[int, tuple[_Group, ...]]] = {}
        self._fit_weights: dict[tuple[str | None, int | None, int | None], tuple[int, ...]] = {}
        self.host_ratio = host_ratio(workload)
        self.fillers = whole_fillers(workload)

    @property
    def total_weight(self) -> int:
        return self._cpu_only + sum(g.weight for g in self._groups)

    def stranded_num(self, node: NodeFree) -> int:
        """Stranded units times `denominator` (an exact integer)."""
        cpu, mem = node.cpu_free_milli, node.mem_free_mib
        ci = None if cpu is None else bisect.bisect_right(self._cpu_steps, cpu)
        mi = None if mem is None else bisect.bisect_right(self._mem_steps, mem)
        key = (node.gpu_model, ci, mi, node.free, node.capacity)  # the tuples it already has
        hit = self._cache.get(key)
        if hit is None:
            hit = self._older.get(key)
            if hit is None:
                hit = self._compute(node, ci, mi)
            if len(self._cache) >= self._cache_limit:
                self._older, self._cache = self._cache, {}
            self._cache[key] = hit
        return hit

    def stranded(self, node: NodeFree) -> float:
        return self.stranded_num(node) / self.denominator

    def _for_model(self, model: str | None) -> tuple[int, tuple[_Group, ...]]:
        """The weight of shapes that cannot use this card model, and the groups that can."""
        hit = self._by_model.get(model)
        if hit is None:
            ok = tuple(g for g in self._groups if not g.models or model in g.models)
            na = sum(g.weight for g in self._groups if g.models and model not in g.models)
            hit = self._by_model[model] = (self._cpu_only + na, ok)
        return hit

    def _host_fit(self, model: str | None, ci: int | None, mi: int | None) -> tuple[int, ...]:
        """Per group that can use `model`: the weight of its shapes the host can run, given the
        number of CPU steps `ci` and memory steps `mi` the node's free CPU and memory reach."""
        key = (model, ci, mi)
        hit = self._fit_weights.get(key)
        if hit is None:
            cpu_ok = self._cpu_steps[:ci] if ci is not None else None
            mem_ok = self._mem_steps[:mi] if mi is not None else None
            cpu_max = cpu_ok[-1] if cpu_ok else -1
            mem_max = mem_ok[-1] if mem_ok else -1
            hit = tuple(
                sum(
                    w
                    for rc, rm, w in g.hosts
                    if (ci is None or rc <= cpu_max) and (mi is None or rm <= mem_max)
                )
                for g in self._for_model(model)[1]
            )
            self._fit_weights[key] = hit
        return hit

    def _compute(self, node: NodeFree, ci: int | None, mi: int | None) -> int:
        free = node.free
        ascending = sorted(free)
        below = [0]  # below[i]: the sum of the i smallest free amounts
        for f in ascending:
            below.append(below[-1] + f)
        total = below[-1]
        whole = [f for f, c in zip(free, node.capacity, strict=True) if f == c and c > 0]
        all_stranded, groups = self._for_model(node.gpu_model)
        fit_weights = self._host_fit(node.gpu_model, ci, mi)
        stranded = all_stranded * total
        for g, fit_weight in zip(groups, fit_weights, strict=True):
            cards, mib_per_card, is_whole = g.req
            if is_whole:
                fit_count, fit_sum = len(whole), sum(whole)
            elif mib_per_card > 0:  # the cards that hold one share: free >= mib_per_card
                at = bisect.bisect_left(ascending, mib_per_card)
                fit_count, fit_sum = len(ascending) - at, total - below[at]
            else:
                fit_count = fit_sum = 0
            if fit_count < cards:
                stranded += g.weight * total
                continue
            stranded += fit_weight * (total - fit_sum) + (g.weight - fit_weight) * total
        return stranded


_INDEXES: dict[int, WorkloadIndex] = {}


def index_for(workload: Workload) -> WorkloadIndex:
    """The (shared, memoised) index of `workload`; cheap to call on every decision."""
    hit = _INDEXES.get(id(workload))
    if hit is not None and hit.workload is workload:
        return hit
    index = WorkloadIndex(workload)
    if len(_INDEXES) > 64:
        _INDEXES.clear()
    _INDEXES[id(workload)] = index
    return index
