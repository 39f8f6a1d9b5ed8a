"""Placement policies: pluggable per-node scorers over the fit primitives.

A policy answers, for one node that passed the engine's constraint filters, whether the demand
fits, which cards it would take, and a score (higher is better). The engine picks the best-scoring
node and breaks ties by its own explicit node order. Policies are pure and deterministic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Protocol

from gpuctl.core.placement.fit import Choice, Demand, NodeFree, Workload, fits, fitting_cards
from gpuctl.core.placement.fragmentation import (
    DEAD_SHARE,
    DEAD_WEIGHT,
    HOST_WEIGHT,
    dead_hole_below,
    host_stranded,
    index_for,
)


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
        cpu_milli=node.cpu_milli,
        mem_mib=node.mem_mib,
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


@dataclasses.dataclass(frozen=True, slots=True)
class NodeKind:
    """Nodes that can run the same jobs when empty: card model (`None`: unknown or mixed),
    number of cards, largest card (units), host CPU and memory capacity (`None`: unknown, never
    limits)."""

    model: str | None
    cards: int
    card_units: int
    cpu_milli: int | None
    mem_mib: int | None

    @classmethod
    def of(cls, node: NodeFree) -> NodeKind:
        top = max(node.capacity, default=0)
        return cls(node.gpu_model, len(node.capacity), top, node.cpu_milli, node.mem_mib)

    def runs(self, demand: Demand) -> bool:
        """Could an empty node of this kind run `demand`?"""
        if demand.gpu_models and self.model not in demand.gpu_models:
            return False
        if demand.gpus > self.cards or (
            _is_slice(demand) and demand.mib_per_card > self.card_units
        ):
            return False
        if self.cpu_milli is not None and demand.cpu_milli > self.cpu_milli:
            return False
        return self.mem_mib is None or demand.mem_mib <= self.mem_mib


class Gpuctl:
    """gpuctl's default: FGD's fragmentation plus the cards the host cannot feed.

    FGD counts a free card as stranded when the typical jobs are too big for it, or when not even
    one typical job fits the host's remaining CPU. It is blind to the slower way cards strand:
    CPU-hungry jobs (and CPU-only jobs) eat a node's CPU and memory until its remaining cards can
    no longer all be fed. gpuctl adds that amount, `host_stranded` (free card units beyond what
    the node's free CPU and memory can feed at the workload's average CPU and memory per card
    unit; none where a typical whole-card job takes every free card and fits the host, as on a
    4-card node whose host is thin for the average but right for the 4-card jobs), to the
    stranded measure, weighted by `host_weight`, and then scores like FGD:
    `100 * sigmoid(-(stranded after - stranded before) / one card)`, truncated when `quantize`
    (near-equal nodes tie and the engine's node order decides, which packs; past the sigmoid's
    ends each whole card of gain is one point more, so big charges still order nodes). A slice
    goes to the best-scoring card (lowest index on ties); whole cards are the lowest-indexed free
    ones.

    The target workload should hold every observed shape (rare shapes carry the card-model
    constraints) with its host CPU and memory.

    Bound to a fleet (`for_fleet`, with its cards per model), it also keeps card models that
    pinned work needs for that work: a card model's *pressure* is the share of the workload's
    GPU pinned to it (a shape allowed on several models counts for each in proportion to its
    cards) over the model's share of the fleet's cards, capped at 1; a job that may run on more
    than one model pays `pressure * reserve_weight` per card it takes there.

    Bound to the fleet's node kinds too (`NodeKind`: card model, cards, card size, host CPU and
    memory), it keeps the kinds that big jobs need for them, which FGD's measure, weighted by
    job count, sees too faintly (a rare 8-card job asking for 120 cores fits only the fleet's
    few 128-core nodes): a kind's *pressure* is the share of the workload's card units that can
    run on it (each shape spread over the kinds it fits when empty, in proportion to their card
    units) over the kind's share of the fleet's card units. A whole-card job that fits more than
    one kind pays `kind_weight` (1.5) times its node's pressure above that of the least pressed
    kind it fits, per card it takes. Slices pay nothing: where a slice goes is a matter of what
    its card's leftover can still hold, which the fragmentation term weighs. On openb workloads
    where 8-card jobs carry half the GPU demand this lifts the allocation at x=100 by 0.2 to 0.6
    points; with weight 1 multigpu60 lost 0.06 at x=130, and charging slices cost gpushare up to
    0.13 (docs/benchmark-placement.md).

    Last, *dead holes*: free memory on a card that fewer than `dead_share` (5 %) of the
    workload's card-sharing jobs fit, but not none, is likely never used (on openb: a hole under
    220 milli, such as the 190 an 810-milli slice leaves). FGD's measure weighs a hole by its
    size times the share of all jobs that do not fit it, so it counts a 700-milli hole that most
    slices fit as worse than a 190-milli one that almost none fit. Each unit of dead hole a
    placement makes costs `dead_weight` (2) units of gain, each it fills earns as much: a small
    slice goes into the hole beside a big one, a big slice onto a card a small one holds, two
    slices pair up to fill a card. On the 28 openb workloads (seeds 42-44) this lifts the
    allocation by 0.29 points on average and by up to 0.9 where most jobs share cards
    (docs/benchmark-placement.md).
    """

    name = "gpuctl"

    def __init__(
        self,
        *,
        host_weight: float = HOST_WEIGHT,
        quantize: bool = True,
        reserve_weight: float = 1.0,
        kind_weight: float = 1.5,
        dead_share: float = DEAD_SHARE,
        dead_weight: float = DEAD_WEIGHT,
        supply: Mapping[str, int] | None = None,
        hosts: Mapping[NodeKind, int] | None = None,
    ) -> None:
        self.host_weight = host_weight
        self.quantize = quantize
        self.reserve_weight = reserve_weight
        self.kind_weight = kind_weight
        self.dead_share = dead_share
        self.dead_weight = dead_weight
        self._dead_below: dict[int, tuple[Workload, int]] = {}
        self.supply = dict(supply or {})
        self.hosts = {k: n for k, n in (hosts or {}).items() if n > 0 and k.cards > 0}
        self._pressure: dict[int, tuple[Workload, dict[str, float]]] = {}
        # per workload: the pressure per kind, and per demand the least pressure it could find
        self._kinds: dict[int, tuple[Workload, dict[NodeKind, float], dict[Demand, float]]] = {}

    def for_fleet(
        self, cards_per_model: Mapping[str, int], hosts: Mapping[NodeKind, int] | None = None
    ) -> Gpuctl:
        """This policy for a fleet with these cards per model and these nodes per kind."""
        return Gpuctl(
            host_weight=self.host_weight,
            quantize=self.quantize,
            reserve_weight=self.reserve_weight,
            kind_weight=self.kind_weight,
            dead_share=self.dead_share,
            dead_weight=self.dead_weight,
            supply=cards_per_model,
            hosts=hosts,
        )

    def kind_pressure(self, workload: Workload) -> dict[NodeKind, float]:
        """Per node kind: the share of the workload's card units that can run on it (each shape
        spread over the kinds it runs on, in proportion to their card units) over the kind's
        share of the fleet's card units."""
        return self._kind_state(workload)[0]

    def _kind_state(self, workload: Workload) -> tuple[dict[NodeKind, float], dict[Demand, float]]:
        hit = self._kinds.get(id(workload))
        if hit is not None and hit[0] is workload:
            return hit[1], hit[2]
        room = {k: n * k.cards * k.card_units for k, n in self.hosts.items()}
        total = sum(room.values())
        load = dict.fromkeys(room, 0.0)
        units = 0.0
        for d, p in workload:
            u = p * d.gpus * d.mib_per_card
            on = [k for k in room if k.runs(d)]
            fits_in = sum(room[k] for k in on)
            if u <= 0 or not fits_in:
                continue
            units += u
            for k in on:
                load[k] += u * room[k] / fits_in
        out = {k: (load[k] / units) / (room[k] / total) for k in room if units > 0 and room[k]}
        if len(self._kinds) > 64:
            self._kinds.clear()
        floors: dict[Demand, float] = {}
        self._kinds[id(workload)] = (workload, out, floors)
        return out, floors

    def _kind_charge(self, node: NodeFree, demand: Demand, workload: Workload) -> float:
        """Per unit taken: the node's kind pressure above the least pressed kind the demand runs
        on (0 when it runs on one kind only, or the node's kind is not in the fleet)."""
        pressure, floors = self._kind_state(workload)
        here = pressure.get(NodeKind.of(node))
        if here is None:
            return 0.0
        floor = floors.get(demand)
        if floor is None:
            on = [v for h, v in pressure.items() if h.runs(demand)]
            floor = floors[demand] = min(on) if len(on) > 1 else math.inf
        return 0.0 if floor == math.inf else self.kind_weight * (here - floor)

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
        fillers = index.fillers
        host_before = host_stranded(node, ratio, fillers)
        reserve = 0.0
        if self.supply and demand.gpus and len(demand.gpu_models) != 1 and node.gpu_model:
            reserve = self.reserve_weight * self.pressure(workload).get(node.gpu_model, 0.0)
        if self.hosts and demand.gpus and not _is_slice(demand) and self.kind_weight:
            reserve += self._kind_charge(node, demand, workload)

        def gain(after: NodeFree, card: int | None = None) -> float:
            frag = (frag_before - index.stranded_num(after)) / den
            host = host_before - host_stranded(after, ratio, fillers)
            taken = sum(node.free) - sum(after.free)
            dead = 0.0
            if card is not None:  # a slice: the one card whose hole changes
                dead = self._dead(node.free[card], below) - self._dead(after.free[card], below)
            return (frag + self.host_weight * host - reserve * taken + dead) / per_card

        if not _is_slice(demand):
            cards = _cards_for(node, demand)
            return Choice(cards=cards, score=self._score(gain(_after(node, demand, cards))))
        below = self.dead_below(workload)
        best: Choice | None = None
        seen: set[tuple[int, int]] = set()
        for i in fitting_cards(node, demand):
            card = (node.free[i], node.capacity[i])
            if card in seen:  # a card like one before scores the same (the measures ignore
                continue  # card order), and ties keep the first
            seen.add(card)
            score = self._score(gain(_after(node, demand, (i,)), i))
            if best is None or score > best.score:
                best = Choice(cards=(i,), score=score)
        return best

    def dead_below(self, workload: Workload) -> int:
        """`dead_hole_below` with this policy's `dead_share`, kept per workload."""
        hit = self._dead_below.get(id(workload))
        if hit is not None and hit[0] is workload:
            return hit[1]
        below = dead_hole_below(workload, self.dead_share)
        if len(self._dead_below) > 64:
            self._dead_below.clear()
        self._dead_below[id(workload)] = (workload, below)
        return below

    def _dead(self, free: int, below: int) -> float:
        """The weighted dead hole of a card with `free` units left (0 when it is none or not
        under `below`). Whole cards and CPU-only jobs leave every card's hole as it was."""
        return self.dead_weight * free if 0 < free < below else 0.0

    def _score(self, gain_cards: float) -> float:
        score = 100.0 * _sigmoid(gain_cards)
        if not self.quantize:
            return score
        # Truncated like FGD's, but not flat past the sigmoid's ends: there a whole card of
        # gain is one point more or less, so a big job's reserve charge still orders the nodes
        # it saturates (an 8-card job pays about 21 cards on a 128-core node, 6 on a 96-core
        # one; both truncate to 0, and the node order then gave the rare 128-core nodes away).
        if gain_cards < -_SATURATED:
            return float(math.floor(gain_cards + _SATURATED))
        if gain_cards > _SATURATED:
            return 99.0 + math.floor(gain_cards - _SATURATED)
        return float(int(score))


# Past this gain (in cards) `100 * sigmoid` truncates to 0 or 99: ln(99).
_SATURATED = math.log(99.0)


POLICIES: dict[str, Policy] = {p.name: p for p in (FirstFit(), BestFit(), Fgd(), Gpuctl())}
DEFAULT_POLICY = "gpuctl"  # beats FGD on the openb benchmark (docs/benchmark-placement.md)
ALIASES = {"default": DEFAULT_POLICY}


def for_fleet(
    policy: Policy, cards_per_model: Mapping[str, int], hosts: Mapping[NodeKind, int] | None = None
) -> Policy:
    """`policy` bound to a fleet with these cards per model and nodes per kind, where it uses
    them (`Gpuctl`)."""
    return policy.for_fleet(cards_per_model, hosts) if isinstance(policy, Gpuctl) else policy


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[ALIASES.get(name, name)]
    except KeyError:
        known = ", ".join([*sorted(POLICIES), *sorted(ALIASES)])
        raise KeyError(f"unknown policy {name!r}; known: {known}") from None
