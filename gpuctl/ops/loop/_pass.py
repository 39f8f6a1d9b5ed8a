"""One control-loop pass: what it saw (the gather, the runs observed), what it did (its report's
actions), and the helpers every step writes through (an event per change, a compare-and-set per
write, one job's trouble reported without stopping the pass). The steps are the loop package's
private modules; the package front runs them in order."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import ParamSpec, Protocol

from gpuctl.adapters.protocols import Clock, JobRunner, Store
from gpuctl.core.health.model import HealthRules
from gpuctl.core.jobs.model import (
    Event,
    Incarnation,
    IncarnationState,
    Job,
    NodeLiveness,
    RunStatus,
)
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSpec
from gpuctl.errors import GpuctlError, StateError, StoreConflict, TransportError
from gpuctl.ops.health import HistoryKeeper
from gpuctl.ops.loop.model import Action, FleetSource, NodeReport, ReconcileSettings

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
