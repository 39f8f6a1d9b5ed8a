"""Consolidation as a service: the planner's inputs from a gather and the store, the plan, and
applying it through the migration primitive (`gpuctl.ops.moves.migrate`).

* `gather_inputs`: the fleet state placement reads (with the cards migrations hold), one
  `JobFacts` per running job (its spec's `disruptible` and `min_runtime_between_moves`, when its
  current incarnation started, the age of its newest committed checkpoint, its model and label
  constraints), and the target workload (`core.fleet.workload.workload_for`).
* `apply`: refuses a plan whose version is not the fleet's now ("stale plan: recompute") and, with
  a maintenance window, any time outside it; then runs the moves in order, in waves of at most
  `parallel` moves that do not depend on each other (a move depends on an earlier one that leaves
  the node it goes to). The first wave with a move that did not land as planned ends the run: the
  later moves were planned on a fleet that no longer exists, and are reported as skipped.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuctl.adapters.protocols import Store
from gpuctl.core.consolidation import (
    ConsolidationPlan,
    JobFacts,
    Migration,
    consolidation_version,
    plan_consolidation,
)
from gpuctl.core.fleet.workload import workload_for
from gpuctl.core.jobs.model import IncarnationState, Job, JobState, is_slurm_run
from gpuctl.core.model import FleetSnapshot
from gpuctl.core.placement.fit import Workload
from gpuctl.core.placement.model import FleetState, JobRequest, JobShape, Settings
from gpuctl.errors import PlanError, UsageError

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import LoopState
    from gpuctl.ops.moves.migrate import MigrationResult

# --- inputs ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    state: FleetState
    facts: tuple[JobFacts, ...]
    workload: Workload


def fleet_state(snapshot: FleetSnapshot, store: Store | None) -> FleetState:
    """Placement's view (`ops.fleetstatus.fleet_state`: live incarnations, the cards migrations
    hold, the cordons)."""
    from gpuctl.ops.fleetstatus import fleet_state as base

    return base(snapshot, store)


def facts_for(store: Store, now: float, jobs: Iterable[Job] | None = None) -> list[JobFacts]:
    """One `JobFacts` per job running on cards; a job moving already is held where it is, and
    a job Slurm runs is Slurm's to move (held, saying so)."""
    moving = {r.job_id: r.node for r in store.reservations()}
    out = []
    for job in jobs if jobs is not None else store.jobs([JobState.RUNNING]):
        if job.state is not JobState.RUNNING or job.incarnation == 0:
            continue
        inc = next((i for i in store.incarnations(job.id) if i.n == job.incarnation), None)
        if inc is None or not inc.state.holds_cards:
            continue
        policy, request = job.spec.policy, job.spec.request
        committed = [c.committed_at for c in store.checkpoints(job.id)]
        hold = None
        if is_slurm_run(job):
            hold = "Slurm runs it: Slurm's jobs are Slurm's to move"
        elif job.id in moving:
            hold = f"a migration to {moving[job.id]} is under way"
        elif inc.state is not IncarnationState.RUNNING:
            hold = f"its incarnation is {inc.state.value}"
        out.append(
            JobFacts(
                job=job.id,
                disruptible=policy.disruptible,
                last_moved_at=inc.started_at,
                min_runtime_between_moves_s=policy.min_runtime_between_moves_s,
                checkpoint_age_s=max(0.0, now - max(committed)) if committed else None,
                gpu_models=request.shape.gpu_models,
                node_affinity=request.node_affinity,
                node_anti_affinity=request.node_anti_affinity,
                hold=hold,
            )
        )
    return out


def gather_inputs(
    snapshot: FleetSnapshot, store: Store | None, now: float, settings: Settings | None = None
) -> Inputs:
    state = fleet_state(snapshot, store)
    if store is None:
        return Inputs(state, (), workload_for(state, (), now, settings))
    jobs = store.jobs()
    running = [j for j in jobs if j.state is JobState.RUNNING]
    return Inputs(
        state, tuple(facts_for(store, now, running)), workload_for(state, jobs, now, settings)
    )


def plan(
    inputs: Inputs,
    *,
    now: float,
    max_moves: int,
    settings: Settings | None = None,
    target: JobRequest | JobShape | None = None,
) -> ConsolidationPlan:
    return plan_consolidation(
        inputs.state,
        inputs.facts,
        max_moves=max_moves,
        workload=inputs.workload,
        settings=settings,
        now=now,
        target=target,
    )


# --- the maintenance window ------------------------------------------------------------------

_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


@dataclasses.dataclass(frozen=True, slots=True)
class Window:
    """`HH:MM-HH:MM` in local time, start included, end excluded; may wrap past midnight."""

    start_min: int
    end_min: int

    @staticmethod
    def parse(text: str) -> Window:
        m = _WINDOW.match(text.strip())
        if m is None:
            raise UsageError(
                f"--window: cannot read {text!r}", hint="HH:MM-HH:MM, e.g. 22:00-04:00"
            )
        h1, m1, h2, m2 = (int(g) for g in m.groups())
        window = Window(h1 * 60 + m1, h2 * 60 + m2)
        if window.start_min == window.end_min:
            raise UsageError(f"--window: {text} is empty", hint="leave --window out for any time")
        return window

    def contains(self, minute_of_day: int) -> bool:
        if self.start_min < self.end_min:
            return self.start_min <= minute_of_day < self.end_min
        return minute_of_day >= self.start_min or minute_of_day < self.end_min

    @property
    def text(self) -> str:
        return f"{_hhmm(self.start_min)}-{_hhmm(self.end_min)}"


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


class OutsideWindow(PlanError):
    """`--apply` outside the maintenance window: nothing was moved."""


def check_window(window: Window | None, minute_of_day: int) -> None:
    if window is not None and not window.contains(minute_of_day):
        raise OutsideWindow(
            f"outside the maintenance window {window.text} (local time now "
            f"{_hhmm(minute_of_day)}): nothing applied",
            hint="run it again inside the window, or change --window",
        )


# --- applying --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class MoveResult:
    job: str
    outcome: str  # moved | elsewhere | failed | skipped
    message: str
    to_node: str | None = None
    to_cards: tuple[int, ...] = ()

    @property
    def landed(self) -> bool:
        return self.outcome == "moved"


@dataclasses.dataclass(frozen=True, slots=True)
class ApplyResult:
    plan: ConsolidationPlan
    results: tuple[MoveResult, ...]

    @property
    def complete(self) -> bool:
        return all(r.landed for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        from gpuctl.core.consolidation import plan_to_dict

        return {
            "complete": self.complete,
            "moved": sum(1 for r in self.results if r.outcome in ("moved", "elsewhere")),
            "moves": len(self.plan.moves),
            "results": [
                {
                    "job": r.job,
                    "outcome": r.outcome,
                    "message": r.message,
                    "to_node": r.to_node,
                    "to_cards": list(r.to_cards),
                }
                for r in self.results
            ],
            "plan": plan_to_dict(self.plan),
        }


Migrator = Callable[[Sequence[Migration]], Sequence[MoveResult]]


def waves(moves: Sequence[Migration], parallel: int) -> list[list[Migration]]:
    """The moves in order, in groups of at most `parallel` that may run at once: a move never
    shares a group with an earlier one that leaves the node it goes to."""
    out: list[list[Migration]] = []
    for m in moves:
        last = out[-1] if out else None
        if (
            last is not None
            and len(last) < parallel
            and all(e.from_node != m.to_node for e in last)
        ):
            last.append(m)
        else:
            out.append([m])
    return out


def apply(
    plan: ConsolidationPlan,
    *,
    current_version: str,
    migrator: Migrator,
    window: Window | None = None,
    minute_of_day: int = 0,
    parallel: int = 1,
) -> ApplyResult:
    """Carry out `plan`'s moves (see the module docstring). Raises OutsideWindow, or PlanError
    for a stale plan, before anything moves."""
    if parallel < 1:
        raise UsageError("--parallel must be 1 or more")
    check_window(window, minute_of_day)
    if plan.version != current_version:
        raise PlanError(
            f"stale plan: recompute (it was made for fleet version {plan.version}; the fleet is "
            f"at {current_version} now)",
            hint="run `gpuctl consolidate` again",
        )
    results: list[MoveResult] = []
    stopped: str | None = None
    for wave in waves(plan.moves, parallel):
        if stopped is not None:
            results += [MoveResult(m.job, "skipped", stopped) for m in wave]
            continue
        got = {r.job: r for r in migrator(wave)}
        for m in wave:
            r = got.get(m.job) or MoveResult(m.job, "failed", "the migration gave no result")
            if r.outcome == "moved" and (r.to_node, r.to_cards) != (m.to_node, m.to_cards):
                r = dataclasses.replace(
                    r, outcome="elsewhere", message=f"{r.message} (planned: {m.to_node})"
                )
            results.append(r)
            if not r.landed and stopped is None:
                stopped = f"not started: the move of {m.job} did not land as planned"
    return ApplyResult(plan, tuple(results))


def loop_migrator(
    loop: LoopState,
    *,
    operator: str,
    snapshot: FleetSnapshot | None = None,
    timeout_s: float | None = None,
    on_result: Callable[[MigrationResult], None] | None = None,
    versions: Mapping[str, int] | None = None,
    **driver: Any,
) -> Migrator:
    """Moves through the migration primitive: the target reserved first, then checkpoint, stop
    and a restart there from the newest committed checkpoint (`gpuctl.ops.moves.migrate`). `driver`
    goes to `run_migrations` (`poll_s`, `lock_wait_s`, `sleep`)."""
    from gpuctl.core.jobs.migration import DEFAULT_TIMEOUT_S, Source
    from gpuctl.core.placement.model import Allocation
    from gpuctl.ops.loop.model import Target
    from gpuctl.ops.moves.migrate import MigrationRequest, run_migrations

    first = [snapshot]  # the first wave may use the caller's gather; later ones gather afresh

    def run(moves: Sequence[Migration]) -> list[MoveResult]:
        gathered, first[0] = first[0], None
        requests = [
            MigrationRequest(
                m.job,
                Target(
                    Allocation(
                        m.job,
                        m.to_node,
                        m.to_cards,
                        m.mib_per_card,
                        m.whole,
                        m.cpu_milli,
                        m.host_mem_mib,
                    )
                ),
                reason=f"consolidation: {m.from_node} -> {m.to_node}",
                source=Source.CONSOLIDATE.value,
                expect_version=(versions or {}).get(m.job),
            )
            for m in moves
        ]
        done = run_migrations(
            loop,
            requests,
            actor=operator,
            parallel=len(requests),
            timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s,
            snapshot=gathered,
            on_result=on_result,
            **driver,
        )
        return [
            MoveResult(
                r.job_id,
                "moved" if r.moved else "failed",
                f"{r.outcome}: {r.message}",
                r.to_node,
                tuple(r.cards),
            )
            for r in done
        ]

    return run


def current_version(snapshot: FleetSnapshot, store: Store | None) -> str:
    return consolidation_version(fleet_state(snapshot, store))
