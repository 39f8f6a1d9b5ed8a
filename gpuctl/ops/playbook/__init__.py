"""Playbooks as a service: the dry run (the full plan, nothing touched) and the run (step by step,
each step's result per node, every step an event in the store, stops on failure per the settings,
one run at a time, resumable after a crash).

Every step is a call into gpuctl's own services (`ops.moves`, `ops.jobs`,
`ops.health`, the control loop), never a shell-out to gpuctl; `run` steps go through the
`Transport` with commands built by `shlex.join`. The steps themselves are the
package's private `_steps` (the kinds in `_fleet_steps` and `_node_steps`, their dry-run detail in
`_preview`); the fleet view they read and what a run carries in `model`; the lock and the journal
in `_state`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuctl.config.hostlist import fold
from gpuctl.core import playbook as core
from gpuctl.core.jobs.model import Event
from gpuctl.core.playbook import Playbook, TimeWindow, Unit
from gpuctl.core.playbook.run import Journal, StepResult, in_play, step_result, stop_reason
from gpuctl.errors import StateError
from gpuctl.ops.playbook import _steps as steps
from gpuctl.ops.playbook._preview import preview
from gpuctl.ops.playbook._state import JournalFile, LockHeld, PlaybookLock
from gpuctl.ops.playbook.model import RunContext, Services, View, observe

__all__ = [
    "JournalFile",
    "LockHeld",
    "PlaybookLock",
    "RunPlan",
    "RunReport",
    "Services",
    "View",
    "observe",
    "plan_run",
    "run",
]

Notice = Callable[[str], None]


# --- the plan (the dry run, and what a run shows before it asks) ---------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedStep:
    key: str
    batch: int
    step: int
    kind: str
    title: str
    action: str  # what the step does
    nodes: tuple[str, ...]
    when: str | None  # the condition, evaluated on the fleet as it is now
    detail: tuple[str, ...]  # what it would change, as the fleet is now
    done: str | None = None  # the outcome of an earlier run of it (a resumed run skips it)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["nodes"], d["detail"] = list(self.nodes), list(self.detail)
        return d


@dataclasses.dataclass(frozen=True, slots=True)
class RunPlan:
    playbook: str
    resumes: str | None  # the interrupted run a run would resume
    source: str
    description: str
    targets: tuple[str, ...]
    batches: tuple[tuple[str, ...], ...]
    window: str | None
    inside_window: bool
    max_fail_percentage: float
    steps: tuple[PlannedStep, ...]
    numbers: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook,
            "resumes": self.resumes,
            "source": self.source,
            "description": self.description,
            "targets": list(self.targets),
            "batches": [list(b) for b in self.batches],
            "window": self.window,
            "inside_window": self.inside_window,
            "max_fail_percentage": self.max_fail_percentage,
            "steps": [s.to_dict() for s in self.steps],
            "numbers": dict(self.numbers),
        }


def plan_run(
    playbook: Playbook,
    services: Services,
    *,
    override_window: bool = False,
    window: TimeWindow | None = None,
    journal: Journal | None = None,
    view: View | None = None,
    state_dir: Path | None = None,
) -> RunPlan:
    """What the run would do, step by step, as the fleet is now. Reads the fleet and the store;
    changes nothing (no event, no journal, no lock, no health sample). `override_window`: use
    `window` (None: any time) instead of the playbook's. With `state_dir`, an interrupted run
    that a run would resume is planned as resumed (its done steps marked)."""
    win = window if override_window else playbook.settings.window
    if journal is None and state_dir is not None:
        journal = interrupted(playbook, state_dir)
    view = view or observe(services, {} if journal is None else journal.health)
    if journal is not None:
        plan = journal.batches
        targets = tuple(n for b in plan for n in b)
    else:
        targets = core.resolve_targets(playbook.targets, list(view.facts.values()))
        plan = core.batches(targets, playbook.settings)
    planned = []
    for unit in core.units(playbook, plan):
        done = None if journal is None else journal.done.get(unit.key)
        when, detail = preview(services, unit, view)
        planned.append(
            PlannedStep(
                key=unit.key,
                batch=unit.batch,
                step=unit.step.index,
                kind=unit.step.kind,
                title=unit.step.title,
                action=core.describe(unit.step),
                nodes=unit.nodes,
                when=when,
                detail=detail,
                done=done,
            )
        )
    return RunPlan(
        playbook=playbook.name,
        resumes=None if journal is None else journal.run_id,
        source=playbook.source,
        description=playbook.description,
        targets=targets,
        batches=tuple(plan),
        window=None if win is None else win.text,
        inside_window=win is None or win.contains(services.minute_of_day()),
        max_fail_percentage=playbook.settings.max_fail_percentage,
        steps=tuple(planned),
        numbers=view.numbers,
    )


# --- the run -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class RunReport:
    playbook: str
    run_id: str | None
    outcome: str  # ok, failed, stopped (window closed; resumable), outside_window, declined
    message: str
    steps: tuple[StepResult, ...] = ()
    targets: int = 0
    failed_nodes: tuple[str, ...] = ()
    resumed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "playbook": self.playbook,
            "run_id": self.run_id,
            "outcome": self.outcome,
            "message": self.message,
            "resumed": self.resumed,
            "targets": self.targets,
            "failed_nodes": list(self.failed_nodes),
            "steps": [s.to_dict() for s in self.steps],
        }


def run(
    playbook: Playbook,
    services: Services,
    *,
    state_dir: Path,
    resume: bool = False,
    override_window: bool = False,
    window: TimeWindow | None = None,
    confirm: Callable[[RunPlan], bool] | None = None,
    on_step: Callable[[StepResult], None] | None = None,
    notice: Notice | None = None,
) -> RunReport:
    """Run `playbook` (see the module docstring). `override_window`: use `window` (None: any
    time) instead of the playbook's. `confirm` sees the plan and says whether to go on. Raises
    LockHeld (another run holds the playbook's lock) and StateError (nothing to resume, the
    journal is unreadable)."""
    say: Notice = notice or (lambda _: None)
    clock = services.loop.clock
    win = window if override_window else playbook.settings.window
    with PlaybookLock(state_dir, playbook.name, now=clock.now) as lock:
        if lock.taken_over is not None:
            say(
                f"took over the lock of playbook {playbook.name} from "
                f"{lock.taken_over.text()}: that run is gone (crashed or killed)"
            )
        journals = JournalFile(state_dir, playbook.name)
        journal = _resumable(playbook, journals.load(), resume, say)
        resumed = journal is not None
        if win is not None and not win.contains(services.minute_of_day()):
            message = f"outside the window {win.text}: nothing done"
            return RunReport(
                playbook.name,
                None if journal is None else journal.run_id,
                "outside_window",
                message,
                resumed=resumed,
            )
        view = observe(services, {} if journal is None else journal.health)
        if journal is None:
            targets = core.resolve_targets(playbook.targets, list(view.facts.values()))
            journal = Journal(
                run_id=_run_id(playbook.name, clock.now()),
                playbook=playbook.name,
                digest=playbook.digest,
                started_at=clock.now(),
                operator=services.operator,
                batches=core.batches(targets, playbook.settings),
                targets=len(targets),
                updated_at=clock.now(),
            )
        if confirm is not None:
            plan = plan_run(
                playbook, services, override_window=True, window=win, journal=journal, view=view
            )
            if not confirm(plan):
                return RunReport(
                    playbook.name, journal.run_id, "declined", "nothing done", resumed=resumed
                )
        journals.save(journal)
        kind = "playbook.resume" if resumed else "playbook.start"
        verb = f"resumed run {journal.run_id} of" if resumed else "started"
        _event(services, journal, kind, f"{services.operator} {verb} playbook {playbook.name}")
        return _execute(playbook, services, journals, journal, win, resumed, on_step, view)


def interrupted(playbook: Playbook, state_dir: Path) -> Journal | None:
    """The journal of an interrupted run of this very playbook, which a run would resume."""
    found = JournalFile(state_dir, playbook.name).load()
    if found is None or found.status != "running" or found.digest != playbook.digest:
        return None
    return found


def _resumable(
    playbook: Playbook, previous: Journal | None, resume: bool, say: Notice
) -> Journal | None:
    """The journal to resume, or None for a fresh run."""
    unfinished = previous is not None and previous.status == "running"
    retry = previous is not None and resume and previous.status == "failed"
    if previous is None or not (unfinished or retry):
        if resume:
            last = "no earlier run" if previous is None else f"run {previous.run_id} ended"
            raise StateError(
                f"nothing to resume for playbook {playbook.name}: {last} ({_status(previous)})",
                hint="run it without --resume",
            )
        return None
    if previous.digest != playbook.digest:
        if resume:
            raise StateError(
                f"cannot resume run {previous.run_id}: {playbook.source} changed since it started",
                hint="run it without --resume to start afresh",
            )
        say(
            f"run {previous.run_id} was interrupted, but the playbook changed since: starting "
            "afresh"
        )
        return None
    if retry:  # the failed steps run again, for every node
        done = {k: v for k, v in previous.done.items() if v != "failed"}
        previous = dataclasses.replace(previous, done=done, failed_nodes=())
    why = "was interrupted" if unfinished else "stopped on a failure: failed steps run again"
    say(f"resuming run {previous.run_id} (it {why}): {len(previous.done)} step(s) done are skipped")
    return dataclasses.replace(previous, status="running", current=None)


def _status(journal: Journal | None) -> str:
    return "none" if journal is None else journal.status


def _execute(
    playbook: Playbook,
    services: Services,
    journals: JournalFile,
    journal: Journal,
    win: TimeWindow | None,
    resumed: bool,
    on_step: Callable[[StepResult], None] | None,
    view: View,
) -> RunReport:
    clock = services.loop.clock
    results: list[StepResult] = []
    context = RunContext(services, playbook, journal, view)
    try:
        for unit in core.units(playbook, journal.batches):
            if unit.key in journal.done:
                results.append(_earlier(unit, journal.done[unit.key]))
                continue
            if win is not None and not win.contains(services.minute_of_day()):
                message = f"the window {win.text} closed before step {unit.step.index + 1}"
                _event(services, journal, "playbook.end", message, outcome="stopped")
                return _report(playbook, journal, "stopped", message, results, resumed)
            journal = journal.start(unit.key, clock.now())
            journals.save(journal)
            live = Unit(unit.batch, unit.step, in_play(unit.nodes, journal))
            result = steps.execute(context, live)
            journal = journal.finish(result, clock.now(), health=context.health)
            context.journal = journal
            journals.save(journal)
            _event(
                services,
                journal,
                "playbook.step",
                f"{playbook.name} step {unit.step.index + 1} ({unit.step.title}), batch "
                f"{unit.batch + 1}: {result.outcome}: {result.message}",
                outcome=result.outcome,
                data={"step": result.to_dict()},
            )
            results.append(result)
            if on_step is not None:
                on_step(result)
            stop = stop_reason(journal, result, playbook.settings)
            if stop is not None and result.nodes and journal.failed_nodes:
                stop = f"{stop}: {fold(journal.failed_nodes)}"  # which, as one hostlist
            if stop is not None:
                journal = journal.close("failed", clock.now())
                journals.save(journal)
                _event(services, journal, "playbook.end", f"stopped: {stop}", outcome="failed")
                return _report(playbook, journal, "failed", stop, results, resumed)
    except KeyboardInterrupt:
        _event(services, journal, "playbook.end", "interrupted", outcome="interrupted")
        raise
    journal = journal.close("done", clock.now())
    journals.save(journal)
    failed = len(journal.failed_nodes)
    message = f"{len(results)} step(s) done" + (
        f"; {failed} of {journal.targets} target(s) failed (within max_fail_percentage): "
        f"{fold(journal.failed_nodes)}"
        if failed
        else ""
    )
    _event(services, journal, "playbook.end", message, outcome="ok")
    return _report(playbook, journal, "ok", message, results, resumed)


def _earlier(unit: Unit, outcome: str) -> StepResult:
    done = step_result(unit, outcome, "done by the interrupted run: skipped")
    return dataclasses.replace(done, earlier=True)


def _report(
    playbook: Playbook,
    journal: Journal,
    outcome: str,
    message: str,
    results: Sequence[StepResult],
    resumed: bool,
) -> RunReport:
    return RunReport(
        playbook=playbook.name,
        run_id=journal.run_id,
        outcome=outcome,
        message=message,
        steps=tuple(results),
        targets=journal.targets,
        failed_nodes=journal.failed_nodes,
        resumed=resumed,
    )


def _event(
    services: Services,
    journal: Journal,
    kind: str,
    message: str,
    *,
    outcome: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> None:
    services.loop.store.append_event(
        Event(
            at=services.loop.clock.now(),
            actor=services.operator,
            kind=kind,
            message=message,
            outcome=outcome,
            data={"playbook": journal.playbook, "run_id": journal.run_id, **(data or {})},
        )
    )


def _run_id(name: str, now: float) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"{name}-{stamp}-{os.urandom(3).hex()}"
