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


@dataclasses.dataclass(frozen=True, slots=True)
class NeverFits:
    """Why no node could ever take a job, whatever runs there: the spec field at fault
    (`resources.gpus`, `resources.mem_per_gpu` or `resources.gpu_models`) and what was seen."""

    field: str
    message: str


def never_fits(job: JobRequest, nodes: Sequence[PlacementNode]) -> NeverFits | None:
    """None when some node of `nodes`, empty, healthy and uncordoned, could take `job`: its
    cards' models, sizes and count, ignoring allocations, ghosts, cordons and card health (it is
    about "ever", not "now"). No nodes, or a CPU-only job: None (nothing to say never about)."""
    shape = job.shape
    if not nodes or shape.gpus == 0:
        return None
    mib = shape.mem_per_card.mib
    models = [[c for c in n.cards if model_ok(shape.gpu_models, c.model)] for n in nodes]
    sized = [[c for c in cards if mib is None or c.capacity_mib >= mib] for cards in models]
    if any(len(cards) >= shape.gpus for cards in sized):
        return None
    if not any(models):
        seen = sorted({c.model or "unknown" for n in nodes for c in n.cards})
        return NeverFits(
            "resources.gpu_models",
            f"no card of model {' or '.join(shape.gpu_models)} on any node "
            f"(models seen: {', '.join(seen) or 'none'})",
        )
    if mib is not None and not any(sized):
        size, name = max(
            (c.capacity_mib, n.name) for n, cs in zip(nodes, models, strict=True) for c in cs
        )
        return NeverFits(
            "resources.mem_per_gpu",
            f"{format_mib(mib)} per card, but the largest card seen is {format_mib(size)} "
            f"(on {name})",
        )
    most, name = max((len(cs), n.name) for n, cs in zip(nodes, sized, strict=True))
    return NeverFits(
        "resources.gpus",
        f"{shape.gpus} cards on one node, but the most any node has that fit is {most} (on {name})",
    )
