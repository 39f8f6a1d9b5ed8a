"""The fleet as operators read it: placement's view (observed + allocated + cordons), each
node's state and the five numbers, from a snapshot and the state store.

One service for `gpuctl status`, `nodes list|show`, the dashboard, metrics, reports and playbook
conditions, so they all show the same figures and the same node states for the same state. The
rules are the core's (`core.fleet.view`, `core.fleet.nodestate`, `core.fleet.numbers`,
`core.fleet.workload`); this module reads the store for them and keeps what a poller asks again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

from gpuctl.adapters.protocols import Store
from gpuctl.core.fleet.nodestate import CORDON_EVENT_KINDS, NodeStatus, node_statuses
from gpuctl.core.fleet.numbers import FleetNumbers, fleet_numbers, no_jobs
from gpuctl.core.fleet.numbers import fragmentation as measure_fragmentation
from gpuctl.core.fleet.scheduler import allocations as slurm_allocations
from gpuctl.core.fleet.scheduler import cordons as slurm_cordons
from gpuctl.core.fleet.scheduler import with_slurm
from gpuctl.core.fleet.view import PlacementMemo, fleet_state_from_snapshot, with_cordons
from gpuctl.core.fleet.workload import workload_for, workload_key
from gpuctl.core.jobs.model import IncarnationState, Job
from gpuctl.core.model import FleetSnapshot
from gpuctl.core.placement.fit import Workload
from gpuctl.core.placement.fragmentation import WorkloadIndex
from gpuctl.core.placement.model import Allocation, FleetState
from gpuctl.errors import StateError

NODE_EVENTS = 200  # cordon / uncordon / drain events read to tell a drain from a cordon


def store_allocations(store: Store) -> tuple[tuple[Allocation, ...], dict[str, Job]]:
    """What gpuctl granted: one allocation per incarnation holding cards and per reservation, and
    the jobs by id.

    A lost incarnation (its node went down, the job may run elsewhere) still holds its cards until
    it is fenced, under its own key, so a node that comes back is never double-booked.
    """
    from gpuctl.ops.jobs import spec as jobspecs

    jobs = {j.id: j for j in store.jobs()}
    ids = jobspecs.ids_by_name(jobs.values())
    allocations = []
    for inc in store.incarnations(holding=True):
        job = jobs.get(inc.job_id)
        bare = Allocation(inc.job_id, inc.node, inc.cards, inc.mib_per_card, inc.whole)
        try:
            alloc = jobspecs.allocation(job, inc, ids) if job is not None else bare
        except StateError:  # an unreadable spec still holds its cards
            alloc = bare
        if inc.state is IncarnationState.LOST:
            alloc = dataclasses.replace(alloc, job=f"{inc.job_id}#lost{inc.n}")
        allocations.append(alloc)
    allocations += _reserved(store)
    return tuple(allocations), jobs


def _reserved(store: Store) -> list[Allocation]:
    """Cards held by reservations (a migration's target), under the key `<job id>#reserved`:
    nothing else is placed there while the job moves."""
    return [
        Allocation(
            f"{r.job_id}#reserved",
            r.node,
            r.cards,
            r.mib_per_card,
            r.whole,
            cpu_milli=r.cpu_milli,
            host_mem_mib=r.host_mem_mib,
        )
        for r in store.reservations()
    ]


def fleet_state(
    snapshot: FleetSnapshot,
    store: Store | None,
    *,
    versioned: bool = True,
    memo: PlacementMemo | None = None,
) -> FleetState:
    """Placement's view: the snapshot, the cards gpuctl granted and Slurm's jobs hold (the
    snapshot's `scheduler`), and the cordons (gpuctl's, then Slurm's drains). `versioned`,
    `memo`: see `core.fleet.view.fleet_state_from_snapshot`."""
    held = slurm_allocations(snapshot.scheduler)
    cordons = slurm_cordons(snapshot.scheduler)
    if store is None:
        state = fleet_state_from_snapshot(snapshot, held, versioned=versioned, memo=memo)
        return with_cordons(state, cordons)
    allocations, jobs = store_allocations(store)
    if held:  # a Slurm job gpuctl submitted: its cards once, as the view holds them
        listed = {j.job_id for j in snapshot.scheduler.jobs} if snapshot.scheduler else set()
        allocations = tuple(a for a in allocations if _backend_id(jobs.get(a.job)) not in listed)
    state = fleet_state_from_snapshot(
        snapshot, (*allocations, *held), versioned=versioned, memo=memo
    )
    return with_cordons(state, {**cordons, **{c.node: c for c in store.cordons()}})


def _backend_id(job: Job | None) -> str | None:
    return None if job is None or job.spec.backend is None else job.spec.backend.id


def node_states(snapshot: FleetSnapshot, store: Store | None) -> dict[str, NodeStatus]:
    """Each node's state (`core.fleet.nodestate`) by name: its answer and the store's cordons,
    drains and moves (none without a store), then Slurm's drains and DOWN nodes where gpuctl
    has no cordon (`core.fleet.scheduler.with_slurm`)."""
    if store is None:
        return with_slurm(node_statuses(snapshot.nodes, {}), snapshot.scheduler)
    holding: dict[str, set[str]] = {}
    for inc in store.incarnations(holding=True):
        holding.setdefault(inc.node, set()).add(inc.job_id)
    statuses = node_statuses(
        snapshot.nodes,
        {c.node: c for c in store.cordons()},
        reversed(store.events(kinds=CORDON_EVENT_KINDS, limit=NODE_EVENTS)),
        holding,
        {r.job_id for r in store.reservations()},
    )
    return with_slurm(statuses, snapshot.scheduler)


def numbers(
    snapshot: FleetSnapshot,
    store: Store | None,
    now: float,
    *,
    state: FleetState | None = None,
) -> FleetNumbers:
    """The five numbers (and their companions) for one snapshot and the store.

    Without a store (no job ever submitted here), the job figures are `None`.
    """
    from gpuctl.ops.jobs import service as jobs_service

    state = state if state is not None else fleet_state(snapshot, store)
    jobs = no_jobs() if store is None else jobs_service.fleet_numbers(store, now)
    return fleet_numbers(snapshot, state, _index(workload_of(state, store, now)), jobs)


def fragmentation(state: FleetState, store: Store | None, now: float) -> tuple[float | None, float]:
    """Fragmentation % and stranded GiB over schedulable nodes, against the target workload,
    exactly as consolidation measures them (`core.fleet.numbers.fragmentation`)."""
    return measure_fragmentation(state, _index(workload_of(state, store, now)))


def workload_of(state: FleetState, store: Store | None, now: float) -> Workload:
    """The target workload of the store's jobs (`core.fleet.workload.workload_for`), kept from one
    call to the next while what it depends on (`core.fleet.workload.workload_key`) stays the
    same."""
    jobs = store.jobs() if store else []
    key = workload_key(state, jobs, now)
    last = _WORKLOADS[0] if _WORKLOADS else None
    if last is not None and last[0] == key:
        return last[1]
    made = workload_for(state, jobs, now)
    _WORKLOADS[:] = [(key, made)]
    return made


_INDEXES: list[WorkloadIndex] = []  # the last one used: polls keep asking with the same workload
_WORKLOADS: list[tuple[Hashable, Workload]] = []  # the last workload and what it was made from
FIGURES_MEMO = 4096  # node states per generation (two kept): the last few polls of a large fleet


def _index(workload: Workload) -> WorkloadIndex:
    """The index of `workload`, kept from one call to the next while the workload stays the same:
    a node whose free memory did not change since the last poll is not measured again."""
    last = _INDEXES[0] if _INDEXES else None
    if last is not None and last.workload == workload:
        return last
    index = WorkloadIndex(workload, cache_limit=FIGURES_MEMO)
    _INDEXES[:] = [index]
    return index
