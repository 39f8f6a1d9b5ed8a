"""The migration primitive, shared by drain and consolidation: move a running job to other cards.

`reserve` holds the target cards in the store first (one transaction; a double-booked card or a
cordoned target is refused). `advance` then takes the next step
`gpuctl.core.jobs.migration.next_step` decides from what the store and the node say: ask the source
for a checkpoint (SIGUSR1) and wait, bounded, for a newer committed one; stop it (SIGTERM, the
grace, then SIGKILL), recording its end (`drained`, cards released, the job queued again); start the
next incarnation on the reserved cards from the newest committed checkpoint. Each step is an event.
A pass of the control loop advances every reservation (`advance_all`), so a migration whose command
died half-way is finished, or rolled back, by the loop: it is re-observed, never launched twice.

`run_migrations` (and `migrate`, for one job) drive migrations from a command: a few at a time,
each step under the store's loop lock, until each is done or the time is up.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpuctl.adapters.clock import local_offset_s
from gpuctl.core.jobs.migration import DEFAULT_TIMEOUT_S, Reservation, Source
from gpuctl.core.jobs.model import (
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    is_slurm_run,
    job_changed,
)
from gpuctl.core.model import FleetSnapshot
from gpuctl.errors import StalePlan, StoreConflict
from gpuctl.ops.loop.launch import fleet_state
from gpuctl.ops.loop.migrations import (
    advance,
    advance_all,
    choose_target,
    incarnation_of,
    moving_off,
    reserve,
)
from gpuctl.ops.loop.model import Pass, Target

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import LoopState

__all__ = [
    "MigrationRequest",
    "MigrationResult",
    "Target",
    "advance",
    "advance_all",
    "choose_target",
    "migrate",
    "moving_off",
    "reserve",
    "run_migrations",
]


# --- driving migrations from a command -----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationRequest:
    job_id: str
    target: Target | None = None  # None: the best place placement finds
    reason: str = ""
    grace_s: float | None = None  # SIGTERM -> SIGKILL; None: the job's own grace_s
    checkpoint_wait_s: float | None = None  # SIGUSR1 -> SIGTERM at the latest; None: the grace
    source: str = Source.OPERATOR.value
    expect_version: int | None = None  # the job's version the plan saw: a newer one is refused


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationResult:
    job_id: str
    outcome: (
        str  # moved | rolled_back | requeued (stopped, not started yet) | not_started | unfinished
    )
    message: str
    from_node: str | None = None
    to_node: str | None = None
    cards: tuple[int, ...] = ()
    from_incarnation: int | None = None
    incarnation: int | None = None  # the new one, when moved
    resume_step: int | None = None
    duration_s: float | None = None

    @property
    def moved(self) -> bool:
        return self.outcome == "moved"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cards"] = list(self.cards)
        return d


def migrate(
    loop: LoopState,
    job_id: str,
    target: Target | None,
    *,
    reason: str,
    actor: str,
    grace_s: float | None = None,
    checkpoint_wait_s: float | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    source: str = Source.OPERATOR.value,
    **driver: Any,
) -> MigrationResult:
    """Move one running job to `target` (None: wherever placement finds room) and wait until it
    runs there or the migration was rolled back. Bounded: `timeout_s` until the source is asked
    to stop, then its `grace_s`."""
    request = MigrationRequest(job_id, target, reason, grace_s, checkpoint_wait_s, source)
    (result,) = run_migrations(loop, [request], actor=actor, timeout_s=timeout_s, **driver)
    return result


def run_migrations(
    loop: LoopState,
    requests: Sequence[MigrationRequest],
    *,
    actor: str,
    parallel: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = 1.0,
    lock_wait_s: float = 30.0,
    snapshot: FleetSnapshot | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_result: Callable[[MigrationResult], None] | None = None,
) -> list[MigrationResult]:
    """Run `requests`, at most `parallel` at a time, each step under the loop lock. Migrations
    not started by `timeout_s` are not started; those not finished when their bounds have passed
    are left to the control loop (`unfinished`). Results in the order of `requests`."""
    if parallel < 1 or timeout_s <= 0 or poll_s <= 0:
        raise ValueError("parallel is 1 or more; timeout_s and poll_s positive")
    clock = loop.clock
    started_at = clock.now()
    deadline = started_at + timeout_s
    if snapshot is None:
        snapshot = loop.fleet.gather(loop.inventory)
    pending = list(requests)
    active: dict[str, tuple[Reservation, float]] = {}
    results: dict[str, MigrationResult] = {}
    longest = 0.0

    def finish(result: MigrationResult) -> None:
        results[result.job_id] = result
        active.pop(result.job_id, None)
        if on_result is not None:
            on_result(result)

    while pending or active:
        with loop.store.loop_lock(lock_wait_s):
            p = _tick(loop, snapshot)
            while pending and len(active) < parallel:
                req = pending.pop(0)
                started = _start(p, req, actor=actor, deadline=deadline)
                if isinstance(started, MigrationResult):
                    finish(started)
                else:
                    active[req.job_id] = (started, p.now)
                    longest = max(longest, started.grace_s + started.checkpoint_wait_s)
            p.observe_nodes({n for res, _ in active.values() for n in (res.source_node, res.node)})
            stored = {r.job_id: r for r in p.store.reservations()}
            for job_id, (res, since) in list(active.items()):
                if job_id in stored:
                    p.guard(advance, p, stored[job_id])
                done = _outcome(p, res, since)
                if done is not None:
                    finish(done)
        if not active and not pending:
            break
        if clock.now() > deadline + longest + 3 * poll_s:
            for res, since in list(active.values()):
                finish(_unfinished(res, since, clock.now()))
            for req in pending:
                finish(MigrationResult(req.job_id, "not_started", "the drain timed out first"))
            pending = []
            break
        sleep(poll_s)
    return [results[r.job_id] for r in requests]


def _tick(loop: LoopState, snapshot: FleetSnapshot) -> Pass:
    p = Pass(loop, None)
    p.snapshot = snapshot
    return p


def _start(
    p: Pass, req: MigrationRequest, *, actor: str, deadline: float
) -> Reservation | MigrationResult:
    job = p.store.job(req.job_id)
    if job is None:
        return MigrationResult(req.job_id, "not_started", "no such job")
    if is_slurm_run(job):
        return MigrationResult(job.id, "not_started", "Slurm runs it: Slurm's to move")
    existing = next((r for r in p.store.reservations() if r.job_id == job.id), None)
    if existing is not None and req.expect_version is None:  # under way already: follow it
        return existing
    if req.expect_version is not None and job.version != req.expect_version:
        last = p.store.events(job_id=job.id, limit=1)
        said = job_changed(job.id, last[-1] if last else None, local_offset_s(p.now))
        return MigrationResult(job.id, "not_started", said)
    inc = incarnation_of(p, job.id, job.incarnation)
    if (
        job.state is not JobState.RUNNING
        or inc is None
        or inc.state is not IncarnationState.RUNNING
    ):
        now = job.state.value if inc is None else f"{job.state.value}, incarnation {inc.state}"
        return MigrationResult(job.id, "not_started", f"the job is not running ({now})")
    if p.now >= deadline:
        return MigrationResult(job.id, "not_started", "the drain timed out first", inc.node)
    tries: list[Target | None] = [req.target, None] if req.target is not None else [None]
    why = "no target"
    for target in tries:
        chosen = _resolve(p, job, inc, target)
        if isinstance(chosen, str):
            why = chosen
            continue
        try:
            return reserve(
                p,
                job,
                inc,
                chosen[0],
                chosen[1],
                reason=req.reason,
                source=req.source,
                actor=actor,
                grace_s=req.grace_s,
                checkpoint_wait_s=req.checkpoint_wait_s,
                timeout_s=max(0.0, deadline - p.now),
                expect_version=req.expect_version,
            )
        except StoreConflict as exc:
            if isinstance(exc, StalePlan):
                return MigrationResult(job.id, "not_started", exc.message, inc.node)
            why = f"the target was refused ({exc.message})"
    return MigrationResult(job.id, "not_started", f"not moved: {why}", inc.node, None, (), inc.n)


def _resolve(
    p: Pass, job: Job, inc: Incarnation, target: Target | None
) -> tuple[Target, dict[tuple[str, int], int]] | str:
    if target is None:
        return choose_target(p, job, inc)
    try:
        node = fleet_state(p)[0].node(target.node)
    except KeyError:
        return f"{target.node} is not in the fleet"
    uuids = {c.index: c.uuid or "" for c in node.cards}
    alloc = target.allocation
    fixed = Target(
        dataclasses.replace(alloc, mib_per_card=alloc.mib_per_card or inc.mib_per_card),
        target.gpu_uuids or tuple(uuids.get(c, "") for c in target.cards),
    )
    return fixed, {(node.name, c.index): c.capacity_mib for c in node.cards}


def _outcome(p: Pass, res: Reservation, since: float) -> MigrationResult | None:
    """Done (moved or rolled back), or None while the reservation is held."""
    if any(r.job_id == res.job_id for r in p.store.reservations()):
        return None
    job = p.store.job(res.job_id)
    new = incarnation_of(p, res.job_id, res.from_incarnation + 1)
    took = p.now - since
    if job is not None and new is not None and new.state.holds_cards:
        start = "a fresh start" if new.resume_step is None else f"step {new.resume_step}"
        return MigrationResult(
            res.job_id,
            "moved",
            f"moved from {res.source_node} to {new.node} (incarnation {new.n}, from {start})",
            res.source_node,
            new.node,
            new.cards,
            res.from_incarnation,
            new.n,
            new.resume_step,
            took,
        )
    found = p.store.events(job_id=res.job_id, kinds=["migrate_rollback"], limit=1)
    why = found[-1].message if found else "the migration was rolled back"
    stopped = job is not None and job.state is JobState.QUEUED
    return MigrationResult(
        res.job_id,
        "requeued" if stopped else "rolled_back",
        f"{why}; it is queued for the control loop to place" if stopped else why,
        res.source_node,
        res.node,
        res.cards,
        res.from_incarnation,
        None,
        None,
        took,
    )


def _unfinished(res: Reservation, since: float, now: float) -> MigrationResult:
    return MigrationResult(
        res.job_id,
        "unfinished",
        f"still moving to {res.node} ({res.phase.value}); the control loop finishes it",
        res.source_node,
        res.node,
        res.cards,
        res.from_incarnation,
        duration_s=now - since,
    )
