"""The control loop's forward steps: hold running jobs to their slices, then place queued jobs
(standard work first, preempting spot work when it needs the room) and launch them: intent,
launch, confirmation. Public: moving jobs (`gpuctl.ops.moves`) reads the fleet as placement sees
it (`fleet_state`) and a job's request (`placement_request`) here."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpuctl.adapters.node import LaunchFailed, LaunchRefused
from gpuctl.core.jobs.model import (
    EndReason,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    is_slurm_run,
)
from gpuctl.core.jobs.preemption import SpotVictim, choose_preemption, fits, without
from gpuctl.core.jobs.queue import queue_order
from gpuctl.core.jobs.slices import SliceUse, slice_verdicts
from gpuctl.core.jobs.spec import SliceEnforcement
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.model import FleetState, JobRequest, Settings, Tier
from gpuctl.core.placement.plan import Placed, apply_plan
from gpuctl.errors import (
    ConfigError,
    GpuctlError,
    LeaseLost,
    StateError,
    StoreConflict,
    StoreUnavailable,
    TransportError,
)
from gpuctl.ops import fleetstatus
from gpuctl.ops.jobs import spec as jobspecs
from gpuctl.ops.loop import _checkpoints, _jobs
from gpuctl.ops.loop.model import Target

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Pass


# --- slices ------------------------------------------------------------------------------------


def hold_slices(p: Pass) -> None:
    """Observed per-process memory against each running incarnation's slice; ghosts reported."""
    running = [
        i
        for i in p.store.incarnations(holding=True)
        if i.state is IncarnationState.RUNNING and i.node in p.answering
    ]
    processes = {
        n.name: n.observation.processes
        for n in p.snapshot.nodes
        if n.name in p.answering and n.observation is not None
    }
    report = slice_verdicts(running, processes)
    for name, node in list(p.node_reports.items()):
        mine = [g for g in report.ghosts if g.node == name]
        if mine:
            p.node_reports[name] = dataclasses.replace(
                node,
                ghost_mib=sum(g.used_mib or 0 for g in mine),
                ghost_pids=tuple(sorted({g.pid for g in mine})),
            )
    by_id = {(i.job_id, i.n): i for i in running}
    for use in report.over:
        inc = by_id[(use.job_id, use.incarnation)]
        p.guard(_over_slice, p, inc, use)


def _over_slice(p: Pass, inc: Incarnation, use: SliceUse) -> None:
    job = p.store.job(inc.job_id)
    if job is None:
        return
    policy = job.spec.policy.slice_enforcement
    message = (
        f"{job.id} uses {use.used_mib} MiB on {use.gpu_uuid} of {inc.node}, over its slice of "
        f"{use.slice_mib} MiB by {use.over_mib} MiB"
    )
    seen = any(
        e.data.get("incarnation") == inc.n
        for e in p.store.events(job_id=job.id, kinds=("over_slice",))
    )
    if not seen:
        p.act(
            "over_slice",
            message,
            job=job.id,
            node=inc.node,
            inc=inc.n,
            outcome=policy.value,
            data={"over_mib": use.over_mib, "used_mib": use.used_mib, "slice_mib": use.slice_mib},
        )
    if policy is SliceEnforcement.STOP:
        _jobs.stop(p, inc, EndReason.OVER_SLICE, "stop", "over its slice")


# --- placement and launch ----------------------------------------------------------------------


def fleet_state(p: Pass) -> tuple[FleetState, dict[str, Job]]:
    """The placement view: the gather, the cards held by live incarnations and reservations,
    the cordons (the same view `gpuctl status` and the dashboard show)."""
    return fleetstatus.fleet_state(p.snapshot, p.store), {j.id: j for j in p.store.jobs()}


def place_and_launch(p: Pass) -> None:
    _jobs.repair(p)
    state, jobs = fleet_state(p)
    moving = {r.job_id for r in p.store.reservations()}  # started on their reservation
    # a job's backend decides who runs it: one Slurm runs (`ops.slurm_jobs`) is never placed,
    # launched, failed over nor fenced here; it holds no incarnation, so only the queue sees it
    queued = [
        j
        for j in p.store.jobs([JobState.QUEUED])
        if not j.cancel_requested and j.id not in moving and not is_slurm_run(j)
    ]
    releasing = {
        i.job_id
        for i in p.store.incarnations(holding=True)
        if i.state is IncarnationState.STOPPING and i.end_reason is EndReason.PREEMPTED
    }
    for tier in (Tier.STANDARD, Tier.SPOT):
        for job in queue_order(
            j for j in queued if (j.tier == Tier.SPOT.value) == (tier is Tier.SPOT)
        ):
            try:
                state = _place_one(p, job, state, jobs, releasing)
            except (StoreConflict, TransportError) as exc:
                p.note("launch", f"{job.id}: {exc}", job=job.id, outcome="skipped")
            except (StoreUnavailable, LeaseLost):  # the store, not the job: the pass stops
                raise
            except (ConfigError, StateError) as exc:
                p.guard(_hold, p, job, exc.message)
            except GpuctlError as exc:  # e.g. a checkpoint copy: this job waits, the pass goes on
                p.note("launch", f"{job.id}: {exc}", job=job.id, outcome="failed")


CPU_ONLY = (
    "a CPU-only job (gpus: 0) is not started by the control loop: `gpuctl place` plans such "
    "jobs, `gpuctl submit` cannot run them yet"
)


def _hold(p: Pass, job: Job, why: str) -> None:
    p.update_job(job, "hold", f"{job.id} held: {why}", state=JobState.HELD, reason=why)


def placement_request(job: Job, jobs: dict[str, Job]) -> JobRequest:
    """The job's placement request: its id as the name, `avoid_jobs` names as live job ids."""
    return jobspecs.job_request(job, jobspecs.ids_by_name(jobs.values()))


def _is_failover(p: Pass, job: Job) -> bool:
    incs = p.store.incarnations(job.id)
    return bool(incs) and incs[-1].end_reason is EndReason.NODE_LOST


def _place_one(
    p: Pass, job: Job, state: FleetState, jobs: dict[str, Job], releasing: set[str]
) -> FleetState:
    req = placement_request(job, jobs)
    if not req.shape.gpus:  # an incarnation is granted cards; the store has none to give it
        _hold(p, job, CPU_ONLY)
        return state
    settings = p.settings.placement
    failover = _is_failover(p, job)
    if failover:  # the headroom is kept for exactly this
        settings = dataclasses.replace(settings, band_max=1.0, headroom=0.0)
    result = plan(state, [req], settings)
    placed = result.placed[0] if result.placed else None
    if placed is None:
        reason = result.unplaced[0].reason
        if req.tier is Tier.STANDARD:
            _preempt_for(p, job, req, state, jobs, releasing, settings, reason)
        else:
            p.note("queued", reason, job=job.id)
        return state
    if _launch(p, job, placed, state):
        return apply_plan(state, result)
    return state


def _preempt_for(
    p: Pass,
    job: Job,
    req: JobRequest,
    state: FleetState,
    jobs: dict[str, Job],
    releasing: set[str],
    settings: Settings,
    reason: str,
) -> None:
    freed = without(state, releasing)
    if releasing and fits(freed, req, settings):
        p.note("queued", "waiting for preempted spot jobs to stop", job=job.id)
        return
    victims = []
    for inc in p.store.incarnations(holding=True):
        other = jobs.get(inc.job_id)
        if (
            other is None
            or other.tier != Tier.SPOT.value
            or is_slurm_run(other)  # Slurm's to preempt, never gpuctl's
            or inc.state is not IncarnationState.RUNNING
            or inc.node not in p.observed
            or inc.job_id in releasing
        ):
            continue
        alloc = next((a for a in state.allocations if a.job == inc.job_id), None)
        if alloc is None:
            continue
        ckpts = [c.committed_at for c in p.store.checkpoints(inc.job_id) if c.incarnation == inc.n]
        victims.append(SpotVictim(inc.job_id, alloc, max(ckpts) if ckpts else None))
    chosen = choose_preemption(freed, req, victims, settings) if victims else None
    if not chosen:
        p.note("queued", reason, job=job.id)
        return
    incs = {(i.job_id): i for i in p.store.incarnations(holding=True)}
    for v in chosen:
        why = f"preempted for {job.id}"
        p.guard(_jobs.stop, p, incs[v.job_id], EndReason.PREEMPTED, "preempt", why)
        releasing.add(v.job_id)


def _launch(p: Pass, job: Job, placed: Placed, state: FleetState) -> bool:
    """Intent, launch, confirmation of a placement. True when the cards are now held."""
    node = placed.node
    if node not in p.specs:
        p.note("launch", f"{job.id}: {node} is not in the inventory", job=job.id)
        return False
    capacity = {(node, c.index): c.capacity_mib for c in state.node(node).cards}
    target = Target(placed.allocation, tuple(u or "" for u in placed.card_uuids))
    return launch_on(p, job, target, capacity)


def launch_on(
    p: Pass,
    job: Job,
    target: Target,
    capacity: dict[tuple[str, int], int],
    *,
    why: str = "",
) -> bool:
    """Intent, launch, confirmation of the job's next incarnation on `target`. True when the
    cards are now held (launched, or the outcome is unknown and will be observed next pass).
    StoreConflict when the store refuses the intent (a card taken, the node cordoned). A job
    that committed checkpoints, none of them usable now, is held for a person instead (False):
    starting it fresh would throw its work away on gpuctl's own say-so."""
    n = job.incarnation + 1
    node = target.node
    secrets = jobspecs.resolve_secrets(job, p.loop.environ)
    resume = _checkpoints.resume_point(p, job, n, node)
    if resume.held is not None:
        _hold(p, job, resume.held)
        return False
    resume_from, resume_step = resume.path, resume.step
    inc = Incarnation(
        job_id=job.id,
        n=n,
        node=node,
        cards=target.cards,
        gpu_uuids=target.gpu_uuids or tuple("" for _ in target.cards),
        mib_per_card=target.allocation.mib_per_card,
        whole=target.allocation.whole,
        state=IncarnationState.LAUNCHING,
        started_at=p.now,
        run_dir=f".gpuctl/runs/{job.id}/{n}",
        resume_step=resume_step,
        cpu_milli=target.allocation.cpu_milli,
        host_mem_mib=target.allocation.host_mem_mib,
        clock_offset_s=_clock_offset(p, node),
    )
    request = jobspecs.launch_request(
        job,
        n,
        inc.cards,
        inc.gpu_uuids,
        inc.mib_per_card,
        resume_from,
        secrets,
        mps_limit_mib=None if inc.whole or not inc.cards else inc.mib_per_card,
    )
    cards = ",".join(str(c) for c in inc.cards) or "none"
    start = f"step {resume_step}" if resume_step is not None else "a fresh start"
    message = f"incarnation {n} of {job.id} on {node} cards {cards}, from {start}{why}"
    if p.dry:
        p.record("launch", message, job=job.id, node=node, inc=n)
        return True
    p.store.begin_launch(
        inc,
        capacity_mib=capacity,
        event=p.event("launch", message, job=job.id, node=node, inc=n, outcome="intent"),
    )
    p.record("launch", message, job=job.id, node=node, inc=n, outcome="intent")
    try:
        run = p.runner.launch(p.spec(node), request)
    except TransportError as exc:
        _unknown(p, job, f"launch outcome unknown ({exc.message})")
        return True
    except LaunchRefused as exc:  # it is on the node already: observed next pass
        _unknown(p, job, exc.message)
        return True
    except LaunchFailed as exc:
        if exc.unknown:
            _unknown(p, job, exc.message)
            return True
        _jobs.launch_failed(p, inc, exc.message)
        return False
    except GpuctlError as exc:
        _jobs.launch_failed(p, inc, exc.message)
        return False
    if not run.alive and run.exit_code is None:
        _jobs.launch_failed(p, inc, "the node reports no process")
        return False
    p.update_inc(
        inc,
        IncarnationState.LAUNCHING,
        "launched",
        f"incarnation {n} of {job.id} runs on {node} (pid {run.pid})",
        state=IncarnationState.RUNNING,
        pid=run.pid,
        run_dir=run.run_dir or inc.run_dir,
    )
    return True


def _unknown(p: Pass, job: Job, why: str) -> None:
    p.note("launch", f"{job.id}: {why}; observed on its node next pass", job=job.id)


def _clock_offset(p: Pass, node: str) -> float | None:
    """The node's clock minus gpuctl's, from this pass's poll of it (None: not polled)."""
    seen = p.snapshot.node(node)
    return None if seen is None else seen.clock_offset_s
