"""The target workload fragmentation is measured against (docs/design.md, Fragmentation %): the
shapes of queued jobs and of jobs submitted in the last week, by frequency, merged half and half
with a default distribution, on the fleet's usual card. Pure: consolidation plans against it and
`gpuctl status` reports fragmentation against it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from gpuctl.core.jobs.model import Job, JobState
from gpuctl.core.placement.fit import Demand, Workload
from gpuctl.core.placement.fragmentation import default_workload, workload_from_counts
from gpuctl.core.placement.model import FleetState, Settings
from gpuctl.core.placement.shape import demand_on

RECENT_S = 7 * 86400.0  # submissions this recent shape the target workload
DEFAULT_CARD_MIB = 81920  # for the default workload when the fleet reports no card


def card_size(state: FleetState) -> int:
    """The most common card capacity of schedulable nodes (ties: the larger)."""
    sizes: Counter[int] = Counter()
    for n in state.nodes:
        if n.schedulable:
            sizes.update(n.totals().free.capacity)
    sizes.pop(0, None)
    if not sizes:
        return DEFAULT_CARD_MIB
    return max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0]


def in_target_workload(job: Job, now: float) -> bool:
    """Whether `job`'s shape is part of the target workload: queued, or submitted in the last
    week (`RECENT_S`)."""
    return job.state is JobState.QUEUED or now - job.submitted_at <= RECENT_S


def workload_for(
    state: FleetState, jobs: Iterable[Job], now: float, settings: Settings | None = None
) -> Workload:
    """The target workload: half the weight on the shapes of the jobs `in_target_workload`, by
    frequency (top 95 %), as they ask of the fleet's usual card; half on `default_workload` (all
    of it when there are none), so whole cards and nodes keep their value even when recent work
    was all small."""
    settings = settings or Settings()
    cap = card_size(state)
    counts: Counter[Demand] = Counter(
        demand_on(j.spec.request.shape, cap, settings) for j in jobs if in_target_workload(j, now)
    )
    base = default_workload(cap)
    seen = workload_from_counts(counts.items())
    if not seen:
        return base
    merged: dict[Demand, float] = {}
    for d, p in (*seen, *base):
        merged[d] = merged.get(d, 0.0) + p / 2
    return tuple(merged.items())


def workload_key(state: FleetState, jobs: Iterable[Job], now: float) -> Hashable:
    """What `workload_for` (default settings) depends on: the usual card size and which
    jobs count (a job's shape is its stored spec's, which never changes). Equal keys, equal
    workloads: a poller asks again only when this changes."""
    return card_size(state), tuple(j.id for j in jobs if in_target_workload(j, now))
