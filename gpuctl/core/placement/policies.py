"""Placement policies: pluggable per-node scorers over the fit primitives.

A policy answers, for one node that passed the engine's constraint filters, whether the demand
fits, which cards it would take, and a score (higher is better). The engine picks the best-scoring
node and breaks ties by its own explicit node order. Policies are pure and deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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

    Bound to a fleet (`for_fleet`, with its cards per model), it also keeps card models that
    pinned work needs for that work: a card model's *pressure* is the share of the workload's
    GPU pinned to it (a shape allowed on several models counts for each in proportion to its
    cards) over the model's share of the fleet's cards, capped at 1; a job that may run on more
    than one model pays `pressure * reserve_weight` per card it takes there.
    """

    name = "gpuctl"

    def __init__(
        self,
        *,
        host_weight: float = 1.0,
        quantize: bool = True,
        reserve_weight: float = 1.0,
        supply: Mapping[str, int] | None = None,
    ) -> None:
        self.host_weight = host_weight
        self.quantize = quantize
        self.reserve_weight = reserve_weight
        self.supply = dict(supply or {})
        self._pressure: dict[int, tuple[Workload, dict[str, float]]] = {}

    def for_fleet(self, cards_per_model: Mapping[str, int]) -> Gpuctl:
        """This policy for a fleet with these cards per model."""
        return Gpuctl(
            host_weight=self.host_weight,
            quantize=self.quantize,
            reserve_weight=self.reserve_weight,
            supply=cards_per_model,
        )

    def pressure(self, workload: Workload) -> dict[str, float]:
        hit = self._pressure.get(id(workload))
        if hit is not None and hit[0] is workload:
            return hit[1]
        total_cards = sum(self.supply.values())
        pinned: dict[str, float] = {}
        units = 0.0
        for d, p in workload:
            u = p * d.gpus * d.mib_per_card
            units += u
            models = [m for m in d.gpu_models if self.supply.get(m)]
            cards = sum(self.supply[m] for m in models)
            for m in models:
                pinned[m] = pinned.get(m, 0.0) + u * self.supply[m] / cards
        out = {
            m: min(1.0, (v / units) / (self.supply[m] / total_cards))
            for m, v in pinned.items()
            if units > 0 and total_cards
        }
        if len(self._pressure) > 64:
            self._pressure.clear()
        self._pressure[id(workload)] = (workload, out)
        return out

    def choose(self, node: NodeFree, demand: Demand, workload: Workload) -> Choice | None:
        if not fits(node, demand):
            return None
        index = index_for(workload)
        ratio = index.host_ratio
        den = index.denominator
        per_card = float((max(node.capacity) if node.capacity else 0) or 1)
        frag_before = index.stranded_num(node)
        host_before = host_stranded(node, ratio)
        reserve = 0.0
        if self.supply and demand.gpus and len(demand.gpu_models) != 1 and node.gpu_model:
            reserve = self.reserve_weight * self.pressure(workload).get(node.gpu_model, 0.0)

        def gain(after: NodeFree) -> float:
            frag = (frag_before - index.stranded_num(after)) / den
            host = host_before - host_stranded(after, ratio)
            taken = sum(node.free) - sum(after.free)
            return (frag + self.host_weight * host - reserve * taken) / per_card

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


def for_fleet(policy: Policy, cards_per_model: Mapping[str, int]) -> Policy:
    """`policy` bound to a fleet with these cards per model, where it uses them (`Gpuctl`)."""
    return policy.for_fleet(cards_per_model) if isinstance(policy, Gpuctl) else policy


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[ALIASES.get(name, name)]
    except KeyError:
        known = ", ".join([*sorted(POLICIES), *sorted(ALIASES)])
        raise KeyError(f"unknown policy {name!r}; known: {known}") from None
