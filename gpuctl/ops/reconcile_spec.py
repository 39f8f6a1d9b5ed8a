"""What the control loop reads from a stored job spec beyond the conversions `gpuctl.ops.jobs`
provides (placement request, allocation, launch request, secrets, checkpoint dir): the checkpoint
sync mode, the restart budget, the stop grace and the slice policy."""

from __future__ import annotations

from gpuctl.core.jobs import CheckpointSync, Job, SliceEnforcement
from gpuctl.ops.jobs import job_spec


def checkpoint_sync(job: Job) -> CheckpointSync:
    return CheckpointSync(job_spec(job).checkpoint.sync)


def restart_budget(job: Job) -> int:
    return job_spec(job).restart_budget


def grace_s(job: Job) -> float:
    return job_spec(job).grace_s


def slice_enforcement(job: Job) -> SliceEnforcement:
    return SliceEnforcement(job_spec(job).slice_enforcement)
