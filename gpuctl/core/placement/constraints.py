"""Per-node constraint checks that do not depend on the engine's running state.

Each returns what the job may use, or a `Reject` naming the constraint and a summary that
groups nodes failing for the same reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuctl.core.placement.model import (
    Allocation,
    JobRequest,
    PlacementNode,
    model_matches,
)
from gpuctl.core.units import format_mib


@dataclasses.dataclass(frozen=True, slots=True)
class Reject:
    constraint: str
    summary: str
    need_mib: int = 0  # for the band: what placing here would add


def usable_cards(job: JobRequest, node: PlacementNode) -> list[int] | Reject:
    """Card positions this job may use on `node`, or the rejection."""
    shape = job.shape
    if shape.gpus == 0:
        return []
    healthy = [i for i, c in enumerate(node.cards) if c.healthy]
    if not healthy:
        return Reject("gpu_count", "no healthy GPU" if node.cards else "no GPU")
    usable = healthy
    if shape.gpu_models:
        usable = [i for i in healthy if model_ok(shape.gpu_models, node.cards[i].model)]
        if not usable:
            return Reject("gpu_model", f"no card of model {' or '.join(shape.gpu_models)}")
    mib = shape.mem_per_card.mib
    if mib is not None:
        usable = [i for i in usable if node.cards[i].capacity_mib >= mib]
        if not usable:
            return Reject("card_size", f"cards smaller than {format_mib(mib)}")
    if len(usable) < shape.gpus:
        return Reject("gpu_count", fewer(shape.gpus, "usable card"))
    return usable


def model_ok(models: Sequence[str], card_model: str | None) -> bool:
    """May a card of `card_model` serve a job asking for one of `models` (any card: none asked)?"""
    return not models or any(model_matches(m, card_model) for m in models)


def clash(job: JobRequest | Allocation, a: Allocation) -> str | None:
    """Why `job` (a request, or a job placed already) may not share a node with allocation `a`,
    or None: job anti-affinity is symmetric. Placement and consolidation both ask here."""
    name = job.job if isinstance(job, Allocation) else job.name
    if a.job in job.avoid_jobs or name in a.avoid_jobs:
        return f"runs job {a.job}"
    if a.group is not None and a.group in job.avoid_groups:
        return f"runs a job of group {a.group}"
    if job.group is not None and job.group in a.avoid_groups:
        return f"runs job {a.job}, which avoids group {job.group}"
    return None


def fewer(n: int, what: str) -> str:
    return f"no {what}" if n == 1 else f"fewer than {n} {what}s"
