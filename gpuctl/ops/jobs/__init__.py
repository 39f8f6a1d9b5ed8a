"""Job services shared by the CLI and the control loop: submit, list, show, cancel, logs; the
conversions from a stored job to a placement request and a launch request; the fleet numbers.

A job's spec is a typed `gpuctl.core.jobs.spec.JobSpec`, built once from its spec file at submit and
stored as plain data (secret *names*, and the files some of them are read from; never a value).
Secret values are read when they are needed — checked at submit, read again at every launch — from
the environment or the file, and only ever travel in a `LaunchRequest` (whose repr hides them).
"""

from gpuctl.ops.jobs.logs import LogChunk, read_logs
from gpuctl.ops.jobs.service import (
    ACTIVE,
    JobDetail,
    JobNotFound,
    JobView,
    cancel,
    cancel_is_forced,
    find_job,
    fleet_numbers,
    job_document,
    job_summary,
    list_jobs,
    operator,
    placed,
    show_job,
    submit,
)
from gpuctl.ops.jobs.spec import (
    allocation,
    ids_by_name,
    job_request,
    launch_request,
    new_job_id,
    resolve_secrets,
)

__all__ = [
    "ACTIVE",
    "JobDetail",
    "JobNotFound",
    "JobView",
    "LogChunk",
    "allocation",
    "cancel",
    "cancel_is_forced",
    "find_job",
    "fleet_numbers",
    "ids_by_name",
    "job_document",
    "job_request",
    "job_summary",
    "launch_request",
    "list_jobs",
    "new_job_id",
    "operator",
    "placed",
    "read_logs",
    "resolve_secrets",
    "show_job",
    "submit",
]
