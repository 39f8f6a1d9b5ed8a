"""The fleet as operators read it: placement's view (observed + allocated) and the five numbers.

One service for `gpuctl status`, the dashboard, metrics, reports and playbook conditions, so they
all show the same figures for the same state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

from gpuctl.adapters.protocols import Store
from gpuctl.core.fit import Workload
from gpuctl.core.fragmentation import WorkloadIndex
from gpuctl.core.jobs import IncarnationState, Job
from gpuctl.core.model import FleetSnapshot, Reach
from gpuctl.core.placement.model import Allocation, FleetState
from gpuctl.errors import StateError
from gpuctl.ops.place import PlacementMemo, fleet_state_from_snapshot

BAND_IDLE_BELOW = 0.50
BAND_TARGET = (0.60, 0.80)


def store_allocations(store: Store) -> tuple[tuple[Allocation, ...], dict[str, Job]]:
    """What gpuctl granted: one allocation per incarnation holding cards and per reservation, and
    the jobs by id.

    A lost incarnation (its node went down, the job may run elsewhere) still holds its cards until
    it is fenced, under its own key, so a node that comes back is never double-booked.
    """
    from gpuctl.ops import jobs as jobspecs

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
    """Placement's view: the snapshot, the cards gpuctl granted, and the cordons. `versioned`,
    `memo`: see `fleet_state_from_snapshot`."""
    if store is None:
        return fleet_state_from_snapshot(snapshot, versioned=versioned, memo=memo)
    allocations, _ = store_allocations(store)
    state = fleet_state_from_snapshot(snapshot, allocations, versioned=versioned, memo=memo)
    cordoned = {c.node: c for c in store.cordons()}
    if not cordoned:
        return state
    nodes = tuple(
        dataclasses.replace(n, schedulable=False, reason=f"cordoned: {cordoned[n.name].reason}")
        if n.name in cordoned and n.schedulable
        else n
        for n in state.nodes
    )
    return dataclasses.replace(state, nodes=nodes)


def band_of(utilization: float | None) -> str | None:
    """`idle` (< 50%), `low` (50-60%), `target` (60-80%), `over` (> 80%: failover cannot land)."""
    if utilization is None:
        return None
    if utilization < BAND_IDLE_BELOW:
        return "idle"
    if utilization < BAND_TARGET[0]:
        return "low"
    if utilization <= BAND_TARGET[1]:
        return "target"
    return "over"


def observed_util_pct(snapshot: FleetSnapshot) -> float | None:
    """Mean SM utilization (NVML `utilization.gpu`) over the GPUs that answered."""
    values = [
        g.util_pct
        for n in snapshot.nodes
        if n.reach is Reach.OK
        for g in n.gpus
        if g.util_pct is not None
    ]
    return None if not values else sum(values) / len(values)


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100.0 * x, 2)


def numbers(
    snapshot: FleetSnapshot,
    store: Store | None,
    now: float,
    *,
    state: FleetState | None = None,
) -> dict[str, Any]:
    """The five numbers (and their companions) for one snapshot and the store, as plain data.

    Without a store (no job ever submitted here), the job figures are `None`.
    """
    from gpuctl.ops import jobs as jobspecs

    state = state if state is not None else fleet_state(snapshot, store)
    utilization = state.utilization()
    capacity = state.capacity_mib()
    out: dict[str, Any] = {
        "utilization_pct": _pct(utilization),
        "band": band_of(utilization),
        "allocated_mib": state.allocated_mib(),
        "capacity_mib": capacity,
        "observed_util_pct": observed_util_pct(snapshot),
    }
    out.update(fragmentation(state, store, now))
    out.update(jobspecs.fleet_numbers(store, now) if store is not None else _no_jobs())
    return out


def fragmentation(state: FleetState, store: Store | None, now: float) -> dict[str, Any]:
    """Fragmentation % (stranded / free × 100) and stranded GiB over schedulable nodes, against
    the target workload (the shapes of queued and recent jobs, and the default shapes), exactly
    as consolidation measures them."""
    from gpuctl.core.consolidate import fleet_figures
    from gpuctl.ops.consolidate import workload_for, workload_key

    jobs = store.jobs() if store else []
    key = workload_key(state, jobs, now)
    last = _WORKLOADS[0] if _WORKLOADS else None
    if last is not None and last[0] == key:
        workload = last[1]
    else:
        workload = workload_for(state, jobs, now)
        _WORKLOADS[:] = [(key, workload)]
    figures = fleet_figures(state, _index(workload))
    pct = figures.fragmentation_pct
    return {
        "fragmentation_pct": None if pct is None else round(pct, 2),
        "stranded_gib": round(figures.stranded_gib, 2),
    }


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


def _no_jobs() -> dict[str, Any]:
    from gpuctl.core import jobfigures

    return jobfigures.job_figures((), (), {}, 0.0).to_dict()
