"""Placement policies: pluggable per-node scorers over the fit primitives.

A policy answers, for one node that passed the engine's constraint filters, whether the demand
fits, which cards it would take, and a score (higher is better). The engine picks the best-scoring
node and breaks ties by its own explicit node order. Policies are pure and deterministic.
"""

from __future__ import annotations

from typing import Protocol

from gpuctl.core.fit import Choice, Demand, NodeFree, Workload, fits, fitting_cards


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


class BestFit:
    """The node (and, for a slice, the card) left with the least free capacity that still fits."""

    name = "best-fit"

    def choose(self, node: NodeFree, demand: Demand, workload: Workload) -> Choice | None:
        if not fits(node, demand):
            return None
        if demand.gpus == 0:
            cards: tuple[int, ...] = ()
        elif demand.whole or demand.gpus > 1:
            cards = _lowest_whole(node, demand)
        else:
            cands = fitting_cards(node, demand)
            cards = (min(cands, key=lambda i: (node.free[i], i)),)
        left = sum(node.free) - sum(
            node.capacity[i] if (demand.whole or demand.gpus > 1) else demand.per_gpu for i in cards
        )
        total = sum(node.capacity) or 1
        return Choice(cards=cards, score=100.0 * (1.0 - left / total))


POLICIES: dict[str, Policy] = {p.name: p for p in (FirstFit(), BestFit())}
DEFAULT_POLICY = "best-fit"  # replaced by the policy that beats FGD on the openb benchmark


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
