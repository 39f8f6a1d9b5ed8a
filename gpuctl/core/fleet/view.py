"""The fleet view placement reads: a `FleetState` from a snapshot (observed), gpuctl's allocations
(allocated) and the store's cordons.

A card's capacity is its memory total; its ghost memory is what NVML shows in use beyond what
gpuctl's known allocations account for (below `GHOST_FLOOR_MIB`, driver overhead, it is ignored);
a card is healthy when its memory use is known and it reports no row-remapping failure nor an
uncorrected ECC error. A node takes new work only when it answered, is `ready`, its GPU query
worked and it is not cordoned; otherwise it is unschedulable with the reason. Pure.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Mapping, Sequence

from gpuctl.core.jobs.model import Cordon
from gpuctl.core.model import FleetSnapshot, GpuSnapshot, NodeSnapshot, NodeState, Reach
from gpuctl.core.placement.model import Allocation, Card, FleetState, PlacementNode

GHOST_FLOOR_MIB = 64  # idle cards report a few MiB used (driver, persistence daemon)


def fleet_state_from_snapshot(
    snapshot: FleetSnapshot,
    known: Sequence[Allocation] = (),
    *,
    ghost_floor_mib: int = GHOST_FLOOR_MIB,
    versioned: bool = True,
    memo: PlacementMemo | None = None,
) -> FleetState:
    """The placement view of a snapshot, with gpuctl's `known` allocations (none until the job
    store exists). `versioned=False`: no content hash of the snapshot (the state's `version` is
    empty) for readers that never turn it into a plan to apply (the dashboard: the hash of a
    thousand-node snapshot costs more than the view). `memo`: a node whose placement inputs
    did not change since the call before keeps its `PlacementNode` (see `PlacementMemo`)."""
    by_node: dict[str, list[Allocation]] = {}
    for a in known:
        by_node.setdefault(a.node, []).append(a)
    if memo is not None:
        nodes = memo.nodes(snapshot.nodes, by_node, ghost_floor_mib)
    else:
        nodes = tuple(_node(n, by_node.get(n.name, ()), ghost_floor_mib) for n in snapshot.nodes)
    version = snapshot.version if versioned else ""
    return FleetState(nodes=nodes, allocations=tuple(known), version=version)


def with_cordons(state: FleetState, cordons: Mapping[str, Cordon]) -> FleetState:
    """`state` with each cordoned node unschedulable, its reason `cordoned: <the cordon's
    reason>` (a node already unschedulable keeps its own reason)."""
    if not cordons:
        return state
    nodes = tuple(
        dataclasses.replace(n, schedulable=False, reason=f"cordoned: {cordons[n.name].reason}")
        if n.name in cordons and n.schedulable
        else n
        for n in state.nodes
    )
    return dataclasses.replace(state, nodes=nodes)


class PlacementMemo:
    """Each node's `PlacementNode` from the call before, reused while what placement reads of
    the node did not change: on a live fleet utilization and temperature change at every poll,
    memory in use rarely, so a poller (the dashboard, every second) rebuilds only the nodes
    whose memory, health flags, allocations or reachability moved. Holds the last call's nodes
    (and the snapshots they were built from) only; a test checks it against building every node
    anew."""

    def __init__(self) -> None:
        self._last: dict[str, _Built] = {}
        self.reused = 0  # nodes reused by the last call (tests, benchmarks)

    def nodes(
        self,
        nodes: Sequence[NodeSnapshot],
        allocations: Mapping[str, Sequence[Allocation]],
        floor: int,
    ) -> tuple[PlacementNode, ...]:
        last, kept = self._last, {}
        out = []
        reused = 0
        for n in nodes:
            allocs = tuple(allocations.get(n.name, ()))
            hit = last.get(n.name)
            if (
                hit is not None
                and hit[2] == floor
                and hit[1] == allocs
                and _same_placement_inputs(hit[0], n)
            ):
                made = hit[3]
                reused += 1
            else:
                made = _node(n, allocs, floor)
            kept[n.name] = (n, allocs, floor, made)
            out.append(made)
        self._last, self.reused = kept, reused
        return tuple(out)


_Built = tuple[NodeSnapshot, tuple[Allocation, ...], int, PlacementNode]

# What `_node` reads of a GPU (and nothing it does not: utilization, temperature, power,
# processes), memory in use first: the field most likely to have moved since the last poll.
_PLACED = operator.attrgetter(
    "mem_used_mib",
    "index",
    "uuid",
    "model",
    "mem_total_mib",
    "remapped_rows_failure",
    "ecc_volatile_uncorrected",
)


def _same_placement_inputs(old: NodeSnapshot, new: NodeSnapshot) -> bool:
    """Whether `_node` reads the same of both snapshots of a node. Stops at the first difference:
    on a fleet whose memory in use moves everywhere, that is the first GPU."""
    if old is new:
        return True
    if old.reach is not new.reach or old.state is not new.state or old.labels != new.labels:
        return False
    a, b = old.observation, new.observation
    if a is None or b is None:
        return a is b
    if len(a.gpus) != len(b.gpus):
        return False
    for x, y in zip(a.gpus, b.gpus, strict=True):
        if _PLACED(x) != _PLACED(y):
            return False
    fa, fb = a.facts, b.facts
    return (
        a.nvml_ok == b.nvml_ok
        and fa.cpu_count == fb.cpu_count
        and fa.host_mem_total_mib == fb.host_mem_total_mib
    )


def unschedulable_reason(node: NodeSnapshot) -> str | None:
    """Why the node takes no new work from what it answered (None: it may; cordons aside)."""
    if node.reach is not Reach.OK:
        return f"unreachable ({node.reach.value})"
    if node.state is not NodeState.READY:
        return "health unknown" if node.state is NodeState.UNKNOWN else node.state.value
    if node.observation is None or not node.observation.nvml_ok:
        return "GPU query failed"
    return None


def _node(node: NodeSnapshot, allocs: Sequence[Allocation], floor: int) -> PlacementNode:
    reason = unschedulable_reason(node)
    facts = node.observation.facts if node.observation else None
    cpu = facts.cpu_count if facts else None
    on_card: dict[int, list[Allocation]] = {}
    for a in allocs:
        for i in a.cards:
            on_card.setdefault(i, []).append(a)
    cards = [card(g, on_card.get(g.index) if on_card else None, floor) for g in node.gpus]
    last = -1
    for c in cards:
        if c.index < last:  # nvidia-smi lists GPUs in index order: a rare case
            cards.sort(key=_by_index)
            break
        last = c.index
    return PlacementNode(
        name=node.name,
        cards=tuple(cards),
        cpu_milli=None if cpu is None else cpu * 1000,
        cpu_allocated_milli=sum(a.cpu_milli for a in allocs) if allocs else 0,
        host_mem_mib=facts.host_mem_total_mib if facts else None,
        host_mem_allocated_mib=sum(a.host_mem_mib for a in allocs) if allocs else 0,
        labels=dict(node.labels),
        schedulable=reason is None,
        reason=reason,
    )


def _by_index(c: Card) -> int:
    return c.index


def card(g: GpuSnapshot, allocs: Sequence[Allocation] | None, floor: int = GHOST_FLOOR_MIB) -> Card:
    """One GPU as placement sees it. `allocs`: the allocations that hold this card (None: none).
    Ghost memory = observed in use − allocated, when at least `floor`."""
    capacity = g.mem_total_mib or 0
    allocated = sum(capacity if a.whole else a.mib_per_card for a in allocs) if allocs else 0
    used = g.mem_used_mib
    ghost = 0 if used is None else used - allocated
    if ghost < floor:
        ghost = 0
    healthy = (
        capacity > 0
        and used is not None  # unknown usage: nothing on the card can be called free
        and g.remapped_rows_failure is not True
        and not (g.ecc_volatile_uncorrected or 0) > 0
    )
    # positional: a poll builds thousands of cards, and keywords cost a third more
    return Card(g.index, capacity, g.uuid, g.model, allocated, ghost, healthy)
