"""The control loop's values: its settings, what one pass did (per node: liveness, ghost memory;
per action) as a value that `gpuctl reconcile -o json` prints and `--watch` streams, the fleet
source it polls, where an incarnation starts (`Target`), and one pass (`Pass`): what it saw (the
gather, the runs observed), what it did, and the helpers every step writes through (an event per
change, a compare-and-set per write, one job's trouble reported without stopping the pass), over
what it reads and keeps of its loop (`LoopState`). The steps are the package's other modules; the
package front runs them in order."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, Protocol

from gpuctl.adapters.protocols import Clock, JobRunner, Store
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.health.model import HealthRules
from gpuctl.core.jobs.liveness import DEFAULT_GRACE_S, DEFAULT_MASS_FAILURE_FRACTION
from gpuctl.core.jobs.model import (
    CommitSeen,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    NodeLiveness,
    RunStatus,
)
from gpuctl.core.jobs.restarts import RestartPolicy
from gpuctl.core.jobs.stall import StallPolicy
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSpec
from gpuctl.core.placement.model import Allocation, Settings
from gpuctl.errors import GpuctlError, StateError, StoreConflict, TransportError
from gpuctl.ops.health import HistoryKeeper

DEFAULT_LAUNCH_SETTLE_S = 20.0
DEFAULT_CHECKPOINT_SCAN_S = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class ReconcileSettings:
    """How the loop decides. `grace_s`: a node is down after this long without an answer;
    `mass_failure_fraction`: more than this share of the nodes failing at once suspends failover;
    `launch_settle_s`: a launch not found on its node this long after its intent was written
    failed; `checkpoint_scan_s`: how often a running job's checkpoints are read (per job) when
    its node's observe does not say what it committed last (a run launched by an older gpuctl);
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


# --- one pass: its state, and the helpers every step writes through ---------------------------


log = logging.getLogger("gpuctl.ops.loop")

ACTOR = "gpuctl"
P = ParamSpec("P")


class LoopState(Protocol):
    """What a pass reads and keeps of its loop (`gpuctl.ops.loop.Reconciler` is one)."""

    store: Store
    fleet: FleetSource
    runner: JobRunner
    inventory: Inventory
    clock: Clock
    settings: ReconcileSettings
    environ: Mapping[str, str]
    state_dir: str | None
    on_action: Callable[[Action], None] | None
    scanned_at: dict[str, float]
    commits_read: dict[tuple[str, int], CommitSeen]
    health_rules: HealthRules | None
    health_history: HistoryKeeper
    health_suspect: bool | None


class Pass:
    """The state of one pass: what the gather saw, what was observed, what was done."""

    def __init__(self, loop: LoopState, stop: threading.Event | None) -> None:
        self.loop = loop
        self.store = loop.store
        self.runner = loop.runner
        self.settings = loop.settings
        self.dry = loop.settings.dry_run
        self.stop = stop
        self.specs = loop.inventory.by_name()
        self.now = loop.clock.now()
        self.actions: list[Action] = []
        self.snapshot = FleetSnapshot(taken_at=self.now, nodes=())
        self.liveness: dict[str, NodeLiveness] = {}
        self.answering: set[str] = set()
        self.down: set[str] = set()
        self.suspect = False
        self.observed: dict[str, dict[tuple[str, int], RunStatus]] = {}
        self.node_reports: dict[str, NodeReport] = {}

    # --- helpers -----------------------------------------------------------------------------

    def observe_nodes(self, names: set[str]) -> None:
        """Outside a full pass (a command driving migrations): list the runs of `names`."""
        for name in sorted(names):
            spec = self.specs.get(name)
            if spec is None:
                continue
            try:
                runs = self.runner.observe(spec)
            except TransportError as exc:
                self.note("observe", f"{name}: could not list its runs: {exc}", node=name)
                continue
            self.answering.add(name)
            self.observed[name] = {(r.job_id, r.incarnation): r for r in runs}

    def guard(self, work: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
        """One job's trouble (a node that stopped answering, a lost compare-and-set, a bad spec)
        is reported and the pass goes on."""
        try:
            work(*args, **kwargs)
        except StoreConflict as exc:
            self.note("conflict", f"changed under this pass: {exc}", outcome="skipped")
        except StateError:  # the store itself refuses (corrupt, full): the pass stops, closed
            raise
        except GpuctlError as exc:
            self.note("error", exc.message, outcome="failed")

    def event(
        self,
        kind: str,
        message: str,
        *,
        job: str | None = None,
        node: str | None = None,
        inc: int | None = None,
        outcome: str | None = "ok",
        data: Mapping[str, object] | None = None,
    ) -> Event:
        body = dict(data or {})
        if inc is not None:
            body.setdefault("incarnation", inc)
        return Event(self.now, ACTOR, kind, message, job, node, outcome, body)

    def record(
        self,
        kind: str,
        message: str,
        *,
        job: str | None = None,
        node: str | None = None,
        inc: int | None = None,
        outcome: str | None = "ok",
    ) -> None:
        """Report an action whose event the store already wrote."""
        action = Action(kind, message, job, node, inc, "would" if self.dry else outcome)
        self.actions.append(action)
        log.info("%s: %s", kind, message)
        if self.loop.on_action is not None:
            self.loop.on_action(action)

    def act(
        self,
        kind: str,
        message: str,
        *,
        job: str | None = None,
        node: str | None = None,
        inc: int | None = None,
        outcome: str | None = "ok",
        data: Mapping[str, object] | None = None,
    ) -> None:
        """Append an event (unless a dry run) and report it."""
        if not self.dry:
            self.store.append_event(
                self.event(kind, message, job=job, node=node, inc=inc, outcome=outcome, data=data)
            )
        self.record(kind, message, job=job, node=node, inc=inc, outcome=outcome)

    def note(
        self,
        kind: str,
        message: str,
        *,
        job: str | None = None,
        node: str | None = None,
        outcome: str | None = "waiting",
    ) -> None:
        """Report without an event: nothing changed (waiting, skipped, retried next pass)."""
        self.actions.append(Action(kind, message, job, node, None, outcome))
        if self.loop.on_action is not None:
            self.loop.on_action(self.actions[-1])

    def update_inc(
        self,
        inc: Incarnation,
        expect: IncarnationState,
        kind: str,
        message: str,
        **changes: object,
    ) -> Incarnation:
        """Compare-and-set one incarnation with its event; the new value (dry run: as it would
        be). An incarnation that ends gets `ended_at` now, unless it ended before (lost)."""
        ending = changes.get("state") in (IncarnationState.EXITED, IncarnationState.KILLED)
        if ending and inc.ended_at is None:
            changes.setdefault("ended_at", self.now)
        if self.dry:
            self.record(kind, message, job=inc.job_id, node=inc.node, inc=inc.n)
            return dataclasses.replace(inc, **changes)  # type: ignore[arg-type]
        new = self.store.update_incarnation(
            inc.job_id,
            inc.n,
            expect=expect,
            event=self.event(kind, message, job=inc.job_id, node=inc.node, inc=inc.n),
            **changes,
        )
        self.record(kind, message, job=inc.job_id, node=inc.node, inc=inc.n)
        return new

    def update_job(
        self,
        job: Job,
        kind: str,
        message: str,
        *,
        outcome: str | None = "ok",
        **changes: object,
    ) -> Job:
        """Compare-and-set one job (expecting the state it was read in) with its event."""
        changes.setdefault("updated_at", self.now)
        if self.dry:
            self.record(kind, message, job=job.id, outcome=outcome)
            return dataclasses.replace(job, **changes)  # type: ignore[arg-type]
        new = self.store.update_job(
            job.id,
            expect=job.state,
            event=self.event(
                kind, message, job=job.id, inc=job.incarnation or None, outcome=outcome
            ),
            **changes,
        )
        self.record(kind, message, job=job.id, outcome=outcome)
        return new

    def spec(self, node: str) -> NodeSpec:
        return self.specs[node]
