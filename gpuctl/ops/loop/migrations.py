"""The steps of a migration, taken inside a pass (`gpuctl.ops.loop.Pass`): choose a target,
reserve it, then `advance`: the next step `gpuctl.core.jobs.migration.next_step` decides from what
the store and the node say, carried out (SIGUSR1, SIGTERM, SIGKILL, the end recorded, the launch on
the reserved cards, or the rollback), each an event. `advance_all` is the control loop's step.
`gpuctl.ops.moves.migrate` drives these from a command.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpuctl.core.jobs.migration import (
    DEFAULT_TIMEOUT_S,
    Phase,
    Reservation,
    Step,
    StepKind,
    next_step,
)
from gpuctl.core.jobs.model import EndReason, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.model import Allocation, FleetState
from gpuctl.errors import (
    GpuctlError,
    LeaseLost,
    StoreConflict,
    StoreUnavailable,
    TransportError,
)
from gpuctl.ops.loop import _checkpoints, _jobs, launch
from gpuctl.ops.loop.model import Target

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Pass


CHAINED = (StepKind.RECORD_END, StepKind.KILL)  # after these, the job can go on at once


# --- one step at a time (inside a pass) ----------------------------------------------------


def choose_target(
    p: Pass, job: Job, inc: Incarnation, state: FleetState | None = None
) -> tuple[Target, dict[tuple[str, int], int]] | str:
    """Where the job could go (never its own node): (target, card capacities), or why nowhere.
    Drains and consolidations may use the failover headroom, as a failover does."""
    if state is None:
        state, _ = launch.fleet_state(p)
    nodes = tuple(
        dataclasses.replace(n, schedulable=False, reason="the job is moving off it")
        if n.name == inc.node
        else n
        for n in state.nodes
    )
    state = dataclasses.replace(state, nodes=nodes, allocations=moving_off(state, job.id))
    jobs = {j.id: j for j in p.store.jobs()}
    req = launch.placement_request(job, jobs)
    settings = dataclasses.replace(p.settings.placement, band_max=1.0, headroom=0.0)
    result = plan(state, [req], settings)
    if not result.placed:
        return result.unplaced[0].reason
    placed = result.placed[0]
    node = state.node(placed.node)
    target = Target(placed.allocation, tuple(u or "" for u in placed.card_uuids))
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
    expect_version: int | None = None,
) -> Reservation:
    """Hold `target` for the job's next incarnation (StoreConflict when the store refuses, or
    when the job's version is no longer `expect_version`, the one a plan saw)."""
    grace = job.spec.policy.grace_s if grace_s is None else grace_s
    res = Reservation(
        job_id=job.id,
        from_incarnation=inc.n,
        source_node=inc.node,
        node=target.node,
        cards=target.cards,
        mib_per_card=target.allocation.mib_per_card,
        whole=target.allocation.whole,
        capacity_mib=tuple(capacity.get((target.node, c), 0) for c in target.cards),
        created_at=p.now,
        deadline_at=p.now + timeout_s,
        grace_s=grace,
        checkpoint_wait_s=grace if checkpoint_wait_s is None else checkpoint_wait_s,
        reason=reason,
        actor=actor,
        source=source,
        gpu_uuids=target.gpu_uuids,
        cpu_milli=target.allocation.cpu_milli,
        host_mem_mib=target.allocation.host_mem_mib,
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
    p.store.reserve(res, event=event, expect_job_version=expect_version)
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
        source = incarnation_of(p, res.job_id, res.from_incarnation)
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
        if _jobs.confirm_gone(p, source) is None:
            return res  # not known to be gone yet: the target waits, the next pass tries again
        done = p.update_inc(
            source,
            IncarnationState.STOPPING,
            "kill",
            f"incarnation {source.n} of {job.id} on {source.node} did not stop within "
            f"{res.grace_s:g}s of SIGTERM: SIGKILL (it resumes from its newest committed "
            "checkpoint)",
            state=IncarnationState.KILLED,
        )
        _jobs.settle_job(p, done)
        return res
    if kind is StepKind.RECORD_END:
        run = p.observed.get(source.node, {}).get((source.job_id, source.n))
        _jobs.ended(
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
        p.guard(_checkpoints.sync_one, p, job, source)
    held = Allocation(
        res.job_id,
        res.node,
        res.cards,
        res.mib_per_card,
        res.whole,
        res.cpu_milli,
        res.host_mem_mib,
    )
    target = Target(held, res.gpu_uuids)
    try:
        started = launch.launch_on(
            p, job, target, res.capacity(), why=f" (moved from {res.source_node}: {res.reason})"
        )
    except StoreConflict as exc:
        _rollback(p, res, f"the target was refused ({exc.message}); the job is placed anew")
        _elsewhere(p, res, job, source)
        return
    except TransportError:
        raise  # the target did not answer in time: tried again next step
    except (StoreUnavailable, LeaseLost):  # the store, not the move: the pass stops, and the
        raise  # next one (or the next leader) takes the migration on from what the store says
    except GpuctlError as exc:  # a bad spec, a secret gone: placement decides (holds it)
        _rollback(p, res, f"{exc.message}; the job is placed anew")
        return
    if started:
        _migrated(p, res, job, res.node)
    else:
        now = p.store.job(job.id)
        if now is not None and now.state is JobState.HELD:  # e.g. no usable checkpoint
            _rollback(p, res, f"the job is held ({now.reason or 'see its events'})")


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
        started = launch.launch_on(
            p, job, target, capacity, why=f" (moved from {res.source_node}: {res.reason})"
        )
    except (StoreUnavailable, LeaseLost):  # the store, not the job: the pass stops
        raise
    except GpuctlError as exc:
        p.note("migrate", f"{job.id}: queued: {exc.message}", job=job.id)
        return
    if started:
        _migrated(p, res, job, target.node)


def _migrated(p: Pass, res: Reservation, job: Job, node: str) -> None:
    new = incarnation_of(p, job.id, job.incarnation + 1)
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


def incarnation_of(p: Pass, job_id: str, n: int) -> Incarnation | None:
    return next((i for i in p.store.incarnations(job_id) if i.n == n), None)


def _alive(p: Pass, inc: Incarnation | None) -> bool | None:
    if inc is None or inc.node not in p.observed:
        return None
    run = p.observed[inc.node].get((inc.job_id, inc.n))
    return run is not None and run.alive


def _newest_step(p: Pass, job: Job, inc: Incarnation, *, sync: bool) -> int | None:
    """The newest committed step of `inc` the store knows of (read from its node first)."""
    if sync:
        p.guard(_checkpoints.sync_one, p, job, inc)
    steps = [c.step for c in p.store.checkpoints(job.id) if c.incarnation == inc.n]
    return max(steps) if steps else None
