"""Moving a running job to other cards: the reservation that holds its target, and the next step
of a migration as a function of what the store and the node say. Pure: no I/O, no clock.

A migration is checkpoint -> stop -> start elsewhere from that checkpoint, with its target
*reserved first*: the cards are held in the store (a `Reservation`) before the source is asked
for anything, so nothing else can take them while the job moves. In order:

1. `reserved`: the target cards are held; the source runs as before.
2. `checkpointing`: SIGUSR1 asked the source for a checkpoint; gpuctl waits (at most
   `checkpoint_wait_s`) for one newer than the newest it knew (`baseline_step`).
3. the source is stopped: SIGTERM (its incarnation `stopping`, end reason `drained`), SIGKILL once
   `grace_s` has passed; its end is recorded and the job is queued again;
4. the next incarnation is launched on the reserved cards (the reservation is consumed in the
   same transaction that grants them) from the newest committed checkpoint.

Every step is decided from stored facts only (`next_step`), so whoever runs it next — the same
command, another operator's, or the control loop after a crash — finishes or rolls back the same
way, and never launches twice. Until the source is asked to stop, a migration can be rolled back
(the reservation released, the job untouched); once it was asked to stop, it is finished.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from gpuctl.core.jobs.model import Incarnation, IncarnationState, Job, JobState
from gpuctl.core.timefmt import duration

DEFAULT_TIMEOUT_S = 600.0  # reserve -> the source asked to stop; past it, a migration rolls back


class Phase(enum.StrEnum):
    RESERVED = "reserved"  # target cards held; nothing asked of the source yet
    CHECKPOINTING = "checkpointing"  # SIGUSR1 sent; waiting for a newer committed checkpoint
    STOPPING = "stopping"  # SIGTERM sent; SIGKILL after the grace


class Source(enum.StrEnum):
    """Who asked for the move (the same words as a cordon's source)."""

    OPERATOR = "operator"  # gpuctl drain / gpuctl migrate by a person
    HEALTH = "health"  # the control loop draining an unhealthy node
    CONSOLIDATE = "consolidate"  # gpuctl consolidate --apply


@dataclasses.dataclass(frozen=True, slots=True)
class Reservation:
    """Cards held for a job's next incarnation while its current one (`from_incarnation`, on
    `source_node`) is moved off. At most one per job."""

    job_id: str
    from_incarnation: int
    source_node: str
    node: str
    cards: tuple[int, ...]
    mib_per_card: int
    whole: bool
    capacity_mib: tuple[int, ...]  # each card's capacity as given when reserved (same order)
    created_at: float
    deadline_at: float  # past it, a migration whose source was not asked to stop rolls back
    grace_s: float  # SIGTERM -> SIGKILL
    checkpoint_wait_s: float  # SIGUSR1 -> SIGTERM at the latest
    reason: str
    actor: str
    source: str = Source.OPERATOR.value
    gpu_uuids: tuple[str, ...] = ()
    cpu_milli: int = 0
    host_mem_mib: int = 0
    phase: Phase = Phase.RESERVED
    checkpoint_requested_at: float | None = None
    baseline_step: int | None = None  # the newest committed step known when SIGUSR1 was sent
    stop_requested_at: float | None = None

    def __post_init__(self) -> None:
        where = f"reservation of job {self.job_id}"
        if not self.cards or len(set(self.cards)) != len(self.cards):
            raise ValueError(f"{where}: cards must be distinct and at least one, got {self.cards}")
        if len(self.capacity_mib) != len(self.cards):
            raise ValueError(f"{where}: one capacity per card")
        if self.mib_per_card <= 0 or self.grace_s < 0 or self.checkpoint_wait_s < 0:
            raise ValueError(f"{where}: sizes are positive and waits never negative")

    def capacity(self) -> dict[tuple[str, int], int]:
        return {(self.node, c): cap for c, cap in zip(self.cards, self.capacity_mib, strict=True)}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cards"], d["capacity_mib"] = list(self.cards), list(self.capacity_mib)
        d["gpu_uuids"], d["phase"] = list(self.gpu_uuids), self.phase.value
        return d


RESERVATION_FIELDS = frozenset(
    {"phase", "checkpoint_requested_at", "baseline_step", "stop_requested_at"}
)  # what a compare-and-set may change once a reservation is written


def check_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a reservation update; ValueError for any other field."""
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name not in RESERVATION_FIELDS:
            known = ", ".join(sorted(RESERVATION_FIELDS))
            raise ValueError(f"reservation field {name!r} cannot be changed (known: {known})")
        out[name] = Phase(value) if name == "phase" else value
    return out


# --- the next step -------------------------------------------------------------------------


class StepKind(enum.StrEnum):
    REQUEST_CHECKPOINT = "request_checkpoint"  # SIGUSR1, phase -> checkpointing
    WAIT_CHECKPOINT = "wait_checkpoint"
    STOP = "stop"  # SIGTERM, the source -> stopping (end reason drained)
    WAIT_STOP = "wait_stop"
    KILL = "kill"  # the grace passed: SIGKILL, the source -> killed, the job requeued
    RECORD_END = "record_end"  # the source's process ended: record it, settle the job
    LAUNCH = "launch"  # the job is queued: launch it on the reserved cards
    ROLLBACK = "rollback"  # release the reservation; the job is left as it is
    WAIT = "wait"  # something else must happen first (a node answers, the loop settles a job)

    @property
    def waits(self) -> bool:
        return self in (StepKind.WAIT_CHECKPOINT, StepKind.WAIT_STOP, StepKind.WAIT)


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    why: str


def next_step(
    res: Reservation,
    *,
    job: Job | None,
    source: Incarnation | None,
    alive: bool | None,
    newest_step: int | None,
    now: float,
    target_cordoned: bool = False,
) -> Step:
    """What to do next for `res`.

    `source`: the job's incarnation `res.from_incarnation`; `alive`: whether its process runs on
    its node (None: the node did not say); `newest_step`: the newest committed checkpoint step of
    that incarnation gpuctl knows of; `target_cordoned`: the target node was cordoned since.
    """
    if job is None:
        return Step(StepKind.ROLLBACK, "the job no longer exists")
    if job.state.terminal or job.state is JobState.HELD:
        return Step(StepKind.ROLLBACK, f"the job is {job.state.value}")
    if job.cancel_requested:
        return Step(StepKind.ROLLBACK, "the job is being cancelled")
    if job.incarnation != res.from_incarnation:
        return Step(
            StepKind.ROLLBACK,
            f"the job is at incarnation {job.incarnation}, not {res.from_incarnation}",
        )
    live = source is not None and source.state in _LIVE
    if job.state is JobState.QUEUED:
        if live:
            return Step(StepKind.WAIT, "the job is queued but its old copy is still live")
        return Step(StepKind.LAUNCH, "the source has stopped")
    if source is None:
        return Step(StepKind.ROLLBACK, f"incarnation {res.from_incarnation} is missing")
    if source.state is IncarnationState.RUNNING:
        if target_cordoned:
            return Step(StepKind.ROLLBACK, f"{res.node} was cordoned; the job stays where it runs")
        return _while_running(res, alive, newest_step, now)
    if source.state is IncarnationState.STOPPING:
        if alive is None:
            return Step(StepKind.WAIT, f"{source.node} did not answer")
        if not alive:
            return Step(StepKind.RECORD_END, "the source exited")
        since = stop_requested_at(res)
        if now - since >= res.grace_s:
            return Step(StepKind.KILL, f"it did not stop within {duration(res.grace_s)} of SIGTERM")
        return Step(
            StepKind.WAIT_STOP,
            f"waiting for it to stop ({duration(now - since)} of {duration(res.grace_s)})",
        )
    if source.state is IncarnationState.LAUNCHING:
        return Step(StepKind.WAIT, "the source is still launching")
    return Step(StepKind.WAIT, f"the source is {source.state.value}; the job is being requeued")


_LIVE = (IncarnationState.LAUNCHING, IncarnationState.RUNNING, IncarnationState.STOPPING)


def _while_running(res: Reservation, alive: bool | None, newest: int | None, now: float) -> Step:
    if now >= res.deadline_at:
        return Step(
            StepKind.ROLLBACK,
            f"timed out ({duration(now - res.created_at)}) before the job was asked to stop; "
            f"it keeps running on {res.source_node}",
        )
    if alive is None:
        return Step(StepKind.WAIT, f"{res.source_node} did not answer")
    if not alive:
        return Step(StepKind.RECORD_END, "the source exited on its own")
    if res.phase is Phase.RESERVED:
        return Step(StepKind.REQUEST_CHECKPOINT, "target reserved")
    if res.phase is Phase.STOPPING:  # a stop was written but the source is still running
        return Step(StepKind.STOP, "the stop request was not recorded on the incarnation")
    if newest is not None and (res.baseline_step is None or newest > res.baseline_step):
        return Step(StepKind.STOP, f"checkpoint step {newest} committed")
    asked = res.checkpoint_requested_at if res.checkpoint_requested_at is not None else now
    if now - asked >= res.checkpoint_wait_s:
        return Step(
            StepKind.STOP,
            f"no newer checkpoint within {duration(res.checkpoint_wait_s)} of SIGUSR1; it resumes "
            "from its newest committed one",
        )
    return Step(
        StepKind.WAIT_CHECKPOINT,
        f"waiting for a checkpoint ({duration(now - asked)} of {duration(res.checkpoint_wait_s)})",
    )


def stop_requested_at(res: Reservation) -> float:
    """When SIGTERM was (or is taken to have been) sent."""
    for t in (res.stop_requested_at, res.checkpoint_requested_at):
        if t is not None:
            return t
    return res.created_at
