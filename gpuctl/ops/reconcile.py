"""The control loop: one pass gathers, judges liveness, observes runs, records exits, fails over,
fences, copies checkpoints, holds slices, then places and launches queued work.

A pass runs under the store's loop lock, so two loops never act at once; every side effect on a
node is preceded by its intent in the store (`begin_launch`, `STOPPING`, `LOST`), and a launch
whose outcome is unknown is observed on its node next pass, never run again blindly. Each step
appends an event (actor "gpuctl") and an `Action` to the pass's report.
"""

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
from gpuctl.ops import (
    migrate_steps,
    reconcile_checkpoints,
    reconcile_health,
    reconcile_jobs,
    reconcile_launch,
    reconcile_nodes,
)
from gpuctl.ops.health import HistoryKeeper, SampleHistory
from gpuctl.ops.reconcile_report import Action, NodeReport, PassReport, ReconcileSettings

log = logging.getLogger(__name__)

ACTOR = "gpuctl"
P = ParamSpec("P")
ACTIVE = (IncarnationState.LAUNCHING, IncarnationState.RUNNING, IncarnationState.STOPPING)
LOOP_SAMPLES = 400  # health samples a running loop keeps per node, at most ...
LOOP_SAMPLES_S = 1800.0  # ... and none older than this

__all__ = ["Action", "FleetSource", "PassReport", "ReconcileSettings", "Reconciler"]


class FleetSource(Protocol):
    """One poll of the fleet (`gpuctl.ops.gather.Gatherer` is one)."""

    def gather(self, nodes: Inventory) -> FleetSnapshot: ...


class Reconciler:
    """The control loop over one store, one fleet source and one job runner."""

    def __init__(
        self,
        store: Store,
        fleet: FleetSource,
        runner: JobRunner,
        inventory: Inventory,
        clock: Clock,
        settings: ReconcileSettings | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        state_dir: str | None = None,
        on_action: Callable[[Action], None] | None = None,
        health_rules: HealthRules | None = None,
        health_history: HistoryKeeper | None = None,
    ) -> None:
        self.store = store
        self.fleet = fleet
        self.runner = runner
        self.inventory = inventory
        self.clock = clock
        self.settings = settings or ReconcileSettings()
        self.environ: Mapping[str, str] = environ if environ is not None else {}
        self.state_dir = state_dir
        self.on_action = on_action
        self.scanned_at: dict[str, float] = {}  # job id -> when its checkpoints were last read
        self.health_rules = health_rules  # None: the built-in rules, read at the first pass
        # the samples the health rules look back at (sustained heat): in memory for a loop that
        # keeps running (half an hour of them); a one-shot run passes the state dir's file
        # (`SampleHistory.in_state_dir`)
        self.health_history: HistoryKeeper = health_history or SampleHistory(
            keep=LOOP_SAMPLES, max_age_s=LOOP_SAMPLES_S
        )
        self.health_suspect: bool | None = None  # most nodes looked unhealthy (None: not read)

    def run_once(self, stop: threading.Event | None = None) -> PassReport:
        """One pass. Raises StoreConflict when another loop holds the lock past `lock_wait_s`."""
        if self.settings.dry_run:
            return Pass(self, stop).run()
        with self.store.loop_lock(self.settings.lock_wait_s):
            return Pass(self, stop).run()

    def watch(
        self,
        interval_s: float,
        stop: threading.Event,
        on_report: Callable[[PassReport | None], None] | None = None,
    ) -> int:
        """Pass after pass until `stop` is set; returns the number of passes. A pass that finds
        another loop holding the lock is skipped (`on_report(None)`)."""
        passes = 0
        while not stop.is_set():
            started = self.clock.monotonic()
            try:
                report: PassReport | None = self.run_once(stop)
            except StoreConflict:
                report = None
            passes += 1
            if on_report is not None:
                on_report(report)
            stop.wait(max(0.0, interval_s - (self.clock.monotonic() - started)))
        return passes


class Pass:
    """The state of one pass: what the gather saw, what was observed, what was done."""

    def __init__(self, loop: Reconciler, stop: threading.Event | None) -> None:
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

    # --- the steps -------------------------------------------------------------------------

    def run(self) -> PassReport:
        started = self.loop.clock.monotonic()
        interrupted = False
        steps: tuple[Callable[[], None], ...] = (
            lambda: reconcile_nodes.gather(self),
            lambda: reconcile_nodes.observe(self),
            lambda: reconcile_nodes.fence(self),
            self.settle,
            self.stop_overdue,
            self.cancel,
            self.failover,
            lambda: reconcile_checkpoints.sync_checkpoints(self),
            lambda: reconcile_launch.hold_slices(self),
            lambda: reconcile_health.health(self),
            lambda: migrate_steps.advance_all(self),
            lambda: reconcile_launch.place_and_launch(self),
        )
        for step in steps:
            if self.stop is not None and self.stop.is_set() and step is not steps[0]:
                interrupted = True
                break
            step()
        counts: dict[str, int] = {}
        for job in self.store.jobs():
            counts[job.state.value] = counts.get(job.state.value, 0) + 1
        return PassReport(
            started_at=self.now,
            duration_s=self.loop.clock.monotonic() - started,
            dry_run=self.dry,
            suspect_network=self.suspect,
            nodes=tuple(self.node_reports[n] for n in sorted(self.node_reports)),
            actions=tuple(self.actions),
            jobs=counts,
            interrupted=interrupted,
        )

    def settle(self) -> None:
        """Launches confirmed or failed; exits recorded."""
        for inc in self.store.incarnations(holding=True):
            if inc.state not in ACTIVE or inc.node not in self.observed:
                continue
            run = self.observed[inc.node].get((inc.job_id, inc.n))
            self.guard(self._settle_one, inc, run)

    def _settle_one(self, inc: Incarnation, run: RunStatus | None) -> None:
        if inc.state is IncarnationState.LAUNCHING:
            if run is None:
                if self.now - inc.started_at < self.settings.launch_settle_s:
                    self.note(
                        "launching", f"{inc.job_id}: launch not confirmed yet", job=inc.job_id
                    )
                    return
                reconcile_jobs.launch_failed(self, inc, "the launch never reached its node")
                return
            inc = self.update_inc(
                inc,
                IncarnationState.LAUNCHING,
                "launched",
                f"incarnation {inc.n} of {inc.job_id} found running on {inc.node} (pid {run.pid})",
                state=IncarnationState.RUNNING,
                pid=run.pid,
                run_dir=run.run_dir or inc.run_dir,
            )
        if run is None:  # the node listed every run dir, and this one is not there
            reconcile_jobs.ended(self, inc, None, "its run dir is gone from the node")
        elif not run.alive:
            reconcile_jobs.ended(self, inc, run.exit_code, None)
        elif run.pid is not None and run.pid != inc.pid and not self.dry:
            self.store.update_incarnation(inc.job_id, inc.n, pid=run.pid)

    def stop_overdue(self) -> None:
        """Stopping incarnations past their job's grace: kill the process group. (A migration
        keeps its own grace: its source is left to `migrate_steps.advance`.)"""
        moving = {(r.job_id, r.from_incarnation) for r in self.store.reservations()}
        for inc in self.store.incarnations(holding=True):
            if inc.state is not IncarnationState.STOPPING or inc.node not in self.observed:
                continue
            if (inc.job_id, inc.n) in moving:
                continue
            run = self.observed[inc.node].get((inc.job_id, inc.n))
            if run is None or not run.alive:
                continue  # settle recorded it
            self.guard(reconcile_jobs.kill_if_overdue, self, inc)

    def cancel(self) -> None:
        for job in self.store.jobs():
            if job.cancel_requested and not job.state.terminal:
                self.guard(reconcile_jobs.cancel, self, job)

    def failover(self) -> None:
        """Incarnations on down nodes are lost; their jobs are requeued (not while suspecting our
        own network)."""
        lost = [
            i
            for i in self.store.incarnations(holding=True)
            if i.state in ACTIVE and i.node in self.down
        ]
        if not lost:
            return
        if self.suspect:
            for inc in lost:
                self.note(
                    "failover",
                    f"{inc.job_id}: {inc.node} is down, but most nodes are: not requeued",
                    job=inc.job_id,
                    node=inc.node,
                    outcome="waiting",
                )
            return
        for inc in lost:
            self.guard(reconcile_jobs.fail_over, self, inc)

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
