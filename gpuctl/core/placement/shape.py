"""The job-shape policy and the band, in words: how a request was read, and the admission test."""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from gpuctl.core.placement.fit import Demand
from gpuctl.core.placement.model import JobShape, Settings
from gpuctl.core.units import format_mib


def request_text(shape: JobShape) -> str:
    """The request as written: `2 × whole card of model H100`, `1 × 24.0 GiB`, `CPU only`."""
    if shape.gpus == 0:
        return "CPU only"
    mem = shape.mem_per_card
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
    mem = shape.mem_per_card
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


def limit_mib(total_mib: int, limit: float) -> int:
    """The most MiB that may be allocated under `limit` of `total_mib`, exactly: allocated/total
    <= limit holds for an integer allocation iff it is at most this (no float rounding at the
    edge: 0.8 is 4/5, not 0.8000000000000000444)."""
    return math.floor(Fraction(repr(limit)) * total_mib)


def _cards(n: int) -> str:
    return "1 whole card" if n == 1 else f"{n} whole cards"


def demand_on(shape: JobShape, cap_ref: int, settings: Settings) -> Demand:
    """The job-shape policy: what `shape` asks of a node whose (largest usable) cards hold
    `cap_ref` MiB. More than one GPU, `whole`, or more than `whole_card_over` of a card: whole
    cards; otherwise a slice."""
    if shape.gpus == 0:
        return Demand(gpus=0, mib_per_card=0, cpu_milli=shape.cpu_milli, mem_mib=shape.host_mem_mib)
    mem = shape.mem_per_card
    per = mem.mib_on(cap_ref)
    threshold = Fraction(repr(settings.whole_card_over))
    if mem.fraction is not None:  # compare the share itself: rounding up must not tip it over
        over = Fraction(repr(mem.fraction)) > threshold
    else:
        over = Fraction(per) > threshold * cap_ref
    whole = mem.whole or shape.gpus > 1 or over
    return Demand(
        gpus=shape.gpus,
        mib_per_card=cap_ref if whole else per,
        whole=whole,
        cpu_milli=shape.cpu_milli,
        mem_mib=shape.host_mem_mib,
    )


def added_mib(demand: Demand, caps: Sequence[int], cards: Sequence[int]) -> int:
    if demand.gpus == 0:
        return 0
    if demand.whole or demand.gpus > 1:
        return sum(caps[i] for i in cards)
    return demand.mib_per_card * len(cards)
