"""Spot preemption (pure): which running spot incarnations to stop so that a job fits (fewest moves,
then the most recently checkpointed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.model import (
    Allocation,
    Card,
    FleetState,
    JobRequest,
    PlacementNode,
    Settings,
)


@dataclasses.dataclass(frozen=True, slots=True)
class SpotVictim:
    """A running spot incarnation that could be stopped to make room."""

    job_id: str
    allocation: Allocation  # its `job` is the job id, as in the fleet state
    checkpoint_at: float | None  # when its newest committed checkpoint was written; None: never


def victim_key(v: SpotVictim) -> tuple[bool, float, str]:
    """Most recently checkpointed first (least work lost), never-checkpointed last, then id."""
    return (v.checkpoint_at is None, -(v.checkpoint_at or 0.0), v.job_id)


def without(state: FleetState, job_ids: Iterable[str]) -> FleetState:
    """`state` with the allocations of `job_ids` released."""
    gone = set(job_ids)
    caps = {(n.name, c.index): c.capacity_mib for n in state.nodes for c in n.cards}
    released: dict[tuple[str, int], int] = {}
    for a in state.allocations:
        if a.job in gone:
            for card in a.cards:
                key = (a.node, card)
                take = caps.get(key, 0) if a.whole else a.mib_per_card
                released[key] = released.get(key, 0) + take
    if not any(a.job in gone for a in state.allocations):
        return state
    nodes = []
    for n in state.nodes:
        cards = tuple(
            c._replace(allocated_mib=max(0, c.allocated_mib - released.get((n.name, c.index), 0)))
            for c in n.cards
        )
        nodes.append(_node_without(n, cards, state.allocations, gone))
    allocations = tuple(a for a in state.allocations if a.job not in gone)
    return FleetState(nodes=tuple(nodes), allocations=allocations, version=state.version)


def _node_without(
    n: PlacementNode, cards: tuple[Card, ...], allocs: Sequence[Allocation], gone: set[str]
) -> PlacementNode:
    cpu = sum(a.cpu_milli for a in allocs if a.node == n.name and a.job in gone)
    mem = sum(a.host_mem_mib for a in allocs if a.node == n.name and a.job in gone)
    return dataclasses.replace(
        n,
        cards=cards,
        cpu_allocated_milli=max(0, n.cpu_allocated_milli - cpu),
        host_mem_allocated_mib=max(0, n.host_mem_allocated_mib - mem),
    )


def fits(state: FleetState, job: JobRequest, settings: Settings) -> bool:
    return plan(state, [job], settings).all_placed


def choose_preemption(
    state: FleetState,
    job: JobRequest,
    victims: Sequence[SpotVictim],
    settings: Settings,
) -> tuple[SpotVictim, ...] | None:
    """The spot incarnations to stop so that `job` fits, or None when stopping them all would
    not make room (or it already fits: then the answer is the empty tuple).

    Fewest moves first: a single victim (in preference order: most recently checkpointed first);
    then, per node, the shortest prefix of its victims in preference order (the node needing the
    fewest wins; ties: the better-checkpointed set, then node name); then a fleet-wide prefix
    (for a job the band, not a node, stops).
    """
    if fits(state, job, settings):
        return ()
    ordered = sorted(victims, key=victim_key)
    for v in ordered:
        if fits(without(state, [v.job_id]), job, settings):
            return (v,)
    best: tuple[tuple[int, tuple[bool, float, str], str], tuple[SpotVictim, ...]] | None = None
    by_node: dict[str, list[SpotVictim]] = {}
    for v in ordered:
        by_node.setdefault(v.allocation.node, []).append(v)
    for node in sorted(by_node):
        mine = by_node[node]
        for k in range(2, len(mine) + 1):
            chosen = tuple(mine[:k])
            if fits(without(state, [v.job_id for v in chosen]), job, settings):
                key = (k, victim_key(chosen[-1]), node)
                if best is None or key < best[0]:
                    best = (key, chosen)
                break
    if best is not None:
        return best[1]
    for k in range(2, len(ordered) + 1):
        chosen = tuple(ordered[:k])
        if fits(without(state, [v.job_id for v in chosen]), job, settings):
            return chosen
    return None
