"""The consolidation vocabulary: what consolidation knows of a job (`JobFacts`), a move
(`Migration`), what a plan frees (`FleetFigures`), a job it would not move (`Pinned`), the
drain-and-refill result (`TargetOutcome`) and the plan (`ConsolidationPlan`). Frozen values;
the package's pieces import them from here, never from the package front.
"""

from __future__ import annotations

import dataclasses

from gpuctl.core.placement.fragmentation import DEAD_WEIGHT, HOST_WEIGHT
from gpuctl.core.placement.model import LabelRequirement, Tier

DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S = 1800.0
DEFAULT_MAX_MOVES = 10


@dataclasses.dataclass(frozen=True, slots=True)
class JobFacts:
    """What consolidation needs to know of one allocated job beyond its `Allocation`."""

    job: str  # the allocation's job key
    disruptible: bool = True
    last_moved_at: float | None = None  # when its current run started; None: unknown (long ago)
    min_runtime_between_moves_s: float = DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S
    checkpoint_age_s: float | None = None  # None: no committed checkpoint
    gpu_models: tuple[str, ...] = ()  # the job's model constraint (any of these)
    node_affinity: tuple[LabelRequirement, ...] = ()
    node_anti_affinity: tuple[LabelRequirement, ...] = ()
    hold: str | None = None  # why it may not move now, as the caller knows (a move under way)


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    """One move: checkpoint, stop, restart on `to_node`/`to_cards` (reserved first)."""

    job: str
    tier: Tier
    from_node: str
    from_cards: tuple[int, ...]
    to_node: str
    to_cards: tuple[int, ...]
    mib_per_card: int  # the slice (a whole card: its capacity)
    whole: bool
    checkpoint_age_s: float | None
    stranded_freed_mib: float  # the cost this move frees (stranded + weighted dead holes)
    cpu_milli: int = 0  # what the job holds on its node besides cards
    host_mem_mib: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class FleetFigures:
    """What a plan frees, over schedulable nodes (MiB on a fleet; milli-GPU in the benchmark)."""

    whole_free_cards: int
    whole_free_nodes: int
    free_mib: int
    stranded_mib: float
    capacity_mib: int
    # free memory in holes some but almost no card-sharing job fits (`consolidation_dead_range`);
    # the planner charges `DEAD_WEIGHT` per unit of it on top of the stranded memory
    dead_mib: int = 0
    # free card memory beyond what the nodes' free CPU and host memory feed at the workload's
    # average (`host_stranded`); the planner charges `HOST_WEIGHT` per unit of it
    unfed_mib: float = 0.0

    @property
    def fragmentation_pct(self) -> float | None:
        return None if self.free_mib == 0 else 100.0 * self.stranded_mib / self.free_mib

    @property
    def cost_mib(self) -> float:
        """What the planner lowers: stranded memory, plus `HOST_WEIGHT` times the unfed memory
        and `DEAD_WEIGHT` times the dead holes."""
        return self.stranded_mib + HOST_WEIGHT * self.unfed_mib + DEAD_WEIGHT * self.dead_mib

    @property
    def stranded_gib(self) -> float:
        return self.stranded_mib / 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Pinned:
    """A job the plan would not move, and why."""

    job: str
    node: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class TargetOutcome:
    """The drain-and-refill result: where the target fits after the plan's moves, or why not."""

    shape: str  # the request in words
    fits: bool
    node: str | None
    cards: tuple[int, ...]
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class ConsolidationPlan:
    version: str  # `consolidation_version` of the state it was computed from
    version_after: str  # ... of the state it predicts
    snapshot_version: str  # the fleet snapshot's own version, for the record
    max_moves: int
    moves: tuple[Migration, ...]
    before: FleetFigures
    after: FleetFigures
    pinned: tuple[Pinned, ...]
    reason: str  # why the plan stops where it does
    target: TargetOutcome | None = None

    @property
    def empty(self) -> bool:
        return not self.moves
