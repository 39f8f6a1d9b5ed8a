"""The placement model: cards, nodes, allocations, fleet state, job requests and settings.

Frozen dataclasses with tuples; MiB for GPU and host memory, milli-cores for CPU. A `FleetState`
is what placement reads (inventory + observed + allocated), `JobRequest` what it is asked to place,
`Settings` how (policy, job-shape policy, utilization band).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from gpuctl.core.band import DEFAULT_HEADROOM, TARGET_BAND
from gpuctl.core.placement.fit import NodeFree
from gpuctl.core.placement.policies import DEFAULT_POLICY
from gpuctl.core.units import MemPerCard

WHOLE = MemPerCard(whole=True)


class Tier(enum.StrEnum):
    """`standard` work is admitted up to the band's upper edge; `spot` may use the headroom."""

    STANDARD = "standard"
    SPOT = "spot"


class Card(NamedTuple):
    """One GPU as placement sees it. Free = capacity − allocated − ghost (never below 0).

    A named tuple, not a frozen dataclass: a poll of a large fleet builds one per GPU (8,000 a
    second on the dashboard), and a frozen dataclass costs three times as much to build. Change
    one with `card._replace(field=value)`. The `index` field shadows `tuple.index`, which
    nothing calls on a card."""

    index: int  # type: ignore[assignment]
    capacity_mib: int
    uuid: str | None = None
    model: str | None = None
    allocated_mib: int = 0  # granted by gpuctl (a whole card: all of it)
    ghost_mib: int = 0  # observed in use by processes gpuctl does not account for
    healthy: bool = True

    @property
    def free_mib(self) -> int:
        if not self.healthy:
            return 0
        return max(0, self.capacity_mib - self.allocated_mib - self.ghost_mib)

    @property
    def empty(self) -> bool:
        return self.healthy and self.allocated_mib == 0 and self.ghost_mib == 0


@dataclasses.dataclass(frozen=True, slots=True)
class PlacementNode:
    name: str
    cards: tuple[Card, ...] = ()
    cpu_milli: int | None = None  # capacity; None: unknown, never limits
    cpu_allocated_milli: int = 0
    host_mem_mib: int | None = None  # capacity; None: unknown, never limits
    host_mem_allocated_mib: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    schedulable: bool = True
    reason: str | None = None  # why not schedulable: "cordoned", "unreachable (timeout)", ...
    # worked out once per node value, on first use (a poller keeps unchanged nodes: the fleet's
    # sums then cost one lookup per node, not a walk over every card)
    _totals: NodeTotals | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # checked once per node value (a poller keeps unchanged nodes from one fleet state to
        # the next), not once per fleet state
        cards = self.cards
        if len({c.index for c in cards}) != len(cards):
            raise ValueError(f"card indexes of node {self.name} must be unique")

    def totals(self) -> NodeTotals:
        found = self._totals
        if found is None:
            found = NodeTotals.of(self)
            object.__setattr__(self, "_totals", found)
        return found

    @property
    def cpu_free_milli(self) -> int | None:
        return None if self.cpu_milli is None else max(0, self.cpu_milli - self.cpu_allocated_milli)

    @property
    def host_mem_free_mib(self) -> int | None:
        if self.host_mem_mib is None:
            return None
        return max(0, self.host_mem_mib - self.host_mem_allocated_mib)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeTotals:
    """Sums over one node's cards (memory of healthy cards only) and its free view."""

    capacity_mib: int
    allocated_mib: int  # each card's at most its capacity
    free_mib: int
    empty_cards: int  # healthy, nothing allocated, no ghost memory
    free: NodeFree  # what the fragmentation measure reads

    @classmethod
    def of(cls, node: PlacementNode) -> NodeTotals:
        capacity = allocated = free_mib = empty = 0
        frees = []
        caps = []
        cards = node.cards
        model = cards[0].model if cards else None
        # one pass, each card unpacked once (a tuple: no attribute lookups) and no builtin calls
        # (a poll walks 8,000 cards)
        for _, cap, _, card_model, alloc, ghost, healthy in cards:
            if card_model != model:
                model = None  # mixed models: unknown
            caps.append(cap)
            if healthy:
                free = cap - alloc - ghost  # Card.free_mib
                if free < 0:
                    free = 0
                capacity += cap
                allocated += alloc if alloc < cap else cap
                free_mib += free
                if not alloc and not ghost:
                    empty += 1
                frees.append(free)
            else:
                frees.append(0)
        free_view = NodeFree(
            node.name,
            tuple(frees),
            tuple(caps),
            node.cpu_free_milli,
            node.host_mem_free_mib,
            model,
        )
        return cls(capacity, allocated, free_mib, empty, free_view)


@dataclasses.dataclass(frozen=True, slots=True)
class Allocation:
    """What gpuctl granted one job: cards on one node, `mib_per_card` on each (whole: all).
    `owner`: who granted it, `gpuctl` or a workload manager (`slurm`: a Slurm job's cards, which
    gpuctl counts and never places onto, moves or stops)."""

    job: str
    node: str
    cards: tuple[int, ...]
    mib_per_card: int
    whole: bool = False
    cpu_milli: int = 0
    host_mem_mib: int = 0
    tier: Tier = Tier.STANDARD
    group: str | None = None
    avoid_jobs: tuple[str, ...] = ()  # job anti-affinity, kept so later jobs respect it too
    avoid_groups: tuple[str, ...] = ()
    owner: str = "gpuctl"

    def to_dict(self) -> dict[str, Any]:
        """As plans and their version digests write it (JSON); `owner` only when not gpuctl."""
        doc: dict[str, Any] = {
            "job": self.job,
            "node": self.node,
            "cards": list(self.cards),
            "mib_per_card": self.mib_per_card,
            "whole": self.whole,
            "cpu_milli": self.cpu_milli,
            "host_mem_mib": self.host_mem_mib,
            "tier": self.tier.value,
            "group": self.group,
            "avoid_jobs": list(self.avoid_jobs),
            "avoid_groups": list(self.avoid_groups),
        }
        if self.owner != "gpuctl":
            doc["owner"] = self.owner
        return doc

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Allocation:
        return cls(
            job=str(d["job"]),
            node=str(d["node"]),
            cards=tuple(int(i) for i in d["cards"]),
            mib_per_card=int(d["mib_per_card"]),
            whole=bool(d["whole"]),
            cpu_milli=int(d.get("cpu_milli", 0)),
            host_mem_mib=int(d.get("host_mem_mib", 0)),
            tier=Tier(d.get("tier", "standard")),
            group=d.get("group"),
            avoid_jobs=tuple(str(s) for s in d.get("avoid_jobs") or ()),
            avoid_groups=tuple(str(s) for s in d.get("avoid_groups") or ()),
            owner=str(d.get("owner", "gpuctl")),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class FleetState:
    """Nodes with their cards' allocated and ghost memory, the allocations behind them, and the
    version of the fleet state they were read from (plans carry it)."""

    nodes: tuple[PlacementNode, ...]
    allocations: tuple[Allocation, ...] = ()
    version: str = ""

    def __post_init__(self) -> None:
        names = {n.name for n in self.nodes}
        if len(names) != len(self.nodes):
            raise ValueError("node names in a fleet state must be unique")

    def node(self, name: str) -> PlacementNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def capacity_mib(self) -> int:
        """GPU memory of healthy cards on schedulable nodes: the band's denominator."""
        return sum(n.totals().capacity_mib for n in self.nodes if n.schedulable)

    def allocated_mib(self) -> int:
        """Allocated GPU memory of healthy cards on schedulable nodes: the band's numerator."""
        return sum(n.totals().allocated_mib for n in self.nodes if n.schedulable)

    def utilization(self) -> float | None:
        """Allocated / total GPU memory of schedulable nodes (0..1); None without capacity."""
        total = self.capacity_mib()
        return None if total == 0 else self.allocated_mib() / total


@dataclasses.dataclass(frozen=True, slots=True)
class LabelRequirement:
    """A node label test: `key` present with one of `values` (any value when `values` is empty)."""

    key: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.key not in labels:
            return False
        return not self.values or labels[self.key] in self.values

    def text(self) -> str:
        if not self.values:
            return self.key
        if len(self.values) == 1:
            return f"{self.key}={self.values[0]}"
        return f"{self.key} in ({', '.join(self.values)})"


@dataclasses.dataclass(frozen=True, slots=True)
class JobShape:
    """What a job asks of one node: `gpus` cards × `mem_per_card`, host CPU and memory."""

    gpus: int = 1
    mem_per_card: MemPerCard = WHOLE
    gpu_models: tuple[str, ...] = ()  # any of these models; empty: any model
    cpu_milli: int = 0
    host_mem_mib: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpu_milli < 0 or self.host_mem_mib < 0:
            raise ValueError("a job shape is never negative")


@dataclasses.dataclass(frozen=True, slots=True)
class JobRequest:
    name: str
    shape: JobShape = dataclasses.field(default_factory=JobShape)
    tier: Tier = Tier.STANDARD
    priority: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    node_affinity: tuple[LabelRequirement, ...] = ()  # every one must match
    node_anti_affinity: tuple[LabelRequirement, ...] = ()  # none may match
    group: str | None = None
    avoid_jobs: tuple[str, ...] = ()  # never share a node with these jobs (symmetric)
    avoid_groups: tuple[str, ...] = ()  # ... nor with jobs of these groups


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """How to place: the policy, the job-shape policy and the utilization band.

    Standard-tier work is admitted while fleet utilization stays at or below
    `min(band_max, 1 − headroom)`; spot-tier work may go up to 100% when `spot_uses_headroom`.
    A single-GPU job asking for more than `whole_card_over` of a card gets a whole card.
    """

    policy: str = DEFAULT_POLICY
    whole_card_over: float = 0.5
    band_max: float = TARGET_BAND.upper  # the band's upper edge (core.band: one definition)
    headroom: float = DEFAULT_HEADROOM
    spot_uses_headroom: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.whole_card_over <= 1:
            raise ValueError("whole_card_over must be in (0, 1]")
        if not 0 < self.band_max <= 1:
            raise ValueError("band_max must be in (0, 1]")
        if not 0 <= self.headroom < 1:
            raise ValueError("headroom must be in [0, 1)")

    @property
    def standard_limit(self) -> float:
        return min(self.band_max, 1.0 - self.headroom)

    @property
    def spot_limit(self) -> float:
        return 1.0 if self.spot_uses_headroom else self.standard_limit

    def limit_for(self, tier: Tier) -> float:
        return self.spot_limit if tier is Tier.SPOT else self.standard_limit


_TOKEN = re.compile(r"[a-z0-9]+")


def model_matches(wanted: str, model: str | None) -> bool:
    """`H100` matches `NVIDIA H100 80GB HBM3`: every word of `wanted` is a word of `model`
    (case-insensitive), so `A10` does not match `A100-SXM4-80GB`."""
    if model is None:
        return False
    have = set(_TOKEN.findall(model.lower()))
    want = _TOKEN.findall(wanted.lower())
    return bool(want) and all(w in have for w in want)
