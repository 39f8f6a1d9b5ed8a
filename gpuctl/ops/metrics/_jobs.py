"""What the metrics read of the store's jobs: the live jobs (queued, running, held) with their
cards and memory, and which jobs hold each GPU. Only live jobs get series, so their number stays
the size of the queue and the fleet, not of the store's history."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from gpuctl.adapters.protocols import Store
from gpuctl.core.jobs.model import Incarnation, IncarnationState, JobState
from gpuctl.core.jobs.slices import slice_verdicts
from gpuctl.core.model import GpuProcess
from gpuctl.ops.metrics._text import JobReading

LIVE = (JobState.QUEUED, JobState.RUNNING, JobState.HELD)


@dataclasses.dataclass(frozen=True, slots=True)
class JobsRead:
    jobs: tuple[JobReading, ...]
    on_cards: Mapping[tuple[str, int], tuple[tuple[str, str], ...]]  # (node, card) -> (id, name)


def read_jobs(
    store: Store, now: float, processes: Mapping[str, Sequence[GpuProcess]] | None
) -> JobsRead:
    """The live jobs at `now`. `processes`: the GPU processes of each node that answered a poll
    (None: no poll, so no observed memory); a job's observed memory is what NVML reports for the
    processes of its current incarnation (the control loop's attribution, `core.jobs.slices`)."""
    jobs = store.jobs(states=LIVE)
    names = {j.id: j.name for j in jobs}
    holding: dict[str, Incarnation] = {}
    for inc in store.incarnations(holding=True):
        if inc.state is IncarnationState.LOST or inc.job_id not in names:
            continue  # a lost copy's cards are the fencing's business, not the job's
        if inc.job_id not in holding or inc.n > holding[inc.job_id].n:
            holding[inc.job_id] = inc
    observed: dict[str, int] = {}
    if processes is not None:
        for use in slice_verdicts(tuple(holding.values()), processes).uses:
            if use.incarnation == holding[use.job_id].n:
                observed[use.job_id] = observed.get(use.job_id, 0) + use.used_mib
    on_cards: dict[tuple[str, int], list[tuple[str, str]]] = {}
    out = []
    for j in sorted(jobs, key=lambda j: j.id):
        held = holding.get(j.id)
        if held is not None:
            for card in held.cards:
                on_cards.setdefault((held.node, card), []).append((j.id, j.name))
        seen = None
        if held is not None and processes is not None and held.node in processes:
            seen = observed.get(j.id, 0)
        out.append(
            JobReading(
                id=j.id,
                name=j.name,
                state=j.state.value,
                tier=j.tier,
                incarnation=j.incarnation,
                restarts=j.restarts,
                node=None if held is None else held.node,
                cards=None if held is None else len(held.cards),
                allocated_mib=None if held is None else held.mib_per_card * len(held.cards),
                observed_mib=seen,
                checkpoint_age_s=_checkpoint_age(store, j.id, j.first_started_at, now)
                if j.state is JobState.RUNNING
                else None,
            )
        )
    return JobsRead(tuple(out), {k: tuple(v) for k, v in on_cards.items()})


def _checkpoint_age(
    store: Store, job_id: str, first_started_at: float | None, now: float
) -> float | None:
    """As the fleet figure counts it (`core.jobs.figures`): since the newest committed
    checkpoint, else since the first start."""
    newest = store.checkpoints(job_id)
    since = newest[0].committed_at if newest else first_started_at
    return None if since is None else max(0.0, now - since)
