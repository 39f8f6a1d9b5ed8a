"""The fleet's job figures, four of the five numbers, from the store's records: queue wait,
checkpoint age, failover success and preemption rate. Pure: records and `now` in, one frozen
value out; `None` where a number is undefined (nothing to measure), never 0 in its place.

Definitions (docs/design.md, in words and here in code):

- **Queue wait**: submit -> first start (`Job.first_started_at`), over the jobs that first started
  within the window, p50 and p95; plus the job that has waited longest and is still waiting (queued,
  never started).
- **Checkpoint age**: now − the newest committed checkpoint, per running job; max and p95 over
  running jobs. A running job with no committed checkpoint yet counts from its first start
  (everything it did is at risk) and is counted in `checkpoint_missing`.
- **Failover success %**: failovers — incarnations ended because their node failed or they were
  preempted (`EndReason.NODE_LOST`, `PREEMPTED`; a Slurm requeue is a `NODE_LOST`) within the
  window — whose job was running again (a later incarnation that got a pid, or that Slurm ran)
  within the restart budget (default 10 min) of the moment
  the incarnation was ended / failovers attempted. A failover still inside its budget is not
  counted yet; one whose job an operator cancelled inside the budget is not counted at all. A
  drain's moves are planned, not failovers, and are counted apart: **drain moves** (`DRAINED`:
  jobs a drain moved off a node, and how many of them ran again within the budget).
- **Preemption rate**: spot preemptions per hour over the window (or over the time since the first
  job was submitted, when that is shorter), and % of the spot jobs that ran in the window that were
  preempted at least once in it.

Percentiles are nearest-rank: p of n sorted values is the value at rank ceil(p/100 × n).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuctl.core.jobs.model import Checkpoint, EndReason, Incarnation, Job, JobState

DEFAULT_WINDOW_S = 24 * 3600.0
DEFAULT_RESTART_BUDGET_S = 600.0
# restarts forced on a job: its node failed, or it was preempted (stopped for failover or
# standard work, without a say of its own)
FAILOVER_REASONS = frozenset({EndReason.NODE_LOST, EndReason.PREEMPTED})
DRAIN_REASONS = frozenset({EndReason.DRAINED})  # planned: a drain moved the job


@dataclasses.dataclass(frozen=True, slots=True)
class JobFigures:
    now: float
    window_s: float
    restart_budget_s: float
    # queue wait
    queue_started: int  # jobs whose first start fell in the window
    queue_wait_p50_s: float | None
    queue_wait_p95_s: float | None
    queue_waiting: int  # queued and never started
    queue_oldest_wait_s: float | None
    queue_oldest_job: str | None
    # checkpoint age
    checkpoint_running_jobs: int
    checkpoint_missing: int  # running jobs without a committed checkpoint
    checkpoint_age_max_s: float | None
    checkpoint_age_p95_s: float | None
    checkpoint_oldest_job: str | None
    # failover
    failovers_attempted: int  # decided: succeeded or past the budget
    failovers_succeeded: int
    failovers_pending: int  # still inside the budget
    failover_success_pct: float | None
    # planned moves off drained nodes (never failovers)
    drain_moves: int  # in the window
    drain_moves_restarted: int  # running again within the budget
    # preemption
    preemptions: int
    preemptions_per_hour: float | None
    spot_jobs: int  # spot jobs that ran in the window
    spot_jobs_preempted: int
    spot_preempted_pct: float | None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobFigures:
        """Inverse of `to_dict` (keys it does not write are ignored; the drain counts, added
        later, are 0 in a document written before them)."""
        added = {"drain_moves": 0, "drain_moves_restarted": 0}
        return cls(**{f.name: d.get(f.name, added.get(f.name)) for f in dataclasses.fields(cls)})


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in (0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def job_figures(
    jobs: Iterable[Job],
    incarnations: Iterable[Incarnation],
    newest_checkpoints: Mapping[str, Checkpoint],
    now: float,
    *,
    window_s: float = DEFAULT_WINDOW_S,
    restart_budget_s: float = DEFAULT_RESTART_BUDGET_S,
) -> JobFigures:
    """The numbers at `now`. `newest_checkpoints`: job id -> its newest committed checkpoint."""
    jobs = list(jobs)
    incs = list(incarnations)
    start = now - window_s
    started, p50, p95, waiting, oldest_wait, oldest_job = _queue(jobs, start, now)
    running, missing, age_max, age_p95, age_job = _checkpoints(jobs, newest_checkpoints, now)
    attempted, succeeded, pending, success = _failovers(
        jobs, incs, start, now, restart_budget_s, FAILOVER_REASONS
    )
    drained, drained_ok, drained_pending, _ = _failovers(
        jobs, incs, start, now, restart_budget_s, DRAIN_REASONS
    )
    preempted, per_hour, spot, spot_preempted, spot_pct = _preemptions(
        jobs, incs, start, now, window_s
    )
    return JobFigures(
        now=now,
        window_s=window_s,
        restart_budget_s=restart_budget_s,
        queue_started=started,
        queue_wait_p50_s=p50,
        queue_wait_p95_s=p95,
        queue_waiting=waiting,
        queue_oldest_wait_s=oldest_wait,
        queue_oldest_job=oldest_job,
        checkpoint_running_jobs=running,
        checkpoint_missing=missing,
        checkpoint_age_max_s=age_max,
        checkpoint_age_p95_s=age_p95,
        checkpoint_oldest_job=age_job,
        failovers_attempted=attempted,
        failovers_succeeded=succeeded,
        failovers_pending=pending,
        failover_success_pct=success,
        drain_moves=drained + drained_pending,
        drain_moves_restarted=drained_ok,
        preemptions=preempted,
        preemptions_per_hour=per_hour,
        spot_jobs=spot,
        spot_jobs_preempted=spot_preempted,
        spot_preempted_pct=spot_pct,
    )


def _queue(
    jobs: list[Job], start: float, now: float
) -> tuple[int, float | None, float | None, int, float | None, str | None]:
    waits = [
        max(0.0, j.first_started_at - j.submitted_at)
        for j in jobs
        if j.first_started_at is not None and start <= j.first_started_at <= now
    ]
    waiting = sorted(
        (j for j in jobs if j.state is JobState.QUEUED and j.first_started_at is None),
        key=lambda j: (j.submitted_at, j.id),
    )
    oldest = waiting[0] if waiting else None
    return (
        len(waits),
        percentile(waits, 50),
        percentile(waits, 95),
        len(waiting),
        None if oldest is None else max(0.0, now - oldest.submitted_at),
        None if oldest is None else oldest.id,
    )


def _checkpoints(
    jobs: list[Job], newest: Mapping[str, Checkpoint], now: float
) -> tuple[int, int, float | None, float | None, str | None]:
    ages: list[tuple[float, str]] = []
    missing = 0
    for j in jobs:
        if j.state is not JobState.RUNNING:
            continue
        ckpt = newest.get(j.id)
        if ckpt is not None:
            since: float | None = ckpt.committed_at
        else:
            missing += 1
            since = j.first_started_at
        if since is not None:
            ages.append((max(0.0, now - since), j.id))
    running = sum(1 for j in jobs if j.state is JobState.RUNNING)
    if not ages:
        return running, missing, None, None, None
    worst = max(ages, key=lambda a: (a[0], a[1]))
    return running, missing, worst[0], percentile([a for a, _ in ages], 95), worst[1]


def _failovers(
    jobs: list[Job],
    incs: list[Incarnation],
    start: float,
    now: float,
    budget_s: float,
    reasons: frozenset[EndReason],
) -> tuple[int, int, int, float | None]:
    by_job: dict[str, list[Incarnation]] = {}
    for inc in incs:
        by_job.setdefault(inc.job_id, []).append(inc)
    job_of = {j.id: j for j in jobs}
    attempted = succeeded = pending = 0
    for inc in incs:
        if inc.end_reason not in reasons or inc.ended_at is None:
            continue
        t0 = inc.ended_at
        if not start <= t0 <= now:
            continue
        job = job_of.get(inc.job_id)
        # Slurm's runs have no pid (a job record without a full spec counts as gpuctl's)
        slurms = job is not None and getattr(job.spec, "backend", None) is not None
        later = [
            i
            for i in by_job[inc.job_id]
            if i.n > inc.n
            and (i.pid is not None or slurms)
            and i.end_reason is not EndReason.LAUNCH_FAILED
        ]
        again = min(later, key=lambda i: i.n) if later else None
        if again is not None and again.started_at - t0 <= budget_s:
            attempted += 1
            succeeded += 1
            continue
        if again is None and now - t0 < budget_s:
            pending += 1
            continue
        if (
            again is None
            and job is not None
            and job.state is JobState.CANCELLED
            and job.updated_at - t0 < budget_s
        ):
            continue  # the operator cancelled it while it was still inside its budget
        attempted += 1
    pct = None if attempted == 0 else 100.0 * succeeded / attempted
    return attempted, succeeded, pending, pct


def _preemptions(
    jobs: list[Job], incs: list[Incarnation], start: float, now: float, window_s: float
) -> tuple[int, float | None, int, int, float | None]:
    spot = {j.id for j in jobs if j.tier == "spot"}
    preempted_jobs: set[str] = set()
    ran: set[str] = set()
    count = 0
    for inc in incs:
        if inc.job_id not in spot:
            continue
        if inc.started_at <= now and (inc.ended_at is None or inc.ended_at >= start):
            ran.add(inc.job_id)
        if (
            inc.end_reason is EndReason.PREEMPTED
            and inc.ended_at is not None
            and start <= inc.ended_at <= now
        ):
            count += 1
            preempted_jobs.add(inc.job_id)
    first = min((j.submitted_at for j in jobs), default=None)
    observed_s = None if first is None else min(window_s, now - first)
    per_hour = None if not observed_s or observed_s <= 0 else count / (observed_s / 3600.0)
    pct = None if not ran else 100.0 * len(preempted_jobs & ran) / len(ran)
    return count, per_hour, len(ran), len(preempted_jobs & ran), pct
