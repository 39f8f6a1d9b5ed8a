"""Jobs that Slurm runs and gpuctl tracks (`gpuctl submit --backend slurm`).

A job's backend decides who runs it: `JobSpec.backend` None, gpuctl's control loop places,
launches, fails over and fences it; `Backend(kind="slurm")`, Slurm does all of that and gpuctl
only submits (`sbatch`, with `place --emit sbatch`'s options: where gpuctl would put it), reads
its state (`squeue`, then the exit marker the batch script writes), its output and cancels it
(`scancel`). The control loop never launches, fails over nor fences such a job, and the fleet
check does not count its processes as strays (`core.jobs.model.is_slurm_run`).

The store keeps the Slurm job id in the job's spec (`backend`: the id is fixed for the job's
life, a requeue keeps it, and it is known before the job's row is written: sbatch first, then
the row), so no schema change: old rows read as gpuctl's own jobs.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from gpuctl.adapters.protocols import Clock, Store, Transport
from gpuctl.adapters.slurm import (
    SlurmCommands,
    SlurmJobState,
    batch_script,
    exit_marker,
    job_states,
    read_output,
    sbatch,
    scancel,
)
from gpuctl.config.jobspec_files import LoadedSpec
from gpuctl.core.jobs.model import Event, Job, JobState
from gpuctl.core.jobs.spec import Backend
from gpuctl.core.model import FleetSnapshot, SlurmSource
from gpuctl.core.placement.model import Settings
from gpuctl.errors import GpuctlError, PlanError, StoreConflict, UsageError
from gpuctl.ops.jobs.logs import LogChunk
from gpuctl.ops.jobs.service import ACTIVE, find_job
from gpuctl.ops.jobs.spec import new_job_id, resolve_secrets
from gpuctl.ops.place import place_for_slurm

SLURM = "slurm"
# Slurm's job states and what gpuctl calls them
_QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD"}
_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
_DONE = {"COMPLETED": JobState.SUCCEEDED, "CANCELLED": JobState.CANCELLED}
FOLLOW_EVERY_S = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class SlurmSeen:
    """A Slurm job as gpuctl reads it now: its state in gpuctl's words, the reason, the node."""

    state: JobState
    reason: str
    node: str | None = None
    incarnation: int = 0


def commands_for(
    source: SlurmSource | None, transport: Callable[[], Transport] | None
) -> tuple[SlurmCommands, Transport | None]:
    """The Slurm commands of the inventory's cluster (and the transport to close after)."""
    if source is None:
        raise UsageError(
            "--backend slurm: the inventory reads no Slurm cluster",
            hint="add a slurm: section to the inventory (docs/slurm.md)",
        )
    if source.via != "ssh":
        return SlurmCommands(source), None
    if transport is None:
        from gpuctl.ops.slurm import _ssh

        transport = _ssh
    opened = transport()
    return SlurmCommands(source, opened), opened


# --- submit ------------------------------------------------------------------------------------


def submit(
    store: Store,
    specs: Sequence[LoadedSpec],
    commands: SlurmCommands,
    snapshot: FleetSnapshot,
    *,
    actor: str,
    clock: Clock,
    env: Mapping[str, str] | None = None,
) -> list[Job]:
    """Place each job on Slurm's nodes as `place --emit sbatch` does, submit it through `sbatch`
    with those options and record it (state queued until Slurm runs it). Everything is checked
    before anything is submitted: secrets, no active job of the same name, a placement."""
    env = os.environ if env is None else env
    secrets = {s.spec.name: resolve_secrets(s.spec, env) for s in specs}
    active = {j.name: j for j in store.jobs(ACTIVE)}
    for loaded in specs:
        old = active.get(loaded.spec.name)
        if old is not None:
            raise GpuctlError(
                f"job name {old.name!r} is already active as {old.id} ({old.state})",
                hint=f"cancel it first (gpuctl cancel {old.id})",
            )
    plan, emitted = place_for_slurm([s.spec.request for s in specs], Settings(), snapshot, store)
    for unplaced in plan.unplaced:
        raise PlanError(
            f"{unplaced.job}: no Slurm node can take it now: {unplaced.reason}",
            hint="`gpuctl place JOB.yaml --emit sbatch --explain` says why",
        )
    options = {e.job: e for e in emitted}
    cards = {p.job: p.allocation.mib_per_card for p in plan.placed}
    added = []
    for loaded in specs:
        spec, chosen = loaded.spec, options[loaded.spec.name]
        job_id = new_job_id(spec.name)
        script = batch_script(
            job_id=job_id,
            argv=spec.command,
            checkpoint_dir=spec.policy.checkpoint.dir_for(job_id)
            if spec.policy.checkpoint.dir
            else "",
            mib_per_card=cards.get(spec.name, 0),
            env=spec.env,
            header=chosen.script_lines(),
        )
        done = sbatch(
            commands,
            job_id=job_id,
            options=chosen.options,
            script=script,
            secrets=secrets[spec.name],
            workdir=spec.workdir,
        )
        now = clock.now()
        backend = Backend(SLURM, done.slurm_id, done.run_dir, commands.source.cluster)
        job = Job(
            id=job_id,
            name=spec.name,
            spec=dataclasses.replace(spec, backend=backend),
            state=JobState.QUEUED,
            priority=spec.request.priority,
            tier=spec.request.tier.value,
            submitted_at=now,
            updated_at=now,
            owner=actor,
            reason=f"Slurm job {done.slurm_id}: submitted",
        )
        event = Event(
            at=now,
            actor=actor,
            kind="submit",
            message=f"submitted {job_id} to Slurm as job {done.slurm_id} on {chosen.node}",
            job_id=job_id,
            node=chosen.node,
            outcome="ok",
            data={
                "source": loaded.source,
                "backend": SLURM,
                "slurm_job_id": done.slurm_id,
                "options": list(chosen.options),
            },
        )
        try:
            store.add_job(job, event)
        except StoreConflict:
            scancel(commands, done.slurm_id)
            raise
        added.append(job)
    return added


# --- state ---------------------------------------------------------------------------------------


def seen(job: Job, state: SlurmJobState | None, marker: tuple[int, int] | None) -> SlurmSeen:
    """What `job` is now, from Slurm's listing of it (None: Slurm lists it no more) and its exit
    marker (incarnation, exit code; read when Slurm lists it no more)."""
    backend = job.spec.backend
    sid = backend.id if backend is not None else "?"
    if state is not None:
        inc = state.restarts + 1
        why = f" ({state.reason})" if state.reason else ""
        words = f"Slurm job {sid}: {state.state}{why}"
        if state.state in _QUEUED:
            return SlurmSeen(JobState.QUEUED, words, None, inc)
        if state.state in _RUNNING:
            return SlurmSeen(JobState.RUNNING, words, state.nodes, inc)
        return SlurmSeen(_DONE.get(state.state, JobState.FAILED), words, state.nodes, inc)
    if job.state is JobState.CANCELLED:
        return SlurmSeen(JobState.CANCELLED, job.reason or "cancelled", None, job.incarnation)
    if marker is not None:
        n, code = marker
        done = JobState.SUCCEEDED if code == 0 else JobState.FAILED
        return SlurmSeen(done, f"Slurm job {sid}: exited {code}", None, n)
    return SlurmSeen(
        JobState.FAILED, f"Slurm job {sid}: Slurm lists it no more and it wrote no exit status"
    )


def read_seen(commands: SlurmCommands, jobs: Sequence[Job]) -> dict[str, SlurmSeen]:
    """`seen` of each Slurm job of `jobs` still active in the store: one `squeue`, and the exit
    marker of each that Slurm lists no more."""
    mine = [j for j in jobs if j.spec.backend is not None and not j.state.terminal]
    if not mine:
        return {}
    states = job_states(commands, [j.spec.backend.id for j in mine if j.spec.backend])
    out = {}
    for job in mine:
        assert job.spec.backend is not None
        state = states.get(job.spec.backend.id)
        marker = None if state is not None else exit_marker(commands, job.spec.backend.run_dir)
        out[job.id] = seen(job, state, marker)
    return out


# --- cancel and logs ---------------------------------------------------------------------------


def cancel(store: Store, commands: SlurmCommands, job: Job, *, actor: str, clock: Clock) -> Job:
    """`scancel` the job, then record it cancelled."""
    backend = job.spec.backend
    assert backend is not None
    if job.state is JobState.CANCELLED:
        return job
    if job.state.terminal:
        raise GpuctlError(f"job {job.id} already {job.state}: nothing to cancel")
    scancel(commands, backend.id)
    now = clock.now()
    words = f"cancelled by {actor} (scancel {backend.id})"
    event = Event(now, actor, "cancel", words, job.id, None, "ok", {"slurm_job_id": backend.id})
    return store.update_job(
        job.id,
        expect=job.state,
        event=event,
        state=JobState.CANCELLED,
        cancel_requested=True,
        reason=words,
        updated_at=now,
    )


def read_logs(
    store: Store, commands: SlurmCommands, ref: str, *, follow: bool = False
) -> Iterator[LogChunk]:
    """The job's output file (on the cluster's shared file system, read where the Slurm
    commands run); with `follow`, until Slurm no longer runs it."""
    job = find_job(store, ref)
    backend = job.spec.backend
    assert backend is not None
    offset = 0
    while True:
        data = read_output(commands, backend.output, offset)
        if data:
            offset += len(data)
            yield LogChunk(job.incarnation, None, data)
            continue
        if not follow:
            return
        now = read_seen(commands, [job]).get(job.id)
        if now is None or now.state.terminal:
            data = read_output(commands, backend.output, offset)
            if data:
                yield LogChunk(job.incarnation, None, data)
            return
        time.sleep(FOLLOW_EVERY_S)
