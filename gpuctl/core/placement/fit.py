"""Fit primitives shared by every policy, the placement engine and the benchmark.

Capacities are integer *units* per card: MiB for a real fleet, milli-GPU in the openb replay. A node
is seen through `NodeFree` (what is free on each card after allocations and ghost usage); a job's
per-node request is a `Demand`. Policies (`gpuctl.core.placement.policies`) score a node for a
demand and pick its cards; the engine filters nodes by constraints first.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFree:
    """Free resources of one node, cards in index order."""

    name: str
    free: tuple[int, ...]  # free units per card (never negative)
    capacity: tuple[int, ...]  # capacity units per card
    cpu_free_milli: int | None = None  # None: not tracked, never limits
    mem_free_mib: int | None = None  # host memory; None: not tracked
    gpu_model: str | None = None  # the node's card model; None: unknown
    cpu_milli: int | None = None  # host CPU capacity; None: unknown
    mem_mib: int | None = None  # host memory capacity; None: unknown


@dataclasses.dataclass(frozen=True, slots=True)
class Demand:
    """What one job asks of one node.

    `gpus` cards of `mib_per_card` units each (MiB; the benchmarks' traces count milli-GPUs);
    `whole` cards take only fully free cards (and then `mib_per_card` is ignored). A job with
    `gpus > 1` is always whole-card. `gpus == 0` is CPU-only.
    """

    gpus: int
    mib_per_card: int
    whole: bool = False
    cpu_milli: int = 0
    mem_mib: int = 0
    gpu_models: tuple[str, ...] = ()  # acceptable card models; empty: any

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.mib_per_card < 0 or self.cpu_milli < 0 or self.mem_mib < 0:
            raise ValueError("a demand is never negative")


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """A policy's answer for one node: which cards, and how good (higher is better)."""

    cards: tuple[int, ...]
    score: float


# A target workload: shapes with their probabilities (summing to 1).
Workload = tuple[tuple[Demand, float], ...]


def host_fits(node: NodeFree, demand: Demand) -> bool:
    if node.cpu_free_milli is not None and node.cpu_free_milli < demand.cpu_milli:
        return False
    return node.mem_free_mib is None or node.mem_free_mib >= demand.mem_mib


def model_fits(node: NodeFree, demand: Demand) -> bool:
    """Does the node's card model satisfy the demand's model constraint (if any)?"""
    if demand.gpus == 0 or not demand.gpu_models:
        return True
    return node.gpu_model is not None and node.gpu_model in demand.gpu_models


def card_fits(free: int, capacity: int, demand: Demand) -> bool:
    """Can one card host one share of `demand`?"""
    if demand.whole or demand.gpus > 1:
        return free == capacity and capacity > 0
    return demand.mib_per_card <= free and demand.mib_per_card > 0


def fitting_cards(node: NodeFree, demand: Demand) -> tuple[int, ...]:
    """Indices of cards that could each host one share of `demand`, in index order."""
    pairs = enumerate(zip(node.free, node.capacity, strict=True))
    return tuple(i for i, (f, c) in pairs if card_fits(f, c, demand))


def fits(node: NodeFree, demand: Demand) -> bool:
    if not host_fits(node, demand) or not model_fits(node, demand):
        return False
    if demand.gpus == 0:
        return True
    return len(fitting_cards(node, demand)) >= demand.gpus


def take(node: NodeFree, demand: Demand, cards: tuple[int, ...]) -> NodeFree:
    """The node after `demand` is placed on `cards` (which must fit)."""
    free = list(node.free)
    for i in cards:
        used = node.capacity[i] if (demand.whole or demand.gpus > 1) else demand.mib_per_card
        if free[i] < used:
            raise ValueError(f"card {i} of {node.name} cannot take {used} units")
        free[i] -= used
    cpu = node.cpu_free_milli
    mem = node.mem_free_mib
    return dataclasses.replace(
        node,
        free=tuple(free),
        cpu_free_milli=None if cpu is None else cpu - demand.cpu_milli,
        mem_free_mib=None if mem is None else mem - demand.mem_mib,
    )
