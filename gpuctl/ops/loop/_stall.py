"""The control loop's stall check, run in the health step: a running job that stopped committing
checkpoints (`gpuctl.core.jobs.stall`: past a few times the interval it has been committing at) gets
one `stalled` event (outcome `alert`) per stall, and its reason says so (`gpuctl jobs list`, `jobs
show`); its next commit clears both (`stalled`, outcome `ok`). Nothing else is done: a stopped or
hung job is for a person to look at, not for gpuctl to kill."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuctl.core.jobs.model import Incarnation, IncarnationState, JobState
from gpuctl.core.jobs.stall import STALLED, Stall, judge
from gpuctl.core.timefmt import duration

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Pass

ALERT = "alert"


def stalls(p: Pass) -> None:
    """Judge each running job whose node listed its run alive this pass."""
    if not p.settings.stall.enabled:
        return
    for inc in p.store.incarnations(holding=True):
        if inc.state is not IncarnationState.RUNNING or inc.node not in p.observed:
            continue
        run = p.observed[inc.node].get((inc.job_id, inc.n))
        if run is not None and run.alive:
            p.guard(_judge_one, p, inc)


def _judge_one(p: Pass, inc: Incarnation) -> None:
    job = p.store.job(inc.job_id)
    if job is None or job.state is not JobState.RUNNING or job.incarnation != inc.n:
        return
    checkpoints = p.store.checkpoints(job.id)
    stall = judge(inc, checkpoints, now=p.now, policy=p.settings.stall)
    alerted = (job.reason or "").startswith(STALLED)
    if stall is not None and not alerted:
        _write(p, inc, _alert_message(job.id, inc, stall), ALERT, stall.reason, stall)
    elif stall is None and alerted:
        steps = [c.step for c in checkpoints if c.incarnation == inc.n]
        what = f"step {max(steps)} committed" if steps else "it commits again"
        message = f"{job.id} makes progress again: {what} (stall alert cleared)"
        _write(p, inc, message, "ok", None, None)


def _alert_message(job_id: str, inc: Incarnation, stall: Stall) -> str:
    what = "nothing committed" if stall.step is None else f"nothing after step {stall.step}"
    return (
        f"{job_id} looks stalled on {inc.node}: {what} for {duration(stall.age_s)}, it committed "
        f"every {duration(stall.interval_s)} (alert past {duration(stall.threshold_s)}); gpuctl "
        "does nothing about it"
    )


def _write(
    p: Pass, inc: Incarnation, message: str, outcome: str, reason: str | None, stall: Stall | None
) -> None:
    """The event and the job's reason together (a compare-and-set on the running job)."""
    if not p.dry:
        data: dict[str, object] = {}
        if stall is not None:
            data = {
                "age_s": round(stall.age_s, 1),
                "interval_s": round(stall.interval_s, 1),
                "threshold_s": round(stall.threshold_s, 1),
                "step": stall.step,
            }
        p.store.update_job(
            inc.job_id,
            expect=JobState.RUNNING,
            event=p.event(
                "stalled",
                message,
                job=inc.job_id,
                node=inc.node,
                inc=inc.n,
                outcome=outcome,
                data=data,
            ),
            reason=reason,
            updated_at=p.now,
        )
    p.record("stalled", message, job=inc.job_id, node=inc.node, inc=inc.n, outcome=outcome)
