"""Consolidation: plans of migrations that free whole cards and nodes. Pure and deterministic.

`plan_consolidation(state, facts, ...)` simulates moves on a copy of the fleet state and keeps
those that strictly reduce stranded memory (free memory the target workload cannot use, measured
by `gpuctl.core.fragmentation`), best first, up to `max_moves`. With a `target` shape it solves the
drain-and-refill case instead: make room for the target (a whole node, N whole cards, or a slice)
with the fewest moves.

Rules every plan keeps (the property tests check them):

* no card, node (CPU, host memory) or band limit is ever exceeded. A slice moves to a card with
  that much free; a whole-card job moves only to empty cards of the same capacity, so a plan
  never changes the fleet's allocated or free memory, nor its utilization;
* node affinity, node anti-affinity and job anti-affinity hold at every destination;
* `disruptible: false` jobs, jobs moved (started) less than their minimum runtime ago, jobs
  gpuctl has no facts about, and jobs on unschedulable nodes are never moved (they are listed as
  pinned, with the reason);
* each job moves at most once per plan, and no plan has more than `max_moves` moves;
* without a target, every move strictly reduces stranded memory, so fragmentation never grows.

Jobs are preferred by the stranded memory a move frees, discounted by the move's cost: a stale
(or missing) checkpoint and a large footprint make a move dearer (`move_penalty`). Ties go to the
job, then the node, whose name sorts first.

A plan carries `version`, a digest of everything it depends on (`consolidation_version`): nodes,
schedulability, labels, cards' capacity/allocated/ghost/health, and the allocations. Applying a
plan to a state of another version is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from gpuctl.core.fit import NodeFree, Workload
from gpuctl.core.fragmentation import WorkloadIndex
from gpuctl.core.placement.model import (
    Allocation,
    FleetState,
    JobRequest,
    JobShape,
    LabelRequirement,
    PlacementNode,
    Settings,
    Tier,
)
from gpuctl.errors import PlanError

DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S = 1800.0
DEFAULT_MAX_MOVES = 10
CHECKPOINT_STALE_S = 3600.0  # a checkpoint this old (or none) costs a move the most


@dataclasses.dataclass(frozen=True, slots=True)
class JobFacts:
    """What consolidation needs to know of one allocated job beyond its `Allocation`."""

    job: str  # the allocation's job key
    disruptible: bool = True
    last_moved_at: float | None = None  # when its current run started; None: unknown (long ago)
    min_runtime_between_moves_s: float = DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S
    checkpoint_age_s: float | None = None  # None: no committed checkpoint
    gpu_models: tuple[str, ...] = ()  # the job's model constraint (any of these)
    node_affinity: tuple[LabelRequirement, ...] = ()
    node_anti_affinity: tuple[LabelRequirement, ...] = ()
    hold: str | None = None  # why it may not move now, as the caller knows (a move under way)


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    """One move: checkpoint, stop, restart on `to_node`/`to_cards` (reserved first)."""

    job: str
    tier: Tier
    from_node: str
    from_cards: tuple[int, ...]
    to_node: str
    to_cards: tuple[int, ...]
    mib_per_card: int  # the slice (a whole card: its capacity)
    whole: bool
    checkpoint_age_s: float | None
    stranded_freed_mib: float  # stranded memory this move frees (in the plan's order)
    cpu_milli: int = 0  # what the job holds on its node besides cards
    host_mem_mib: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class FleetFigures:
    """What a plan frees, over schedulable nodes (MiB on a fleet; milli-GPU in the benchmark)."""

    whole_free_cards: int
    whole_free_nodes: int
    free_mib: int
    stranded_mib: float
    capacity_mib: int

    @property
    def fragmentation_pct(self) -> float | None:
        return None if self.free_mib == 0 else 100.0 * self.stranded_mib / self.free_mib

    @property
    def stranded_gib(self) -> float:
        return self.stranded_mib / 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Pinned:
    """A job the plan would not move, and why."""

    job: str
    node: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class TargetOutcome:
    """The drain-and-refill result: where the target fits after the plan's moves, or why not."""

    shape: str  # the request in words
    fits: bool
    node: str | None
    cards: tuple[int, ...]
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class ConsolidationPlan:
    version: str  # `consolidation_version` of the state it was computed from
    version_after: str  # ... of the state it predicts
    snapshot_version: str  # the fleet snapshot's own version, for the record
    max_moves: int
    moves: tuple[Migration, ...]
    before: FleetFigures
    after: FleetFigures
    pinned: tuple[Pinned, ...]
    reason: str  # why the plan stops where it does
    target: TargetOutcome | None = None

    @property
    def empty(self) -> bool:
        return not self.moves


# --- version and figures -----------------------------------------------------------------------


def _node_doc(n: PlacementNode) -> list[Any]:
    return [
        n.name,
        n.schedulable,
        sorted(n.labels.items()),
        [
            [c.index, c.capacity_mib, c.allocated_mib, c.ghost_mib, c.healthy, c.model]
            for c in n.cards
        ],
        [n.cpu_milli, n.cpu_allocated_milli, n.host_mem_mib, n.host_mem_allocated_mib],
    ]


def consolidation_version(state: FleetState) -> str:
    """A digest of what a consolidation plan depends on. Temperatures, SM use and other
    observations that do not change placement do not change it."""
    body = json.dumps(
        [
            sorted((_node_doc(n) for n in state.nodes), key=lambda d: str(d[0])),
            sorted((a.to_dict() for a in state.allocations), key=lambda d: str(d["job"])),
        ],
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def node_free(n: PlacementNode) -> NodeFree:
    """A node as the fragmentation measure sees it (unhealthy cards: nothing free)."""
    return n.totals().free


def fleet_figures(state: FleetState, workload: Workload | WorkloadIndex) -> FleetFigures:
    """Whole free cards and nodes, free and stranded memory, over schedulable nodes."""
    index = workload if isinstance(workload, WorkloadIndex) else WorkloadIndex(workload)
    stranded = whole_cards = whole_nodes = free_mib = capacity = 0
    for n in state.nodes:
        if not n.schedulable:
            continue
        t = n.totals()
        capacity += t.capacity_mib
        free_mib += t.free_mib
        whole_cards += t.empty_cards
        whole_nodes += 1 if n.cards and t.empty_cards == len(n.cards) else 0
        stranded += index.stranded_num(t.free)
    return FleetFigures(
        whole_free_cards=whole_cards,
        whole_free_nodes=whole_nodes,
        free_mib=free_mib,
        stranded_mib=stranded / index.denominator,
        capacity_mib=capacity,
    )


def move_penalty(facts: JobFacts, alloc: Allocation, card_mib: int) -> float:
    """How dear a move is, beyond the one move itself: up to 1 for a checkpoint an hour old or
    none, and a quarter per whole card's worth of memory moved."""
    age = facts.checkpoint_age_s
    stale = 1.0 if age is None else min(max(age, 0.0), CHECKPOINT_STALE_S) / CHECKPOINT_STALE_S
    moved = alloc.mib_per_card * len(alloc.cards)
    return stale + 0.25 * (moved / card_mib if card_mib > 0 else 0.0)


# --- planning ----------------------------------------------------------------------------------


def plan_consolidation(
    state: FleetState,
    facts: Sequence[JobFacts],
    *,
    max_moves: int = DEFAULT_MAX_MOVES,
    workload: Workload,
    settings: Settings | None = None,
    now: float,
    target: JobRequest | JobShape | None = None,
) -> ConsolidationPlan:
    """The consolidation plan for `state` (see the module docstring). Changes nothing.

    `facts` describe the allocated jobs (keyed by `Allocation.job`); a job without facts is never
    moved. `workload` is the target workload stranded memory is measured against (non-empty).
    Raises PlanError for a negative `max_moves` or an empty workload.
    """
    from gpuctl.core.consolidate_search import search
    from gpuctl.core.consolidate_target import make_room

    if max_moves < 0:
        raise PlanError(f"max_moves must be 0 or more, got {max_moves}")
    if not workload:
        raise PlanError("consolidation needs a target workload with at least one shape")
    settings = settings or Settings()
    index = WorkloadIndex(workload)
    by_job = {f.job: f for f in facts}
    target_outcome: TargetOutcome | None = None
    if target is None:
        moves, pinned, reason = search(state, by_job, index, max_moves=max_moves, now=now)
    else:
        request = target if isinstance(target, JobRequest) else JobRequest("target", target)
        moves, pinned, target_outcome = make_room(
            state, by_job, index, request, settings, max_moves=max_moves, now=now
        )
        reason = target_outcome.reason
    after = _moved(state, moves)
    return ConsolidationPlan(
        version=consolidation_version(state),
        version_after=consolidation_version(after),
        snapshot_version=state.version,
        max_moves=max_moves,
        moves=tuple(moves),
        before=fleet_figures(state, index),
        after=fleet_figures(after, index),
        pinned=tuple(pinned),
        reason=reason,
        target=target_outcome,
    )


# --- applying ----------------------------------------------------------------------------------


def apply_consolidation(state: FleetState, plan: ConsolidationPlan) -> FleetState:
    """The state after the plan's moves, in order. Raises PlanError for a stale plan (another
    version) or a move the state cannot hold."""
    if plan.version != consolidation_version(state):
        raise PlanError(
            "stale plan: recompute (the fleet changed since the plan was made: "
            f"plan {plan.version}, fleet now {consolidation_version(state)})",
            hint="run `gpuctl consolidate` again",
        )
    return _moved(state, plan.moves)


def _moved(state: FleetState, moves: Iterable[Migration]) -> FleetState:
    nodes = {n.name: n for n in state.nodes}
    allocs = {a.job: a for a in state.allocations}
    for m in moves:
        a = allocs.get(m.job)
        if a is None or a.node != m.from_node or a.cards != m.from_cards:
            raise PlanError(f"move of {m.job}: it is not on {m.from_node} cards {m.from_cards}")
        nodes[a.node] = _release(nodes[a.node], a)
        dest = nodes.get(m.to_node)
        if dest is None or not dest.schedulable:
            raise PlanError(f"move of {m.job}: node {m.to_node} is not schedulable")
        moved = dataclasses.replace(a, node=m.to_node, cards=m.to_cards)
        nodes[m.to_node] = _hold(dest, moved)
        allocs[m.job] = moved
    return FleetState(
        nodes=tuple(nodes[n.name] for n in state.nodes),
        allocations=tuple(allocs[a.job] for a in state.allocations),
        version=state.version,
    )


def _release(node: PlacementNode, a: Allocation) -> PlacementNode:
    cards = []
    for c in node.cards:
        if c.index in a.cards:
            take = c.capacity_mib if a.whole else a.mib_per_card
            c = c._replace(allocated_mib=max(0, c.allocated_mib - take))
        cards.append(c)
    return dataclasses.replace(
        node,
        cards=tuple(cards),
        cpu_allocated_milli=max(0, node.cpu_allocated_milli - a.cpu_milli),
        host_mem_allocated_mib=max(0, node.host_mem_allocated_mib - a.host_mem_mib),
    )


def _hold(node: PlacementNode, a: Allocation) -> PlacementNode:
    where = f"move of {a.job} to {node.name}"
    by_index = {c.index: c for c in node.cards}
    cards = dict(by_index)
    for i in a.cards:
        c = by_index.get(i)
        if c is None:
            raise PlanError(f"{where}: no card {i}")
        if a.whole:
            if not c.empty or c.capacity_mib != a.mib_per_card:
                raise PlanError(f"{where}: card {i} is not an empty card of that size")
            cards[i] = c._replace(allocated_mib=c.capacity_mib)
        else:
            if c.free_mib < a.mib_per_card:
                raise PlanError(f"{where}: card {i} has too little free memory")
            cards[i] = c._replace(allocated_mib=c.allocated_mib + a.mib_per_card)
    cpu, mem = node.cpu_free_milli, node.host_mem_free_mib
    if (cpu is not None and cpu < a.cpu_milli) or (mem is not None and mem < a.host_mem_mib):
        raise PlanError(f"{where}: the node lacks the CPU or host memory")
    return dataclasses.replace(
        node,
        cards=tuple(cards[c.index] for c in node.cards),
        cpu_allocated_milli=node.cpu_allocated_milli + a.cpu_milli,
        host_mem_allocated_mib=node.host_mem_allocated_mib + a.host_mem_mib,
    )


def moved_jobs(plan: ConsolidationPlan) -> Iterable[str]:
    return (m.job for m in plan.moves)
