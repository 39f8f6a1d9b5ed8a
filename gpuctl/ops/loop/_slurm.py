"""The control loop's step for the jobs Slurm runs (`gpuctl submit --backend slurm`): their
state changes are written into the store as the loop writes its own jobs', so `status`,
metrics, the dashboard, reports and `jobs` (which read the store) tell one story.

A job's backend decides who runs it: the loop never launches, stops, fails over nor fences a
Slurm job (`core.jobs.model.is_slurm_run`); it only records what Slurm did. It reads Slurm once
per pass, the poll's own reading (`FleetSnapshot.scheduler`: the `squeue --json` of the
gather), and, for a job that Slurm lists no more, the exit marker its batch script wrote (one
command, once).

What it records (events by the loop, actor "gpuctl"):

- queued, Slurm's reason in the job's reason (changed without an event);
- running: an incarnation per Slurm run, numbered as the job's `GPUCTL_INCARNATION` (Slurm's
  restart count + 1), on the node and cards Slurm gave it (`gres_detail`), started when Slurm
  started it; its cards are Slurm's (the Slurm view counts them, `ops.fleetstatus`);
- a requeue (Slurm runs it again, or holds it pending with a higher restart count): the run
  ends as `node_lost`, a forced restart the failover figure counts, and the job is queued;
- the end: succeeded or failed by the exit marker (failed by Slurm's word when there is none),
  cancelled when Slurm says CANCELLED; a job `gpuctl cancel` cancelled gets its run closed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuctl.core.jobs.model import (
    CardClash,
    EndReason,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
)
from gpuctl.core.scheduler import SchedJob, SchedQueued, SchedulerView
from gpuctl.errors import GpuctlError

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Pass

KIND = "slurm"
# Slurm's job states, in gpuctl's words
QUEUED = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD"}
)
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"})


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    """One Slurm job as this pass's poll read it: its state word, Slurm's reason, the run
    number it is at (restart count + 1), and where it runs (node and cards, when it does)."""

    state: str
    reason: str | None
    n: int
    node: str | None = None
    cards: tuple[int, ...] = ()
    started_at: float | None = None

    @property
    def running(self) -> bool:
        return self.state in RUNNING


def readings(view: SchedulerView) -> dict[str, Reading]:
    """Each job of the view by its Slurm id (a job on several nodes: its first)."""
    out = {q.job_id: _queued(q) for q in view.queue}
    for j in view.jobs:
        if j.job_id not in out:
            out[j.job_id] = _running(j)
    return out


def _queued(q: SchedQueued) -> Reading:
    return Reading(q.state, q.reason, q.restarts + 1, q.nodes if q.state in RUNNING else None)


def _running(j: SchedJob) -> Reading:
    return Reading(j.state, None, j.restarts + 1, j.node, j.cards, j.started_at)


def exit_markers(p: Pass, jobs: list[Job]) -> dict[str, tuple[int, int] | None]:
    """(incarnation, exit code) each job's batch script wrote when its command ended (None: no
    marker), read where the Slurm commands run. Tests replace this function."""
    from gpuctl.adapters.slurm import exit_marker
    from gpuctl.ops.slurm import slurm_commands

    source = p.loop.inventory.slurm
    if source is None:
        raise GpuctlError("the inventory reads no Slurm cluster")
    with slurm_commands(source) as commands:
        return {j.id: exit_marker(commands, j.spec.backend.run_dir) for j in jobs if j.spec.backend}


def track(p: Pass) -> None:
    """Record the state changes of every Slurm job of the store since the last pass."""
    ours = [j for j in p.store.jobs() if j.spec.backend is not None and j.spec.backend.kind == KIND]
    if not ours:
        return
    live = {i.job_id: i for i in p.store.incarnations(holding=True)}
    ours = [j for j in ours if not j.state.terminal or j.id in live]
    view = p.snapshot.scheduler
    if not ours:
        return
    if view is None or view.error is not None:
        why = "the inventory reads no Slurm cluster" if view is None else view.error
        p.note(KIND, f"Slurm not read this pass ({why}): its jobs keep their states")
        return
    found = readings(view)
    gone = [j for j in ours if j.spec.backend and found.get(j.spec.backend.id) is None]
    gone = [j for j in gone if not j.state.terminal]
    markers: dict[str, tuple[int, int] | None] = {}
    if gone:
        try:
            markers = exit_markers(p, gone)
        except GpuctlError as exc:  # they end at a pass that can read how
            p.note(KIND, f"exit markers not read ({exc.message}): those jobs wait")
            ours = [j for j in ours if j not in gone]
    for job in ours:
        backend = job.spec.backend
        assert backend is not None
        reading = found.get(backend.id)
        p.guard(_track_one, p, job, live.get(job.id), reading, markers.get(job.id))


def _track_one(
    p: Pass,
    job: Job,
    inc: Incarnation | None,
    reading: Reading | None,
    marker: tuple[int, int] | None,
) -> None:
    sid = job.spec.backend.id if job.spec.backend else "?"
    if inc is not None and (reading is None or not reading.running or reading.n > inc.n):
        requeued = reading is not None and not _ended(reading)
        inc = _end_run(p, job, inc, reading, marker, requeued)
        job = p.store.job(job.id) or job
    elif inc is not None and inc.state is IncarnationState.LAUNCHING and not p.dry:
        p.store.update_incarnation(  # its start was written, not yet its confirmation
            job.id, inc.n, expect=IncarnationState.LAUNCHING, state=IncarnationState.RUNNING
        )
    if job.state.terminal:
        return
    if reading is None or _ended(reading):
        _end_job(p, job, inc, reading, marker)
        return
    if reading.running and reading.node and reading.cards:
        if inc is None or inc.state is not IncarnationState.RUNNING:
            while (
                job.incarnation + 1 < reading.n and not p.dry
            ):  # runs Slurm made while gpuctl did not look
                job = _unseen_run(p, job, reading)
            if job.incarnation < reading.n:
                _start(p, job, reading)
        return
    words = f"Slurm job {sid}: {reading.state}" + (f" ({reading.reason})" if reading.reason else "")
    if job.state is JobState.QUEUED and job.reason != words and not p.dry:
        p.store.update_job(job.id, expect=JobState.QUEUED, reason=words)


def _ended(reading: Reading) -> bool:
    return reading.state not in QUEUED and reading.state not in RUNNING


def _capacity(p: Pass, node: str, cards: tuple[int, ...]) -> dict[tuple[str, int], int]:
    snap = next((n for n in p.snapshot.nodes if n.name == node), None)
    gpus = {g.index: g for g in (snap.gpus if snap is not None else ())}
    return {(node, c): (gpus[c].mem_total_mib or 1) if c in gpus else 1 for c in cards}


def _start(p: Pass, job: Job, reading: Reading) -> None:
    """Slurm runs the job: its incarnation `reading.n` on Slurm's node and cards."""
    assert reading.node is not None and job.spec.backend is not None
    capacity = _capacity(p, reading.node, reading.cards)
    snap = next((n for n in p.snapshot.nodes if n.name == reading.node), None)
    uuids = {g.index: g.uuid for g in (snap.gpus if snap is not None else ())}
    gpu_uuids = tuple(uuids.get(c) or "" for c in reading.cards)
    inc = Incarnation(
        job_id=job.id,
        n=reading.n,
        node=reading.node,
        cards=reading.cards,
        gpu_uuids=gpu_uuids if all(gpu_uuids) else (),
        mib_per_card=max(capacity.values()),
        whole=True,
        state=IncarnationState.RUNNING,
        started_at=reading.started_at or p.now,
        run_dir=job.spec.backend.run_dir,
    )
    cards = ",".join(str(c) for c in reading.cards)
    message = (
        f"Slurm runs {job.id} (Slurm job {job.spec.backend.id}) on {reading.node}, cards "
        f"{cards}: incarnation {reading.n}"
    )
    if p.dry:
        p.record("slurm_running", message, job=job.id, node=reading.node, inc=reading.n)
        return
    event = p.event("slurm_running", message, job=job.id, node=reading.node, inc=reading.n)
    # what Slurm did, recorded as it is: a cordon of gpuctl's, or cards the store says another
    # job holds, refuse nothing here (the job would read queued while Slurm runs it)
    _, clashes = p.store.record_run(inc, capacity_mib=capacity, event=event)
    p.record("slurm_running", message, job=job.id, node=reading.node, inc=reading.n)
    for clash in clashes:
        _clash(p, job, inc, clash)


def _clash(p: Pass, job: Job, inc: Incarnation, clash: CardClash) -> None:
    """Slurm's run took a card the store gives another job: two owners of one card, a finding
    (an event; `db check --fleet` lists it until one of them lets the card go)."""
    sid = job.spec.backend.id if job.spec.backend else "?"
    other = (
        f"a reservation of job {clash.job_id}"
        if clash.n is None
        else f"job {clash.job_id} incarnation {clash.n}"
    )
    message = (
        f"card {clash.card} of {clash.node} has two owners: Slurm runs {job.id} (Slurm job "
        f"{sid}) incarnation {inc.n} there, and gpuctl's store gives it to {other}"
    )
    data = {"card": clash.card, "holder": clash.job_id, "holder_inc": clash.n}
    event = p.event(
        "card_clash", message, job=job.id, node=clash.node, inc=inc.n, outcome="failed", data=data
    )
    p.store.append_event(event)
    p.record("card_clash", message, job=job.id, node=clash.node, inc=inc.n, outcome="failed")


def _unseen_run(p: Pass, job: Job, reading: Reading) -> Job:
    """A run Slurm made (and requeued) between two passes: recorded as started and lost, so the
    incarnation numbers stay the job's `GPUCTL_INCARNATION`."""
    n = job.incarnation + 1
    _start(p, job, dataclasses.replace(reading, n=n, started_at=p.now))
    inc = p.store.incarnations(job.id)[-1]
    _end_run(p, p.store.job(job.id) or job, inc, reading, None, requeued=True)
    return p.store.job(job.id) or job


def _end_run(
    p: Pass,
    job: Job,
    inc: Incarnation,
    reading: Reading | None,
    marker: tuple[int, int] | None,
    requeued: bool,
) -> Incarnation:
    sid = job.spec.backend.id if job.spec.backend else "?"
    code = marker[1] if marker is not None and marker[0] == inc.n else None
    where = f"incarnation {inc.n} of {job.id} on {inc.node}"
    if requeued:
        message = f"Slurm requeued job {sid}: {where} ended (a forced restart)"
        reason, state = EndReason.NODE_LOST, IncarnationState.EXITED
    elif job.state is JobState.CANCELLED or (reading is not None and reading.state == "CANCELLED"):
        message = f"Slurm job {sid} cancelled: {where} ended"
        reason, state = EndReason.CANCELLED, IncarnationState.KILLED
    else:
        status = "without an exit status" if code is None else f"with status {code}"
        message = f"Slurm job {sid}: {where} exited {status}"
        reason, state = EndReason.EXITED, IncarnationState.EXITED
    done = p.update_inc(
        inc, inc.state, "slurm_exit", message, state=state, exit_code=code, end_reason=reason
    )
    if requeued and job.state is JobState.RUNNING:
        why = f"Slurm job {sid}: requeued (restart {inc.n})"
        p.update_job(job, "requeue", f"{job.id}: {why}", state=JobState.QUEUED, reason=why)
    return done


def _end_job(
    p: Pass,
    job: Job,
    inc: Incarnation | None,
    reading: Reading | None,
    marker: tuple[int, int] | None,
) -> None:
    sid = job.spec.backend.id if job.spec.backend else "?"
    word = "its batch script wrote no exit status"
    if reading is not None and reading.state == "CANCELLED":
        state, why = JobState.CANCELLED, f"Slurm job {sid}: CANCELLED"
    elif marker is not None:
        state = JobState.SUCCEEDED if marker[1] == 0 else JobState.FAILED
        why = f"Slurm job {sid}: exited {marker[1]}"
    elif reading is not None:
        state = JobState.SUCCEEDED if reading.state == "COMPLETED" else JobState.FAILED
        why = f"Slurm job {sid}: {reading.state}" + (
            f" ({reading.reason})" if reading.reason else ""
        )
    else:
        state, why = JobState.FAILED, f"Slurm job {sid}: Slurm lists it no more and {word}"
    kind = {JobState.SUCCEEDED: "succeeded", JobState.CANCELLED: "cancel"}.get(state, "failed")
    outcome = "failed" if state is JobState.FAILED else "ok"
    reason = None if state is JobState.SUCCEEDED else why
    p.update_job(job, kind, f"{job.id} {state}: {why}", state=state, reason=reason, outcome=outcome)


def slurm_ids(jobs: Mapping[str, Job]) -> dict[str, str]:
    """Slurm job id -> gpuctl job id, for the jobs Slurm runs."""
    return {j.spec.backend.id: j.id for j in jobs.values() if j.spec.backend is not None}
