"""The control loop's values: its settings, what one pass did (per node: liveness, ghost memory;
per action) as a value that `gpuctl reconcile -o json` prints and `--watch` streams, the fleet
source it polls and where an incarnation starts (`Target`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.liveness import DEFAULT_GRACE_S, DEFAULT_MASS_FAILURE_FRACTION
from gpuctl.core.jobs.restarts import RestartPolicy
from gpuctl.core.jobs.stall import StallPolicy
from gpuctl.core.model import FleetSnapshot, Inventory
from gpuctl.core.placement.model import Allocation, Settings

DEFAULT_LAUNCH_SETTLE_S = 20.0
DEFAULT_CHECKPOINT_SCAN_S = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class ReconcileSettings:
    """How the loop decides. `grace_s`: a node is down after this long without an answer;
    `mass_failure_fraction`: more than this share of the nodes failing at once suspends failover;
    `launch_settle_s`: a launch not found on its node this long after its intent was written
    failed; `checkpoint_scan_s`: how often a running job's checkpoints are read (per job);
    `health`: automatic cordons and drains of unhealthy nodes (hysteresis, rate limit,
    cool-down); `stall`: when a running job that stopped committing checkpoints is alerted."""

    placement: Settings = dataclasses.field(default_factory=Settings)
    grace_s: float = DEFAULT_GRACE_S
    mass_failure_fraction: float = DEFAULT_MASS_FAILURE_FRACTION
    restarts: RestartPolicy = dataclasses.field(default_factory=RestartPolicy)
    launch_settle_s: float = DEFAULT_LAUNCH_SETTLE_S
    checkpoint_scan_s: float = DEFAULT_CHECKPOINT_SCAN_S
    lock_wait_s: float = 0.0
    dry_run: bool = False
    health: AutoDrainPolicy = dataclasses.field(default_factory=AutoDrainPolicy)
    stall: StallPolicy = dataclasses.field(default_factory=StallPolicy)

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.launch_settle_s < 0 or self.checkpoint_scan_s < 0:
            raise ValueError("reconcile durations are never negative")
        if not 0 < self.mass_failure_fraction <= 1:
            raise ValueError("mass_failure_fraction must be in (0, 1]")


@dataclasses.dataclass(frozen=True, slots=True)
class Action:
    """One thing the pass did (or, in a dry run, would do). `kind` is the event kind."""

    kind: str
    message: str
    job_id: str | None = None
    node: str | None = None
    incarnation: int | None = None
    outcome: str | None = None  # ok, failed, waiting, skipped, would

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True, slots=True)
class NodeReport:
    name: str
    reach: str  # as the gather saw it: ok, refused, timeout, unreachable, ...
    liveness: str  # ok, failing (within the grace), down
    failing_for_s: float | None = None
    ghost_mib: int = 0  # GPU memory of processes gpuctl did not launch
    ghost_pids: tuple[int, ...] = ()
    health: str | None = None  # the health verdict of this pass: healthy, degraded, ...
    health_action: str | None = None  # what it asks of the loop: none, alert, cordon, drain

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["ghost_pids"] = list(self.ghost_pids)
        return d


@dataclasses.dataclass(frozen=True, slots=True)
class PassReport:
    started_at: float
    duration_s: float
    dry_run: bool
    suspect_network: bool
    nodes: tuple[NodeReport, ...]
    actions: tuple[Action, ...]
    jobs: Mapping[str, int]  # jobs per state after the pass
    interrupted: bool = False  # a stop request ended the pass between two steps

    def to_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "dry_run": self.dry_run,
            "suspect_network": self.suspect_network,
            "interrupted": self.interrupted,
            "jobs": dict(self.jobs),
            "nodes": [n.to_dict() for n in self.nodes],
            "actions": [a.to_dict() for a in self.actions],
        }

    def of(self, kind: str) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.kind == kind)


class FleetSource(Protocol):
    """One poll of the fleet (`gpuctl.ops.gather.Gatherer` is one)."""

    def gather(self, nodes: Inventory) -> FleetSnapshot: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """Where an incarnation starts: a placement's allocation, or a migration's reserved cards,
    and the UUIDs of those cards (empty: not known yet)."""

    allocation: Allocation
    gpu_uuids: tuple[str, ...] = ()

    @property
    def node(self) -> str:
        return self.allocation.node

    @property
    def cards(self) -> tuple[int, ...]:
        return self.allocation.cards
