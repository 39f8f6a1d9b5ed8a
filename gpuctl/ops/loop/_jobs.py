"""The control loop's per-job steps: exits and what follows them (succeeded, restart, hold),
stops (cancel, preemption, over-slice) with their grace, failover, and the repair of a job whose
latest incarnation ended without the job being told (gpuctl died between two writes)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpuctl.core.jobs.model import (
    EndReason,
    Fenced,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    is_slurm_run,
)
from gpuctl.core.jobs.restarts import RestartVerdict, restart_decision, run_ends
from gpuctl.core.jobs.spec import DEFAULT_GRACE_S
from gpuctl.core.timefmt import duration
from gpuctl.errors import TransportError
from gpuctl.ops.jobs.service import cancel_is_forced

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Pass

STOP_KINDS = ("stop", "preempt")
REQUEUED = (EndReason.PREEMPTED, EndReason.DRAINED, EndReason.NODE_LOST, EndReason.FENCED)


def confirm_gone(p: Pass, inc: Incarnation) -> Fenced | None:
    """Fence the incarnation on its node (`JobRunner.fence`: kill its process group and every
    process carrying its job id and incarnation, claim its launch) and confirm that nothing of
    it is left. None when that is not known this pass (the node's answer did not arrive whole,
    or a process outlived SIGKILL): nothing may then be recorded as ended, and the next pass
    tries again. Every way an incarnation ends while it may still live goes through here. A dry
    run kills nothing and reads as gone."""
    if p.dry:
        return Fenced(killed=0, remaining=0)
    where = f"incarnation {inc.n} of {inc.job_id} on {inc.node}"
    try:
        fenced = p.runner.fence(p.spec(inc.node), inc.job_id, inc.n)
    except TransportError as exc:
        p.note("fence", f"could not fence {where}: {exc}", job=inc.job_id, node=inc.node)
        return None
    if not fenced.gone:
        p.note(
            "fence",
            f"{where} still has live processes after SIGKILL; its cards stay held and the next "
            "pass tries again",
            job=inc.job_id,
            node=inc.node,
            outcome="failed",
        )
        return None
    return fenced


def ended(p: Pass, inc: Incarnation, exit_code: int | None, why: str | None) -> None:
    """The incarnation's process ended (or its run dir vanished): once nothing of it is left on
    the node (`confirm_gone`), record it, then settle its job."""
    fenced = confirm_gone(p, inc)
    if fenced is None:
        return
    reason = inc.end_reason or EndReason.EXITED
    status = "without an exit status" if exit_code is None else f"with status {exit_code}"
    message = f"incarnation {inc.n} of {inc.job_id} on {inc.node} exited {status}"
    if fenced.killed:
        why = "; ".join(x for x in (why, "processes of it still ran: killed") if x)
    if why:
        message += f" ({why})"
    if inc.state is IncarnationState.STOPPING:
        message += f" after a stop request ({reason.value})"
    done = p.update_inc(
        inc,
        inc.state,
        "exit",
        message,
        state=IncarnationState.EXITED,
        exit_code=exit_code,
        end_reason=reason,
    )
    settle_job(p, done)


def launch_failed(p: Pass, inc: Incarnation, why: str) -> None:
    """A launch that failed: the cards are released, the job settled (it counts as a failure).
    Fenced first: a launch delayed on a node that hung must never start after its next
    incarnation did (the fence claims its launch lock)."""
    if confirm_gone(p, inc) is None:
        return
    done = p.update_inc(
        inc,
        IncarnationState.LAUNCHING,
        "launch_failed",
        f"incarnation {inc.n} of {inc.job_id} did not start on {inc.node}: {why}",
        state=IncarnationState.EXITED,
        end_reason=EndReason.LAUNCH_FAILED,
    )
    settle_job(p, done)


def settle_job(p: Pass, inc: Incarnation) -> None:
    """The job after its latest incarnation `inc` ended, was lost or was killed."""
    job = p.store.job(inc.job_id)
    if job is None or job.incarnation != inc.n or job.state is not JobState.RUNNING:
        return
    reason = inc.end_reason or EndReason.EXITED
    if job.cancel_requested or reason is EndReason.CANCELLED:
        p.update_job(
            job, "cancel", f"{job.id} is cancelled", state=JobState.CANCELLED, reason="cancelled"
        )
        return
    if reason in REQUEUED:
        why = {
            EndReason.PREEMPTED: "preempted to make room for standard work; requeued",
            EndReason.DRAINED: f"drained from {inc.node}; requeued",
            EndReason.NODE_LOST: f"{inc.node} is down; requeued to restart elsewhere from its "
            "newest committed checkpoint",
            EndReason.FENCED: "its copy was fenced; requeued",
        }[reason]
        p.update_job(job, "requeue", f"{job.id}: {why}", state=JobState.QUEUED, reason=why)
        return
    if reason is EndReason.OVER_SLICE:
        why = "held: stopped for using more GPU memory than its slice (see its over_slice event)"
        p.update_job(job, "hold", f"{job.id} {why}", state=JobState.HELD, reason=why)
        return
    if reason is EndReason.EXITED and inc.exit_code == 0:
        p.update_job(job, "succeeded", f"{job.id} succeeded", state=JobState.SUCCEEDED, reason=None)
        return
    restart(p, job, inc)


def restart(p: Pass, job: Job, inc: Incarnation) -> None:
    """After a failure of the job itself: restart within the budget, else hold (or fail, with a
    budget of 0)."""
    budget = job.spec.policy.restart_budget
    policy = dataclasses.replace(p.settings.restarts, budget=budget)
    history = p.store.incarnations(job.id)
    if p.dry:
        history = [inc if i.n == inc.n else i for i in history]
    decision = restart_decision(run_ends(history), p.now, policy)
    failed = (
        "did not start"
        if inc.end_reason is EndReason.LAUNCH_FAILED
        else f"exited with status {inc.exit_code}"
        if inc.exit_code is not None
        else "ended without an exit status"
    )
    if decision.verdict is RestartVerdict.RESTART:
        why = f"{failed}; restarting ({decision.failures_in_window} of {budget} restarts)"
        p.update_job(
            job,
            "restart",
            f"{job.id} {why}",
            state=JobState.QUEUED,
            reason=why,
            restarts=job.restarts + 1,
        )
    elif budget == 0 and not decision.thrashing:
        why = f"{failed}; restart_budget is 0"
        p.update_job(
            job,
            "failed",
            f"{job.id} failed: {why}",
            state=JobState.FAILED,
            outcome="failed",
            reason=why,
        )
    else:
        why = f"{failed}; {decision.reason}"
        p.update_job(job, "hold", f"{job.id} held: {why}", state=JobState.HELD, reason=why)


def stop(p: Pass, inc: Incarnation, reason: EndReason, kind: str, why: str) -> None:
    """SIGTERM (checkpoint and exit within the grace), recorded first as STOPPING."""
    grace = _grace(p, inc.job_id)
    message = f"{why}: SIGTERM to incarnation {inc.n} of {inc.job_id} on {inc.node}, "
    message += f"SIGKILL after {grace:g}s"
    stopping = p.update_inc(
        inc,
        IncarnationState.RUNNING,
        kind,
        message,
        state=IncarnationState.STOPPING,
        end_reason=reason,
    )
    if not p.dry:
        p.runner.signal(p.spec(stopping.node), stopping.job_id, stopping.n, "TERM")


def kill_if_overdue(p: Pass, inc: Incarnation) -> None:
    grace = _grace(p, inc.job_id)
    since = _stop_requested_at(p, inc)
    if p.now - since < grace:
        p.note(
            "stopping",
            f"{inc.job_id}: waiting for incarnation {inc.n} to stop ({duration(p.now - since)} of "
            f"{duration(grace)})",
            job=inc.job_id,
            node=inc.node,
        )
        return
    if confirm_gone(p, inc) is None:
        return
    done = p.update_inc(
        inc,
        IncarnationState.STOPPING,
        "kill",
        f"incarnation {inc.n} of {inc.job_id} on {inc.node} did not stop within {grace:g}s: "
        "SIGKILL",
        state=IncarnationState.KILLED,
    )
    settle_job(p, done)


def cancel(p: Pass, job: Job) -> None:
    if job.state in (JobState.QUEUED, JobState.HELD):
        p.update_job(
            job, "cancel", f"{job.id} is cancelled", state=JobState.CANCELLED, reason="cancelled"
        )
        return
    incs = p.store.incarnations(job.id)
    latest = incs[-1] if incs else None
    if latest is None or latest.n != job.incarnation:
        return
    active = latest.state in (IncarnationState.RUNNING, IncarnationState.STOPPING)
    if active and latest.node not in p.observed:
        p.note("cancel", f"{job.id}: waiting for {latest.node} to answer", job=job.id)
    elif active and cancel_is_forced(p.store, job.id):
        if confirm_gone(p, latest) is None:
            return
        done = p.update_inc(
            latest,
            latest.state,
            "kill",
            f"cancel --force: SIGKILL to incarnation {latest.n} of {job.id} on {latest.node}",
            state=IncarnationState.KILLED,
            end_reason=EndReason.CANCELLED,
        )
        settle_job(p, done)
    elif latest.state is IncarnationState.RUNNING:
        stop(p, latest, EndReason.CANCELLED, "stop", "cancel requested")
    elif latest.state is IncarnationState.STOPPING and latest.end_reason is not EndReason.CANCELLED:
        p.update_inc(
            latest,
            IncarnationState.STOPPING,
            "cancel",
            f"{job.id}: cancel requested while stopping; it will not be requeued",
            end_reason=EndReason.CANCELLED,
        )
    elif latest.state is IncarnationState.LAUNCHING:
        p.note("cancel", f"{job.id}: waiting for its launch to settle", job=job.id)
    elif not latest.state.holds_cards or latest.state is IncarnationState.LOST:
        settle_job(p, latest)


def fail_over(p: Pass, inc: Incarnation) -> None:
    """Its node is down: the incarnation is lost (it keeps its cards until fenced) and the job is
    requeued."""
    live = p.liveness.get(inc.node)
    since = live.failing_since if live is not None else None
    silent = f" for {duration(p.now - since)}" if since is not None else ""
    keep = inc.end_reason in (EndReason.CANCELLED, EndReason.PREEMPTED)
    lost = p.update_inc(
        inc,
        inc.state,
        "failover",
        f"{inc.node} has not answered{silent}: incarnation {inc.n} of {inc.job_id} is lost "
        "(it is killed when the node answers again)",
        state=IncarnationState.LOST,
        end_reason=inc.end_reason if keep else EndReason.NODE_LOST,
        ended_at=p.now,
    )
    settle_job(p, lost)


def repair(p: Pass) -> None:
    """A running job whose latest incarnation is no longer active (gpuctl died between writing
    the incarnation and the job): settle it now."""
    for job in p.store.jobs([JobState.RUNNING]):
        if is_slurm_run(job):
            continue  # Slurm's: `_slurm.track` settles it
        incs = p.store.incarnations(job.id)
        latest = next((i for i in incs if i.n == job.incarnation), None)
        if latest is None:
            continue
        active = latest.state in (
            IncarnationState.LAUNCHING,
            IncarnationState.RUNNING,
            IncarnationState.STOPPING,
        )
        if not active:
            p.guard(settle_job, p, latest)


def _grace(p: Pass, job_id: str) -> float:
    job = p.store.job(job_id)
    return job.spec.policy.grace_s if job is not None else DEFAULT_GRACE_S


def _stop_requested_at(p: Pass, inc: Incarnation) -> float:
    times = [
        e.at
        for e in p.store.events(job_id=inc.job_id, kinds=STOP_KINDS)
        if e.data.get("incarnation") == inc.n
    ]
    return max(times) if times else inc.started_at
