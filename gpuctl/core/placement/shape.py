"""The job-shape policy and the band, in words: how a request was read, and the admission test."""

from __future__ import annotations

from fractions import Fraction

from gpuctl.core.fit import Demand
from gpuctl.core.placement.model import JobShape, Settings
from gpuctl.core.units import format_mib


def request_text(shape: JobShape) -> str:
    """The request as written: `2 × whole card of model H100`, `1 × 24.0 GiB`, `CPU only`."""
    if shape.gpus == 0:
        return "CPU only"
    mem = shape.mem_per_gpu
    if mem.whole:
        what = "whole card" if shape.gpus == 1 else "whole cards"
    elif mem.fraction is not None:
        what = f"{mem.fraction:g} of a card"
    else:
        what = format_mib(mem.mib)
    models = f" of model {' or '.join(shape.gpu_models)}" if shape.gpu_models else ""
    return f"{shape.gpus} × {what}{models}"


def decide_shape(shape: JobShape, demand: Demand, cap_ref: int, settings: Settings) -> str:
    """How the job-shape policy read the request on a node whose cards hold `cap_ref` MiB."""
    if shape.gpus == 0:
        return "CPU only"
    mem = shape.mem_per_gpu
    card = format_mib(cap_ref)
    if mem.whole:
        return f"{_cards(shape.gpus)} (asked for whole cards)"
    asked = format_mib(mem.mib_on(cap_ref))
    share = f" ({mem.fraction:g} of a {card} card)" if mem.fraction is not None else ""
    if shape.gpus > 1:
        return f"{_cards(shape.gpus)} ({shape.gpus} GPUs asked: multi-GPU jobs take whole cards)"
    if demand.whole:
        return (
            f"1 whole card ({asked}{share} is over {settings.whole_card_over:g} of a {card} "
            "card: larger jobs get whole cards)"
        )
    return f"1 × {asked} slice{share}"


def within_limit(allocated_mib: int, total_mib: int, limit: float) -> bool:
    """`allocated / total <= limit`, exactly (no float rounding at the edge)."""
    if total_mib == 0:
        return allocated_mib == 0
    return Fraction(allocated_mib) <= Fraction(repr(limit)) * total_mib


def _cards(n: int) -> str:
    return "1 whole card" if n == 1 else f"{n} whole cards"
