"""The queue's order: priority (highest first), then submit time (oldest first), then id."""

from __future__ import annotations

from collections.abc import Iterable

from gpuctl.core.jobs.model import Job


def queue_key(job: Job) -> tuple[int, float, str]:
    return (-job.priority, job.submitted_at, job.id)


def queue_order(jobs: Iterable[Job]) -> list[Job]:
    """Priority (highest first), then submit time (oldest first), then id."""
    return sorted(jobs, key=queue_key)
