"""The control loop: one pass gathers, judges liveness, observes runs, records exits, fails over,
fences, copies checkpoints, holds slices, then places and launches queued work.

A pass runs under the store's loop lock, so two loops never act at once; every side effect on a
node is preceded by its intent in the store (`begin_launch`, `STOPPING`, `LOST`), and a launch
whose outcome is unknown is observed on its node next pass, never run again blindly. Each step
appends an event (actor "gpuctl") and an `Action` to the pass's report.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path

from gpuctl.adapters.clock import local_offset_s
from gpuctl.adapters.protocols import Clock, JobRunner, Store
from gpuctl.core import timefmt
from gpuctl.core.health.model import HealthRules
from gpuctl.core.jobs.model import (
    CommitSeen,
    Incarnation,
    IncarnationState,
    RunStatus,
    is_slurm_run,
)
from gpuctl.core.model import FleetSnapshot, Inventory
from gpuctl.core.shared import PublishedFleet, encode
from gpuctl.errors import ControllerLeads, LeaseLost, StateError, StoreConflict
from gpuctl.ops.health import HistoryKeeper, SampleHistory
from gpuctl.ops.loop import (
    _checkpoints,
    _health,
    _jobs,
    _nodes,
    _slurm,
    _view,
    launch,
    migrations,
)
from gpuctl.ops.loop.model import (
    ACTOR,
    Action,
    FleetSource,
    LoopState,
    NodeReport,
    Pass,
    PassReport,
    ReconcileSettings,
    Target,
)

log = logging.getLogger(__name__)
ACTIVE = (IncarnationState.LAUNCHING, IncarnationState.RUNNING, IncarnationState.STOPPING)
DEFAULT_INTERVAL_S = 5.0  # `reconcile --watch`'s default: a one-shot pass publishes with it
LOOP_SAMPLES = 400  # health samples a running loop keeps per node, at most ...
LOOP_SAMPLES_S = 1800.0  # ... and none older than this

__all__ = [
    "Action",
    "FleetSource",
    "LoopState",
    "NodeReport",
    "Pass",
    "PassReport",
    "ReconcileSettings",
    "Reconciler",
    "Target",
    "control_loop",
    "run_pass",
]


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
        # (job id, incarnation) -> the newest commit its node's observe reported when its
        # checkpoints were last read: they are read again when that changes
        self.commits_read: dict[tuple[str, int], CommitSeen] = {}
        self.health_rules = health_rules  # None: the built-in rules, read at the first pass
        # the samples the health rules look back at (sustained heat): in memory for a loop that
        # keeps running (half an hour of them); a one-shot run passes the state dir's file
        # (`SampleHistory.in_state_dir`)
        self.health_history: HistoryKeeper = health_history or SampleHistory(
            keep=LOOP_SAMPLES, max_age_s=LOOP_SAMPLES_S
        )
        self.health_suspect: bool | None = None  # most nodes looked unhealthy (None: not read)
        # records the fleet's history after each pass that ran to its end (`ops.history`)
        self.record_history: Callable[[Store, float, FleetSnapshot], object] | None = None
        # each pass's poll goes into the store for operators to read (`core.shared`), saying who
        # polled and how soon the next poll is due (`watch` sets it)
        self.publisher = ACTOR
        self.interval_s = DEFAULT_INTERVAL_S

    def run_once(self, stop: threading.Event | None = None, *, locked: bool = True) -> PassReport:
        """One pass. Raises StoreConflict when another loop holds the lock past `lock_wait_s`,
        or a controller holds a live lease (`gpuctl controller run`). `locked=False`: a
        controller's pass, kept apart by its lease's fence instead (`ops.controller`)."""
        if self.settings.dry_run:
            return run_pass(Pass(self, stop))
        with self.store.loop_lock(self.settings.lock_wait_s) if locked else nullcontext():
            if locked:
                _no_controller(self.store)
            p = Pass(self, stop)
            report = run_pass(p)
            publish(self, p.snapshot)
            if self.record_history is not None and not report.interrupted:
                self.record_history(self.store, p.now, p.snapshot)
            return report

    def watch(
        self,
        interval_s: float,
        stop: threading.Event,
        on_report: Callable[[PassReport | None], None] | None = None,
        on_skip: Callable[[StoreConflict], None] | None = None,
    ) -> int:
        """Pass after pass until `stop` is set; returns the number of passes. A pass that finds
        another loop holding the lock, or a controller leading, is skipped (`on_skip(why)`,
        then `on_report(None)`)."""
        passes = 0
        self.interval_s = interval_s
        while not stop.is_set():
            started = self.clock.monotonic()
            try:
                report: PassReport | None = self.run_once(stop)
            except StoreConflict as exc:
                report = None
                if on_skip is not None:
                    on_skip(exc)
            passes += 1
            if on_report is not None:
                on_report(report)
            stop.wait(max(0.0, interval_s - (self.clock.monotonic() - started)))
        return passes


def publish(loop: Reconciler, snapshot: FleetSnapshot) -> None:
    """The pass's poll into the store, for status, dash and metrics to read instead of polling
    (`core.shared`). A store that refuses it costs the readers a poll of their own, never the
    pass: the failure is logged."""
    if not snapshot.nodes:
        return
    published = PublishedFleet(
        taken_at=snapshot.taken_at,
        published_at=loop.clock.now(),
        publisher=loop.publisher,
        interval_s=loop.interval_s,
        nodes=len(snapshot.nodes),
        body=encode(snapshot),
    )
    try:
        loop.store.publish_snapshot(published)
    except LeaseLost:  # a controller that lost its lease steps down now, not at its next write
        raise
    except StateError as exc:
        log.warning("the fleet snapshot was not published: %s", exc.message)


def _no_controller(store: Store) -> None:
    lease = store.lease()
    if lease is not None and lease.live:
        until = timefmt.stamp(lease.expires_at, local_offset_s(lease.expires_at))
        raise ControllerLeads(
            f"controller {lease.holder} leads (token {lease.token}, lease until {until}, "
            f"{timefmt.ago(lease.expires_at, lease.now)}): reconcile runs no pass",
            hint="`gpuctl controller status` shows it; stop it to run reconcile",
        )


def run_pass(p: Pass) -> PassReport:
    """Run the pass's steps in order (the loop lock is the caller's), reading each table of the
    store once (`_view`)."""
    p.store = _view.view(p.store)
    started = p.loop.clock.monotonic()
    interrupted = False
    steps: tuple[Callable[[], None], ...] = (
        lambda: _nodes.gather(p),
        lambda: _nodes.observe(p),
        lambda: _nodes.fence(p),
        lambda: _settle(p),
        lambda: _slurm.track(p),  # the jobs Slurm runs: their states recorded, nothing done
        lambda: _stop_overdue(p),
        lambda: _cancel(p),
        lambda: _failover(p),
        lambda: _checkpoints.sync_checkpoints(p),
        lambda: launch.hold_slices(p),
        lambda: _health.health(p),
        lambda: migrations.advance_all(p),
        lambda: launch.place_and_launch(p),
    )
    for step in steps:
        if p.stop is not None and p.stop.is_set() and step is not steps[0]:
            interrupted = True
            break
        step()
    counts: dict[str, int] = {}
    for job in p.store.jobs():
        counts[job.state.value] = counts.get(job.state.value, 0) + 1
    return PassReport(
        started_at=p.now,
        duration_s=p.loop.clock.monotonic() - started,
        dry_run=p.dry,
        suspect_network=p.suspect,
        nodes=tuple(p.node_reports[n] for n in sorted(p.node_reports)),
        actions=tuple(p.actions),
        jobs=counts,
        interrupted=interrupted,
    )


def _settle(p: Pass) -> None:
    """Launches confirmed or failed; exits recorded."""
    for inc in p.store.incarnations(holding=True):
        if inc.state not in ACTIVE or inc.node not in p.observed:
            continue
        if is_slurm_run(p.store.job(inc.job_id)):
            continue  # Slurm's run: `_slurm.track` records its end
        run = p.observed[inc.node].get((inc.job_id, inc.n))
        p.guard(_settle_one, p, inc, run)


def _settle_one(p: Pass, inc: Incarnation, run: RunStatus | None) -> None:
    if inc.state is IncarnationState.LAUNCHING:
        if run is None:
            if p.now - inc.started_at < p.settings.launch_settle_s:
                p.note("launching", f"{inc.job_id}: launch not confirmed yet", job=inc.job_id)
                return
            _jobs.launch_failed(p, inc, "the launch never reached its node")
            return
        inc = p.update_inc(
            inc,
            IncarnationState.LAUNCHING,
            "launched",
            f"incarnation {inc.n} of {inc.job_id} found running on {inc.node} (pid {run.pid})",
            state=IncarnationState.RUNNING,
            pid=run.pid,
            run_dir=run.run_dir or inc.run_dir,
        )
    if run is None:  # the node listed every run dir, and this one is not there
        _jobs.ended(p, inc, None, "its run dir is gone from the node")
    elif not run.alive:
        _jobs.ended(p, inc, run.exit_code, None)
    elif run.pid is not None and run.pid != inc.pid and not p.dry:
        p.store.update_incarnation(inc.job_id, inc.n, pid=run.pid)


def _stop_overdue(p: Pass) -> None:
    """Stopping incarnations past their job's grace: kill the process group. (A migration
    keeps its own grace: its source is left to `advance`.)"""
    moving = {(r.job_id, r.from_incarnation) for r in p.store.reservations()}
    for inc in p.store.incarnations(holding=True):
        if inc.state is not IncarnationState.STOPPING or inc.node not in p.observed:
            continue
        if (inc.job_id, inc.n) in moving:
            continue
        run = p.observed[inc.node].get((inc.job_id, inc.n))
        if run is None or not run.alive:
            continue  # settle recorded it
        p.guard(_jobs.kill_if_overdue, p, inc)


def _cancel(p: Pass) -> None:
    for job in p.store.jobs():
        if job.cancel_requested and not job.state.terminal:
            p.guard(_jobs.cancel, p, job)


def _failover(p: Pass) -> None:
    """Incarnations on down nodes are lost; their jobs are requeued (not while suspecting our
    own network)."""
    lost = [
        i
        for i in p.store.incarnations(holding=True)
        if i.state in ACTIVE
        and i.node in p.down
        and not is_slurm_run(p.store.job(i.job_id))  # Slurm requeues its own
    ]
    if not lost:
        return
    if p.suspect:
        for inc in lost:
            p.note(
                "failover",
                f"{inc.job_id}: {inc.node} is down, but most nodes are: not requeued",
                job=inc.job_id,
                node=inc.node,
                outcome="waiting",
            )
        return
    for inc in lost:
        p.guard(_jobs.fail_over, p, inc)


def control_loop(
    store: Store,
    fleet: FleetSource,
    runner: JobRunner,
    inventory: Inventory,
    clock: Clock,
    *,
    settings: ReconcileSettings,
    env: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
    on_action: Callable[[Action], None] | None = None,
    history: HistoryKeeper | None = None,
) -> Reconciler:
    """The control loop as `gpuctl reconcile` runs it, over `store`, the fleet and its job runner
    (a `gpuctl.ops.parts.FleetLink`'s two): what drain, consolidation, playbooks and the
    dashboard's actions drive too."""
    return Reconciler(
        store,
        fleet,
        runner,
        inventory,
        clock,
        settings,
        environ=env,
        state_dir=None if state_dir is None else str(state_dir),
        on_action=on_action,
        health_history=history,
    )
