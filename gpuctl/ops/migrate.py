"""The migration primitive, shared by drain and consolidation: move a running job to other cards.

`reserve` holds the target cards in the store first (one transaction; a double-booked card or a
cordoned target is refused). `advance` then takes the next step `gpuctl.core.migration.next_step`
decides from what the store and the node say: ask the source for a checkpoint (SIGUSR1) and wait,
bounded, for a newer committed one; stop it (SIGTERM, the grace, then SIGKILL), recording its end
(`drained`, cards released, the job queued again); start the next incarnation on the reserved
cards from the newest committed checkpoint. Each step is an event. A pass of the control loop
advances every reservation (`advance_all`), so a migration whose command died half-way is
finished, or rolled back, by the loop: it is re-observed, never launched twice.

`run_migrations` (and `migrate`, for one job) drive migrations from a command: a few at a time,
each step under the store's loop lock, until each is done or the time is up.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpuctl.core.jobs import EndReason, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.migration import (
    DEFAULT_TIMEOUT_S,
    Phase,
    Reservation,
    Source,
    Step,
    StepKind,
    next_step,
)
from gpuctl.core.model import FleetSnapshot
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.model import Allocation, FleetState
from gpuctl.errors import GpuctlError, StoreConflict, TransportError
from gpuctl.ops import reconcile_checkpoints, reconcile_jobs, reconcile_launch
from gpuctl.ops import reconcile_spec as specs
from gpuctl.ops.reconcile_launch import Target

if TYPE_CHECKING:
    from gpuctl.ops.reconcile import Pass, Reconciler

__all__ = [
    "MigrationRequest",
    "MigrationResult",
    "Target",
    "advance",
    "advance_all",
    "choose_target",
    "migrate",
    "reserve",
    "run_migrations",
]

CHAINED = (StepKind.RECORD_END, StepKind.KILL)  # after these, the job can go on at once


# --- one step at a time (inside a pass) ----------------------------------------------------


def choose_target(
    p: Pass, job: Job, inc: Incarnation, state: FleetState | None = None
) -> tuple[Target, dict[tuple[str, int], int]] | str:
    """Where the job could go (never its own node): (target, card capacities), or why nowhere.
    Drains and consolidations may use the failover headroom, as a failover does."""
    if state is None:
        state, _ = reconcile_launch.fleet_state(p)
    nodes = tuple(
        dataclasses.replace(n, schedulable=False, reason="the job is moving off it")
        if n.name == inc.node
        else n
        for n in state.nodes
    )
    state = dataclasses.replace(state, nodes=nodes, allocations=moving_off(state, job.id))
    jobs = {j.id: j for j in p.store.jobs()}
    req = reconcile_launch.placement_request(job, jobs)
    settings = dataclasses.replace(p.settings.placement, band_max=1.0, headroom=0.0)
    result = plan(state, [req], settings)
    if not result.placed:
        return result.unplaced[0].reason
    placed = result.placed[0]
    alloc = placed.allocation
    node = state.node(placed.node)
    target = Target(
        placed.node,
        alloc.cards,
        tuple(u or "" for u in placed.card_uuids),
        alloc.mib_per_card,
        alloc.whole,
        alloc.cpu_milli,
        alloc.host_mem_mib,
    )
    return target, {(node.name, c.index): c.capacity_mib for c in node.cards}


def moving_off(state: FleetState, job_id: str) -> tuple[Allocation, ...]:
    """The state's allocations with the job's current one renamed: it keeps its cards until it
    stops, while placement looks for the job's next home."""
    return tuple(
        dataclasses.replace(a, job=f"{a.job}#moving") if a.job == job_id else a
        for a in state.allocations
    )


def reserve(
    p: Pass,
    job: Job,
    inc: Incarnation,
    target: Target,
    capacity: dict[tuple[str, int], int],
    *,
    reason: str,
    source: str,
    actor: str,
    grace_s: float | None = None,
    checkpoint_wait_s: float | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Reservation:
    """Hold `target` for the job's next incarnation (StoreConflict when the store refuses)."""
    grace = specs.grace_s(job) if grace_s is None else grace_s
    res = Reservation(
        job_id=job.id,
        from_incarnation=inc.n,
        source_node=inc.node,
        node=target.node,
        cards=target.cards,
        mib_per_card=target.mib_per_card,
        whole=target.whole,
        capacity_mib=tuple(capacity.get((target.node, c), 0) for c in target.cards),
        created_at=p.now,
        deadline_at=p.now + timeout_s,
        grace_s=grace,
        checkpoint_wait_s=grace if checkpoint_wait_s is None else checkpoint_wait_s,
        reason=reason,
        actor=actor,
        source=source,
        gpu_uuids=target.gpu_uuids,
        cpu_milli=target.cpu_milli,
        host_mem_mib=target.host_mem_mib,
    )
    cards = ",".join(str(c) for c in target.cards)
    message = (
        f"moving incarnation {inc.n} of {job.id} from {inc.node} to {target.node} cards "
        f"{cards} ({source}: {reason}); the target is held until it starts there"
    )
    if p.dry:
        p.record("reserve", message, job=job.id, node=target.node, inc=inc.n)
        return res
    event = dataclasses.replace(
        p.event("reserve", message, job=job.id, node=target.node, inc=inc.n, data=_data(res)),
        actor=actor,
    )
    p.store.reserve(res, event=event)
    p.record("reserve", message, job=job.id, node=target.node, inc=inc.n)
    return res


def _data(res: Reservation) -> dict[str, object]:
    return {
        "source": res.source,
        "reason": res.reason,
        "from_node": res.source_node,
        "to_node": res.node,
        "cards": list(res.cards),
    }


def advance_all(p: Pass, only: Iterable[str] | None = None) -> None:
    """The control loop's step: take every migration (or those of `only`) one step further."""
    wanted = None if only is None else set(only)
    for res in p.store.reservations():
        if wanted is None or res.job_id in wanted:
            p.guard(advance, p, res)


def advance(p: Pass, res: Reservation) -> Step:
    """Take the migration as far as it can go now; the last step taken (or waited on)."""
    step = Step(StepKind.WAIT, "nothing done")
    for _ in range(4):
        job = p.store.job(res.job_id)
        source = _incarnation(p, res.job_id, res.from_incarnation)
        alive = _alive(p, source)
        newest = None
        if (
            job is not None
            and source is not None
            and source.state is IncarnationState.RUNNING
            and res.phase is Phase.CHECKPOINTING
            and alive
        ):
            newest = _newest_step(p, job, source, sync=True)
        cordoned = any(c.node == res.node for c in p.store.cordons())
        step = next_step(
            res,
            job=job,
            source=source,
            alive=alive,
            newest_step=newest,
            now=p.now,
            target_cordoned=cordoned,
        )
        if step.kind.waits:
            p.note("migrate", f"{res.job_id}: {step.why}", job=res.job_id, node=res.node)
            return step
        if p.dry:
            p.record(
                "migrate", f"{res.job_id}: would {step.kind.value}: {step.why}", job=res.job_id
            )
            return step
        assert job is not None
        updated = _apply(p, res, step, job, source)
        if updated is None or step.kind not in CHAINED:
            return step
        res = updated
    return step


def _apply(
    p: Pass, res: Reservation, step: Step, job: Job, source: Incarnation | None
) -> Reservation | None:
    """Carry out one step; the reservation as it is now (None: gone)."""
    kind = step.kind
    if kind is StepKind.ROLLBACK:
        _rollback(p, res, step.why)
        return None
    if kind is StepKind.LAUNCH:
        _launch(p, res, job, source)
        return None
    assert source is not None
    if kind is StepKind.REQUEST_CHECKPOINT:
        return _request_checkpoint(p, res, job, source)
    if kind is StepKind.STOP:
        return _stop(p, res, source, step.why)
    if kind is StepKind.KILL:
        p.runner.signal(p.spec(source.node), source.job_id, source.n, "KILL")
        done = p.update_inc(
            source,
            IncarnationState.STOPPING,
            "kill",
            f"incarnation {source.n} of {job.id} on {source.node} did not stop within "
            f"{res.grace_s:g}s of SIGTERM: SIGKILL (it resumes from its newest committed "
            "checkpoint)",
            state=IncarnationState.KILLED,
        )
        reconcile_jobs.settle_job(p, done)
        return res
    if kind is StepKind.RECORD_END:
        run = p.observed.get(source.node, {}).get((source.job_id, source.n))
        reconcile_jobs.ended(
            p, source, None if run is None else run.exit_code, None if run else "its run is gone"
        )
        return res
    raise AssertionError(kind)  # pragma: no cover - every kind is handled above


def _request_checkpoint(p: Pass, res: Reservation, job: Job, source: Incarnation) -> Reservation:
    baseline = _newest_step(p, job, source, sync=True)
    message = (
        f"SIGUSR1 to incarnation {source.n} of {job.id} on {source.node}: checkpoint now "
        f"(newest known: {'none' if baseline is None else f'step {baseline}'}; waiting up to "
        f"{res.checkpoint_wait_s:g}s before SIGTERM)"
    )
    updated = p.store.update_reservation(
        job.id,
        expect=Phase.RESERVED,
        event=p.event(
            "checkpoint_request",
            message,
            job=job.id,
            node=source.node,
            inc=source.n,
            data={"baseline_step": baseline, "to_node": res.node},
        ),
        phase=Phase.CHECKPOINTING,
        checkpoint_requested_at=p.now,
        baseline_step=baseline,
    )
    p.record("checkpoint_request", message, job=job.id, node=source.node, inc=source.n)
    p.runner.signal(p.spec(source.node), job.id, source.n, "USR1")
    return updated


def _stop(p: Pass, res: Reservation, source: Incarnation, why: str) -> Reservation:
    """SIGTERM, recorded first: the source `stopping` (end reason drained)."""
    message = (
        f"moving to {res.node}: {why}: SIGTERM to incarnation {source.n} of {source.job_id} on "
        f"{source.node}, SIGKILL after {res.grace_s:g}s"
    )
    p.update_inc(
        source,
        IncarnationState.RUNNING,
        "stop",
        message,
        state=IncarnationState.STOPPING,
        end_reason=EndReason.DRAINED,
    )
    updated = p.store.update_reservation(res.job_id, phase=Phase.STOPPING, stop_requested_at=p.now)
    p.runner.signal(p.spec(source.node), source.job_id, source.n, "TERM")
    return updated


def _launch(p: Pass, res: Reservation, job: Job, source: Incarnation | None) -> None:
    if res.node not in p.answering or res.node not in p.specs:
        _rollback(p, res, f"the target {res.node} does not answer; the job is placed anew")
        _elsewhere(p, res, job, source)
        return
    if source is not None and source.node in p.answering:
        # its newest checkpoints (the one written on SIGTERM too), copied for `sync: pull`
        p.guard(reconcile_checkpoints.sync_one, p, job, source)
    target = Target(
        res.node,
        res.cards,
        res.gpu_uuids,
        res.mib_per_card,
        res.whole,
        res.cpu_milli,
        res.host_mem_mib,
    )
    try:
        started = reconcile_launch.launch_on(
            p, job, target, res.capacity(), why=f" (moved from {res.source_node}: {res.reason})"
        )
    except StoreConflict as exc:
        _rollback(p, res, f"the target was refused ({exc.message}); the job is placed anew")
        _elsewhere(p, res, job, source)
        return
    except TransportError:
        raise  # the target did not answer in time: tried again next step
    except GpuctlError as exc:  # a bad spec, a secret gone: placement decides (holds it)
        _rollback(p, res, f"{exc.message}; the job is placed anew")
        return
    if started:
        _migrated(p, res, job, res.node)


def _elsewhere(p: Pass, res: Reservation, job: Job, source: Incarnation | None) -> None:
    """The job was stopped but its reserved target failed it: start it wherever placement finds
    room now (else it stays queued for the control loop's placement)."""
    if source is None:
        return
    chosen = choose_target(p, job, source)
    if isinstance(chosen, str):
        p.note("migrate", f"{job.id}: queued: {chosen}", job=job.id)
        return
    target, capacity = chosen
    try:
        started = reconcile_launch.launch_on(
            p, job, target, capacity, why=f" (moved from {res.source_node}: {res.reason})"
        )
    except GpuctlError as exc:
        p.note("migrate", f"{job.id}: queued: {exc.message}", job=job.id)
        return
    if started:
        _migrated(p, res, job, target.node)


def _migrated(p: Pass, res: Reservation, job: Job, node: str) -> None:
    new = _incarnation(p, job.id, job.incarnation + 1)
    start = "a fresh start"
    if new is not None and new.resume_step is not None:
        start = f"step {new.resume_step}"
    p.act(
        "migrated",
        f"{job.id} moved from {res.source_node} to {node}: incarnation "
        f"{job.incarnation + 1} from {start} ({res.source}: {res.reason})",
        job=job.id,
        node=node,
        inc=job.incarnation + 1,
        data={
            **_data(res),
            "to_node": node,
            "resume_step": None if new is None else new.resume_step,
        },
    )


def _rollback(p: Pass, res: Reservation, why: str) -> None:
    message = f"{res.job_id} is not moved to {res.node}: {why}; the reserved cards are free"
    event = p.event(
        "migrate_rollback",
        message,
        job=res.job_id,
        node=res.node,
        outcome="failed",
        data=_data(res),
    )
    if p.store.release_reservation(res.job_id, event=event) is not None:
        p.record("migrate_rollback", message, job=res.job_id, node=res.node, outcome="failed")


def _incarnation(p: Pass, job_id: str, n: int) -> Incarnation | None:
    return next((i for i in p.store.incarnations(job_id) if i.n == n), None)


def _alive(p: Pass, inc: Incarnation | None) -> bool | None:
    if inc is None or inc.node not in p.observed:
        return None
    run = p.observed[inc.node].get((inc.job_id, inc.n))
    return run is not None and run.alive


def _newest_step(p: Pass, job: Job, inc: Incarnation, *, sync: bool) -> int | None:
    """The newest committed step of `inc` the store knows of (read from its node first)."""
    if sync:
        p.guard(reconcile_checkpoints.sync_one, p, job, inc)
    steps = [c.step for c in p.store.checkpoints(job.id) if c.incarnation == inc.n]
    return max(steps) if steps else None


# --- driving migrations from a command -----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class MigrationRequest:
    job_id: str
    target: Target | None = None  # None: the best place placement finds
    reason: str = ""
    grace_s: float | None = None  # SIGTERM -> SIGKILL; None: the job's own grace_s
    checkpoint_wait_s: float | None = None  # SIGUSR1 -> SIGTERM at the latest; None: the grace
    source: str = Source.OPERATOR.value


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
    loop: Reconciler,
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
    loop: Reconciler,
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


def _tick(loop: Reconciler, snapshot: FleetSnapshot) -> Pass:
    from gpuctl.ops.reconcile import Pass

    p = Pass(loop, None)
    p.snapshot = snapshot
    return p


def _start(
    p: Pass, req: MigrationRequest, *, actor: str, deadline: float
) -> Reservation | MigrationResult:
    job = p.store.job(req.job_id)
    if job is None:
        return MigrationResult(req.job_id, "not_started", "no such job")
    existing = next((r for r in p.store.reservations() if r.job_id == job.id), None)
    if existing is not None:  # a migration of it is under way already: follow it
        return existing
    inc = _incarnation(p, job.id, job.incarnation)
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
            )
        except StoreConflict as exc:
            why = f"the target was refused ({exc.message})"
    return MigrationResult(job.id, "not_started", f"not moved: {why}", inc.node, None, (), inc.n)


def _resolve(
    p: Pass, job: Job, inc: Incarnation, target: Target | None
) -> tuple[Target, dict[tuple[str, int], int]] | str:
    if target is None:
        return choose_target(p, job, inc)
    try:
        node = reconcile_launch.fleet_state(p)[0].node(target.node)
    except KeyError:
        return f"{target.node} is not in the fleet"
    uuids = {c.index: c.uuid or "" for c in node.cards}
    fixed = dataclasses.replace(
        target,
        mib_per_card=target.mib_per_card or inc.mib_per_card,
        gpu_uuids=target.gpu_uuids or tuple(uuids.get(c, "") for c in target.cards),
    )
    return fixed, {(node.name, c.index): c.capacity_mib for c in node.cards}


def _outcome(p: Pass, res: Reservation, since: float) -> MigrationResult | None:
    """Done (moved or rolled back), or None while the reservation is held."""
    if any(r.job_id == res.job_id for r in p.store.reservations()):
        return None
    job = p.store.job(res.job_id)
    new = _incarnation(p, res.job_id, res.from_incarnation + 1)
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
