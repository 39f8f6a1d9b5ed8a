"""Placement policies: pluggable per-node scorers over the fit primitives.

A policy answers, for one node that passed the engine's constraint filters, whether the demand
fits, which cards it would take, and a score (higher is better). The engine picks the best-scoring
node and breaks ties by its own explicit node order. Policies are pure and deterministic.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Protocol

from gpuctl.core.placement.fit import Choice, Demand, NodeFree, Workload, fits, fitting_cards
from gpuctl.core.placement.fragmentation import host_stranded, index_for


class Policy(Protocol):
    name: str

    def choose(self, node: NodeFree, demand: Demand, workload: Workload) -> Choice | None: ...


def _lowest_whole(node: NodeFree, demand: Demand) -> tuple[int, ...]:
    return fitting_cards(node, demand)[: demand.gpus]


class FirstFit:
    """Every fitting node scores the same; the engine's node order decides. Lowest cards first."""

    name = "first-fit"

    def choose(self, node: NodeFree, demand: Demand, workload: Workload) -> Choice | None:
        if not fits(node, demand):
            return None
        return Choice(cards=_lowest_whole(node, demand), score=0.0)


def _used_units(node: NodeFree, demand: Demand, cards: tuple[int, ...]) -> int:
    if demand.whole or demand.gpus > 1:
        return sum(node.capacity[i] for i in cards)
    return demand.mib_per_card * len(cards)


def _tightest_card(node: NodeFree, demand: Demand) -> tuple[int, ...]:
    """The card with the least free units that still fits one share (lowest index on ties)."""
    return (min(fitting_cards(node, demand), key=lambda i: (node.free[i], i)),)


def _cards_for(node: NodeFree, demand: Demand) -> tuple[int, ...]:
    """The cards every policy takes for CPU-only and whole-card demands (lowest index first)."""
    if demand.gpus == 0:
        return ()
    return _lowest_whole(node, demand)


def _after(node: NodeFree, demand: Demand, cards: tuple[int, ...]) -> NodeFree:
    """`take` without its checks (the cards come from `fitting_cards`): the hot path of FGD."""
    free = list(node.free)
    if demand.whole or demand.gpus > 1:
        for i in cards:
            free[i] = 0
    else:
        for i in cards:
            free[i] -= demand.mib_per_card
    cpu, mem = node.cpu_free_milli, node.mem_free_mib
    return NodeFree(
        name=node.name,
        free=tuple(free),
        capacity=node.capacity,
        cpu_free_milli=None if cpu is None else cpu - demand.cpu_milli,
        mem_free_mib=None if mem is None else mem - demand.mem_mib,
        gpu_model=node.gpu_model,
    )


def _is_slice(demand: Demand) -> bool:
    return demand.gpus == 1 and not demand.whole


class BestFit:
    """The node left with the least free capacity that still fits; for a slice, the tightest card.

    Score `100 * (1 - s)`, where `s` is the leftover after placement: by default the node's free
    card units over its own capacity. With `gpu_scale_units` (and `cpu_scale_milli`), `s` is the
    FGD paper's `0.5 * cpu_left / cpu_scale + 0.5 * gpu_left / gpu_scale` (128 cores and 8 cards
    there), and `quantize` truncates it to an integer, as the paper's simulator does.
    """

    name = "best-fit"

    def __init__(
        self,
        *,
        gpu_scale_units: int | None = None,
        cpu_scale_milli: int | None = None,
        quantize: bool = False,
    ) -> None:
        self.gpu_scale_units = gpu_scale_units
        self.cpu_scale_milli = cpu_scale_milli
        self.quantize = quantize

    def choose(self, node: NodeFree, demand: Demand, workload: Workload) -> Choice | None:
        if not fits(node, demand):
            return None
        cards = _tightest_card(node, demand) if _is_slice(demand) else _cards_for(node, demand)
        left = Fraction(sum(node.free) - _used_units(node, demand, cards))
        s = left / (self.gpu_scale_units or sum(node.capacity) or 1)
        if self.cpu_scale_milli and node.cpu_free_milli is not None:
            cpu_left = Fraction(node.cpu_free_milli - demand.cpu_milli, self.cpu_scale_milli)
            s = (s + cpu_left) / 2
        score = 100 * (1 - s)
        return Choice(cards=cards, score=float(math.floor(score) if self.quantize else score))


def _sigmoid(x: float) -> float:
    if x < -700.0:
        return 0.0
    return 1.0 / (1.0 + math.exp(-x))


class Fgd:
    """Fragmentation gradient descent (Weng et al., USENIX ATC '23).

    Place where the expected fragmentation of the node grows least: the score is
    `100 * sigmoid(-(stranded after - stranded before) / one card)`, stranded measured against
    the target workload (`gpuctl.core.placement.fragmentation`). A slice goes to the card that
    scores best (lowest index on ties); whole cards are the lowest-indexed free ones. `quantize`
    truncates the score to an integer like the paper's simulator, so near-equal nodes tie and the
    engine's node order decides.
    """

    name = "fgd"

    def __init__(self, *, quantize: bool = True) -> None:
        self.quantize = quantize

    def choose(self, node: NodeFree, demand: Demand, workload: Workload) -> Choice | None:
        if not fits(node, demand):
            return None
        index = index_for(workload)
        before = index.stranded_num(node)
        per_card = (max(node.capacity) if node.capacity else 0) or 1
        scale = float(per_card * index.denominator)
        if not _is_slice(demand):
            cards = _cards_for(node, demand)
            after = index.stranded_num(_after(node, demand, cards))
            return Choice(cards=cards, score=self._score((before - after) / scale))
        best: Choice | None = None
        for i in fitting_cards(node, demand):
            after = index.stranded_num(_after(node, demand, (i,)))
            score = self._score((before - after) / scale)
            if best is None or score > best.score:
                best = Choice(cards=(i,), score=score)
        return best

    def _score(self, gain_cards: float) -> float:
        score = 100.0 * _sigmoid(gain_cards)
        return float(int(score)) if self.quantize else score


class Gpuctl:
    """gpuctl's default: FGD's fragmentation plus the cards the host cannot feed.

    FGD counts a free card as stranded when the typical jobs are too big for it, or when not even
    one typical job fits the host's remaining CPU. It is blind to the slower way cards strand:
    CPU-hungry jobs (and CPU-only jobs) eat a node's CPU and memory until its remaining cards can
    no longer all be fed. gpuctl adds that amount, `host_stranded` (free card units beyond what
    the node's free CPU and memory can feed at the workload's average CPU and memory per card
    unit), to the stranded measure, weighted by `host_weight`, and then scores like FGD:
    `100 * sigmoid(-(stranded after - stranded before) / one card)`, truncated when `quantize`
    (near-equal nodes tie and the engine's node order decides, which packs). A slice goes to the
    best-scoring card (lowest index on ties); whole cards are the lowest-indexed free ones.

    The target workload should hold every observed shape (rare shapes carry the card-model
    constraints) with its host CPU and memory.
    """

    name = "gpuctl"

    def __init__(self, *, host_weight: float = 1.0, quantize: bool = True) -> None:
        self.host_weight = host_weight
        self.quantize = quantize

    def choose(self, node: NodeFree, demand: Demand, workload: Workload) -> Choice | None:
        if not fits(node, demand):
            return None
        index = index_for(workload)
        ratio = index.host_ratio
        den = index.denominator
        per_card = float((max(node.capacity) if node.capacity else 0) or 1)
        frag_before = index.stranded_num(node)
        host_before = host_stranded(node, ratio)

        def gain(after: NodeFree) -> float:
            frag = (frag_before - index.stranded_num(after)) / den
            host = host_before - host_stranded(after, ratio)
            return (frag + self.host_weight * host) / per_card

        if not _is_slice(demand):
            cards = _cards_for(node, demand)
            return Choice(cards=cards, score=self._score(gain(_after(node, demand, cards))))
        best: Choice | None = None
        for i in fitting_cards(node, demand):
            score = self._score(gain(_after(node, demand, (i,))))
            if best is None or score > best.score:
                best = Choice(cards=(i,), score=score)
        return best

    def _score(self, gain_cards: float) -> float:
        score = 100.0 * _sigmoid(gain_cards)
        return float(int(score)) if self.quantize else score


POLICIES: dict[str, Policy] = {p.name: p for p in (FirstFit(), BestFit(), Fgd(), Gpuctl())}
DEFAULT_POLICY = "gpuctl"  # beats FGD on the openb benchmark (docs/benchmark-placement.md)
ALIASES = {"default": DEFAULT_POLICY}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[ALIASES.get(name, name)]
    except KeyError:
        known = ", ".join([*sorted(POLICIES), *sorted(ALIASES)])
        raise KeyError(f"unknown policy {name!r}; known: {known}") from None
