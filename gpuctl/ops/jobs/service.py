"""The job services behind `gpuctl submit`, `jobs list|show` and `cancel`, and the numbers
behind `gpuctl status`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuctl.adapters.protocols import Clock, Store
from gpuctl.config.jobspec import spec_document
from gpuctl.config.jobspec_files import LoadedSpec
from gpuctl.core.jobs import figures as core_numbers
from gpuctl.core.jobs.model import Checkpoint, Event, Incarnation, Job, JobState
from gpuctl.errors import GpuctlError, JobSpecError, StateError, StoreConflict
from gpuctl.ops.jobs.spec import new_job_id, resolve_secrets

ACTIVE = (JobState.QUEUED, JobState.RUNNING, JobState.HELD)
RECENT_EVENTS = 20


class JobNotFound(GpuctlError):
    """No job with that id or name."""


# --- submit -----------------------------------------------------------------------------------


def submit(
    store: Store,
    specs: Sequence[LoadedSpec],
    *,
    actor: str,
    clock: Clock,
    env: Mapping[str, str] | None = None,
    replace: bool = False,
    token: Callable[[], str] | None = None,
) -> list[Job]:
    """Queue one job per spec. Every spec is checked before any job is added: a command, its
    secrets (read from `env`, default this process's environment, and dropped), and no active
    job of the same name (with `replace`, that job is cancelled first)."""
    for loaded in specs:
        if not loaded.spec.command:
            raise JobSpecError(
                "missing required key 'command'", path=loaded.source, field=loaded.spec.name
            )
        resolve_secrets(loaded.spec, os.environ if env is None else env)
    active = {j.name: j for j in store.jobs(ACTIVE)}
    clashes = [active[s.spec.name] for s in specs if s.spec.name in active]
    if clashes and not replace:
        old = clashes[0]
        raise GpuctlError(
            f"job name {old.name!r} is already active as {old.id} ({old.state})",
            hint=f"cancel it first (gpuctl cancel {old.id}), or submit with --replace",
        )
    for old in clashes:
        cancel(store, old.id, actor=actor, clock=clock, why="replaced by a new submission")
    return [_add(store, loaded, actor=actor, now=clock.now(), token=token) for loaded in specs]


def _add(
    store: Store, loaded: LoadedSpec, *, actor: str, now: float, token: Callable[[], str] | None
) -> Job:
    spec = loaded.spec
    for _ in range(8):
        job = Job(
            id=new_job_id(spec.name, token),
            name=spec.name,
            spec=spec,
            state=JobState.QUEUED,
            priority=spec.request.priority,
            tier=spec.request.tier.value,
            submitted_at=now,
            updated_at=now,
            owner=actor,
        )
        event = Event(
            at=now,
            actor=actor,
            kind="submit",
            message=f"submitted {job.id} ({job.tier}, priority {job.priority})",
            job_id=job.id,
            outcome="ok",
            data={"source": loaded.source},
        )
        try:
            store.add_job(job, event)
        except StoreConflict:
            continue  # the id is taken: draw another
        return job
    raise StateError(f"could not find a free job id for {spec.name}")


# --- list and show ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class JobView:
    """A job with its current incarnation and newest committed checkpoint."""

    job: Job
    current: Incarnation | None
    checkpoint: Checkpoint | None


@dataclasses.dataclass(frozen=True, slots=True)
class JobDetail:
    view: JobView
    incarnations: tuple[Incarnation, ...]
    events: tuple[Event, ...]


def _view(store: Store, job: Job, incs: Sequence[Incarnation] | None = None) -> JobView:
    incs = store.incarnations(job.id) if incs is None else incs
    current = next((i for i in incs if i.n == job.incarnation), None)
    checkpoints = store.checkpoints(job.id)
    return JobView(job, current, checkpoints[0] if checkpoints else None)


def list_jobs(
    store: Store, *, include_done: bool = False, owner: str | None = None
) -> list[JobView]:
    """Active jobs (queued, running, held), oldest submission first; `include_done`: every job;
    `owner`: only the jobs that user submitted."""
    jobs = store.jobs(None if include_done else ACTIVE)
    if owner is not None:
        jobs = [j for j in jobs if j.owner == owner]
    jobs.sort(key=lambda j: (j.submitted_at, j.id))
    by_job: dict[str, list[Incarnation]] = {j.id: [] for j in jobs}
    for inc in store.incarnations():  # one read for all, not one per job
        if inc.job_id in by_job:
            by_job[inc.job_id].append(inc)
    return [_view(store, j, by_job[j.id]) for j in jobs]


def find_job(store: Store, ref: str) -> Job:
    job = store.job(ref)
    if job is None:
        raise JobNotFound(f"no job {ref!r}", hint="`gpuctl jobs list --all` shows every job")
    return job


def show_job(store: Store, ref: str, *, events: int = RECENT_EVENTS) -> JobDetail:
    """A job by id or name (the newest of that name), its incarnations and recent events."""
    job = find_job(store, ref)
    incs = sorted(store.incarnations(job.id), key=lambda i: i.n)
    recent = store.events(job_id=job.id, limit=events)
    return JobDetail(_view(store, job, incs), tuple(incs), tuple(recent))


def placed(view: JobView) -> Incarnation | None:
    """The incarnation that says where the job is: none while it waits (queued or held)."""
    if view.job.state in (JobState.QUEUED, JobState.HELD):
        return None
    return view.current


def job_summary(view: JobView, now: float) -> dict[str, Any]:
    """One job as plain data (`jobs list -o json`)."""
    job, ckpt, inc = view.job, view.checkpoint, placed(view)
    wait = None if job.first_started_at is None else job.first_started_at - job.submitted_at
    return {
        "id": job.id,
        "name": job.name,
        "owner": job.owner or None,
        "state": job.state.value,
        "reason": job.reason,
        "tier": job.tier,
        "priority": job.priority,
        "node": None if inc is None else inc.node,
        "gpus": [] if inc is None else list(inc.cards),
        "gpu_uuids": [] if inc is None else list(inc.gpu_uuids),
        "mib_per_card": None if inc is None else inc.mib_per_card,
        "incarnation": job.incarnation,
        "restarts": job.restarts,
        "submitted_at": job.submitted_at,
        "first_started_at": job.first_started_at,
        "queue_wait_s": wait,
        "cancel_requested": job.cancel_requested,
        "checkpoint": None
        if ckpt is None
        else {
            "step": ckpt.step,
            "age_s": max(0.0, now - ckpt.committed_at),
            "incarnation": ckpt.incarnation,
            "committed_at": ckpt.committed_at,
            "path": ckpt.path,
            "location": ckpt.location,
        },
        "command": list(job.spec.command),
    }


def job_document(detail: JobDetail, now: float) -> dict[str, Any]:
    """One job in full (`jobs show -o json`): the summary, its spec, incarnations, events."""
    doc = job_summary(detail.view, now)
    doc["spec"] = spec_document(detail.view.job.spec)
    doc["incarnations"] = [_inc_dict(i) for i in detail.incarnations]
    doc["events"] = [_event_dict(e) for e in detail.events]
    return doc


def _inc_dict(inc: Incarnation) -> dict[str, Any]:
    d = dataclasses.asdict(inc)
    d["cards"], d["gpu_uuids"] = list(inc.cards), list(inc.gpu_uuids)
    d["state"] = inc.state.value
    d["end_reason"] = None if inc.end_reason is None else inc.end_reason.value
    return d


def _event_dict(event: Event) -> dict[str, Any]:
    d = dataclasses.asdict(event)
    d["data"] = dict(event.data)
    return d


# --- cancel -----------------------------------------------------------------------------------


def cancel(
    store: Store,
    ref: str,
    *,
    actor: str,
    clock: Clock,
    force: bool = False,
    why: str | None = None,
) -> Job:
    """Cancel a job. Waiting (queued, held): cancelled at once. Running: `cancel_requested` is
    set and the control loop stops it (SIGTERM, KILL after the job's grace; `force`: KILL at
    once, read with `cancel_is_forced`). A job already cancelled is left as it is."""
    for _ in range(5):
        job = find_job(store, ref)
        now = clock.now()
        words = why or f"cancelled by {actor}"
        data = {"force": force, "was": job.state.value}
        try:
            if job.state is JobState.CANCELLED:
                return job
            if job.state.terminal:
                raise GpuctlError(f"job {job.id} already {job.state}: nothing to cancel")
            if job.state is JobState.RUNNING:
                if job.cancel_requested and not force:
                    return job
                kind = "KILL at once" if force else "SIGTERM, then KILL after the grace"
                event = Event(now, actor, "cancel", f"{words}: {kind}", job.id, None, "ok", data)
                return store.update_job(
                    job.id,
                    expect=JobState.RUNNING,
                    event=event,
                    cancel_requested=True,
                    reason=words,
                    updated_at=now,
                )
            event = Event(now, actor, "cancel", words, job.id, None, "ok", data)
            return store.update_job(
                job.id,
                expect=job.state,
                event=event,
                state=JobState.CANCELLED,
                cancel_requested=True,
                reason=words,
                updated_at=now,
            )
        except StoreConflict:
            continue  # the control loop moved the job meanwhile: look again
    raise StateError(f"job {ref} keeps changing under the cancel; try again")


def cancel_is_forced(store: Store, job_id: str) -> bool:
    """For the control loop: did the newest cancel of this job ask for KILL at once?"""
    found = store.events(job_id=job_id, kinds=["cancel"], limit=1)
    return bool(found and found[-1].data.get("force"))


# --- the numbers --------------------------------------------------------------------------------


def fleet_numbers(
    store: Store,
    now: float,
    *,
    window_s: float = core_numbers.DEFAULT_WINDOW_S,
    restart_budget_s: float = core_numbers.DEFAULT_RESTART_BUDGET_S,
) -> core_numbers.JobFigures:
    """Queue wait, checkpoint age, failover success and preemption rate from the store
    (`gpuctl status`: a table line and `numbers` in `-o json`)."""
    jobs = store.jobs()
    incs = store.incarnations()
    newest: dict[str, Checkpoint] = {}
    for j in jobs:
        if j.state is JobState.RUNNING:
            found = store.checkpoints(j.id)
            if found:
                newest[j.id] = found[0]
    return core_numbers.job_figures(
        jobs, incs, newest, now, window_s=window_s, restart_budget_s=restart_budget_s
    )


def operator(env: Mapping[str, str] | None = None) -> str:
    """Who is acting, for the audit log: $USER, $LOGNAME, else the login name."""
    env = os.environ if env is None else env
    name = env.get("USER") or env.get("LOGNAME")
    if name:
        return name
    import getpass

    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"
