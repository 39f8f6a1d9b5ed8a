"""Cancelling a job from the dashboard: the plan (what the cancel will do to the job as the
store has it now) and carrying it out through `gpuctl.ops.jobs.cancel`, the function behind
`gpuctl cancel`, so both write the same store change and the control loop stops the job the same
way.

`cancel` stops a running job gracefully (SIGTERM, the job checkpoints and exits, KILL after its
grace) and cancels a waiting one at once; `kill` is `gpuctl cancel --force`, offered for a running
job only, as a choice of its own: KILL at once, without a last checkpoint."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpuctl.core.jobs.model import Job, JobState
from gpuctl.core.timefmt import duration
from gpuctl.ops.action_plans import ActionPlan, ActionRefused, Applied

if TYPE_CHECKING:
    from gpuctl.ops.actions._fleet import FleetActions

JOB_ACTIONS = ("cancel", "kill")


@dataclasses.dataclass(frozen=True, slots=True)
class CancelOrder:
    """The job to cancel, as planned: `force` is KILL at once (`gpuctl cancel --force`)."""

    job_id: str
    force: bool
    was: JobState


def plan_cancel(actions: FleetActions, ref: str, *, force: bool) -> ActionPlan:
    """What cancelling (`force`: killing) the job `ref` would do, from the store as it is now."""
    from gpuctl.ops.jobs import find_job, list_jobs, placed

    action = "kill" if force else "cancel"
    if not ref:
        raise ActionRefused(f"{action} needs a job")
    with actions.open_store(False) as store:
        job = find_job(store, ref)
        view = next((v for v in list_jobs(store, include_done=True) if v.job.id == job.id), None)
    now = actions.clock.now()
    head = f"{action} {job.id} ({job.name}), {job.state.value}"
    refused = _not_applicable(job, force)
    if refused is not None:
        return ActionPlan(action, job.id, f"{head}: {refused}", applicable=False)
    order = CancelOrder(job.id, force, job.state)
    if job.state is not JobState.RUNNING:
        text = f"{head}: cancelled at once; it never starts."
        return ActionPlan(action, job.id, text, value=order)
    inc = None if view is None else placed(view)
    where = "" if inc is None else f" on {inc.node} cards {','.join(map(str, inc.cards))}"
    ckpt = None if view is None else view.checkpoint
    newest = (
        "no committed checkpoint yet"
        if ckpt is None
        else f"step {ckpt.step}, {duration(now - ckpt.committed_at)} old"
    )
    if force:
        how = [
            "the control loop KILLs it at once (gpuctl cancel --force): no last checkpoint;",
            f"the work since its newest checkpoint ({newest}) is lost",
        ]
    else:
        grace = duration(job.spec.policy.grace_s)
        how = [
            "the control loop sends SIGTERM (the job checkpoints and exits),",
            f"then KILL after its grace ({grace}); newest checkpoint: {newest}",
        ]
    lines = [f"{head}{where}, incarnation {job.incarnation}:", *(f"  {h}" for h in how)]
    return ActionPlan(action, job.id, "\n".join(lines), value=order)


def _not_applicable(job: Job, force: bool) -> str | None:
    if job.state.terminal:
        return f"already {job.state.value}: nothing to cancel."
    if force and job.state is not JobState.RUNNING:
        return "not running: kill applies to a running job only; cancel it instead."
    if job.cancel_requested and not force:
        return "a cancel is already requested: the control loop is stopping it."
    return None


def carry_out_cancel(actions: FleetActions, order: CancelOrder) -> Applied:
    """`gpuctl cancel [--force]` on the job: the job's state decides, as it is when applied."""
    from gpuctl.ops.jobs import cancel

    with actions.open_store(True) as store:
        done = cancel(
            store, order.job_id, actor=actions.operator, clock=actions.clock, force=order.force
        )
    if done.state.terminal:
        return Applied(f"{done.id} {done.state.value}", done)
    how = "KILL at once" if order.force else "SIGTERM, then KILL after the grace"
    return Applied(f"{done.id}: cancel requested; the control loop stops it ({how})", done)
