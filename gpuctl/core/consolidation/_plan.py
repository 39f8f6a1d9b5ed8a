"""Planning and applying consolidation (`plan_consolidation`, `apply_consolidation`), the
version a plan depends on, and the figures of what it frees. The rules every plan keeps are in
the package's docstring (`gpuctl.core.consolidation`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from gpuctl.core.consolidation._search import search
from gpuctl.core.consolidation._target import make_room
from gpuctl.core.consolidation.model import (
    DEFAULT_MAX_MOVES,
    ConsolidationPlan,
    FleetFigures,
    JobFacts,
    Migration,
    TargetOutcome,
)
from gpuctl.core.placement.fit import NodeFree, Workload
from gpuctl.core.placement.fragmentation import (
    WorkloadIndex,
    consolidation_dead_range,
    dead_units,
    host_stranded,
)
from gpuctl.core.placement.model import (
    Allocation,
    FleetState,
    JobRequest,
    JobShape,
    PlacementNode,
    Settings,
)
from gpuctl.errors import PlanError

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
    """Whole free cards and nodes, free, stranded, unfed and dead-hole memory, over schedulable
    nodes."""
    index = workload if isinstance(workload, WorkloadIndex) else WorkloadIndex(workload)
    smallest, below = consolidation_dead_range(index.workload)
    dead = stranded = whole_cards = whole_nodes = free_mib = capacity = 0
    unfed = 0.0
    for n in state.nodes:
        if not n.schedulable:
            continue
        t = n.totals()
        capacity += t.capacity_mib
        free_mib += t.free_mib
        whole_cards += t.empty_cards
        whole_nodes += 1 if n.cards and t.empty_cards == len(n.cards) else 0
        stranded += index.stranded_num(t.free)
        dead += dead_units(t.free.free, below, smallest)
        unfed += host_stranded(t.free, index.host_ratio, index.fillers)
    return FleetFigures(
        whole_free_cards=whole_cards,
        whole_free_nodes=whole_nodes,
        free_mib=free_mib,
        stranded_mib=stranded / index.denominator,
        capacity_mib=capacity,
        dead_mib=dead,
        unfed_mib=unfed,
    )


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
    version, before = consolidation_version(state), fleet_figures(state, index)
    if moves:
        after = _moved(state, moves)
        version_after, figures_after = consolidation_version(after), fleet_figures(after, index)
    else:  # nothing moves: the fleet after is the fleet before
        version_after, figures_after = version, before
    return ConsolidationPlan(
        version=version,
        version_after=version_after,
        snapshot_version=state.version,
        max_moves=max_moves,
        moves=tuple(moves),
        before=before,
        after=figures_after,
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
