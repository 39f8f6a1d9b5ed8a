"""The store's codec: rows <-> the frozen job vocabulary, and the checks on what may be written.

A job's spec is the JSON of `JobSpec.to_dict` (schema v4); a row still in the pre-v4 form (the
spec file's keys: a store opened read-only before it is migrated) is read by `legacy_spec`."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

from gpuctl.adapters.store import legacy_spec
from gpuctl.core.health.autodrain import NodeHealth
from gpuctl.core.health.model import Action
from gpuctl.core.jobs.migration import Phase, Reservation
from gpuctl.core.jobs.model import (
    Checkpoint,
    Cordon,
    EndReason,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    NodeLiveness,
    NodeVersion,
)
from gpuctl.core.jobs.spec import JobSpec, SpecDataError
from gpuctl.core.shared import PublishedFleet
from gpuctl.errors import StateError

JOB_COLS = (
    "id, name, spec, state, priority, tier, submitted_at, reason, incarnation, restarts, "
    "first_started_at, cancel_requested, updated_at, owner, version"
)
JOB_N = 15
# a store older than v7 (read without migrating) has no owner or version: read as '' and 0
JOB_COLS_V6 = JOB_COLS.replace("owner, version", "'', 0")
INC_COLS = (
    "job_id, n, node, cards, gpu_uuids, mib_per_card, whole, state, started_at, run_dir, pid, "
    "ended_at, exit_code, end_reason, resume_step, cpu_milli, host_mem_mib, clock_offset_s"
)
INC_N = 18
CHECKPOINT_COLS = "job_id, incarnation, step, path, committed_at, location"
EVENT_COLS = "id, at, actor, kind, message, job_id, node, outcome, data"
CORDON_COLS = "node, reason, operator, source, at"
NODE_VERSION_COLS = "node, version, at, actor, kind, reason"
SNAPSHOT_COLS = "id, taken_at, published_at, publisher, interval_s, nodes, body"
RES_COLS = (
    "job_id, from_incarnation, source_node, node, cards, capacity_mib, gpu_uuids, mib_per_card, "
    "whole, cpu_milli, host_mem_mib, created_at, deadline_at, grace_s, checkpoint_wait_s, reason, "
    "actor, source, phase, checkpoint_requested_at, baseline_step, stop_requested_at"
)
RES_N = 22
HEALTH_COLS = "node, action, streak, since, healthy_since, reason, drain_started_at, updated_at"

HOLDING = tuple(s.value for s in IncarnationState if s.holds_cards)
LIVE = (
    IncarnationState.LAUNCHING.value,
    IncarnationState.RUNNING.value,
    IncarnationState.STOPPING.value,
)

# Fields a compare-and-set may change. The others are fixed when the row is written: a job's
# identity and spec at submit, its incarnation number and an incarnation's cards at begin_launch
# (changing them would bypass the capacity check).
JOB_FIELDS = frozenset(
    {
        "state",
        "priority",
        "tier",
        "reason",
        "restarts",
        "first_started_at",
        "cancel_requested",
        "updated_at",
    }
)
JOB_FIXED = frozenset({"id", "name", "spec", "submitted_at", "incarnation", "owner", "version"})
INC_FIELDS = frozenset(
    {"state", "pid", "ended_at", "exit_code", "end_reason", "resume_step", "run_dir", "started_at"}
)
INC_FIXED = frozenset(
    {"job_id", "n", "node", "cards", "gpu_uuids", "mib_per_card", "whole", "cpu_milli"}
    | {"host_mem_mib", "clock_offset_s"}
)


def dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: not plain JSON data: {exc}") from exc


def spec_text(job: Job) -> str:
    """What the jobs table keeps: the typed spec's plain data (secret names and files, never a
    value: `SecretRef` has no room for one)."""
    return dumps(job.spec.to_dict(), f"job {job.id}: spec")


def spec_from(text: str, job_id: str) -> JobSpec:
    """A stored spec, read strictly: StateError naming the job and the field otherwise."""
    try:
        data = json.loads(text)
        if legacy_spec.is_legacy(data):
            return legacy_spec.spec_from_legacy(data)
        return JobSpec.from_dict(data)
    except SpecDataError as exc:
        where, problem = exc.field, exc.problem
    except ValueError as exc:  # not JSON
        where, problem = "spec", str(exc)
    raise StateError(
        f"job {job_id}: its stored spec is not valid at {where}: {problem}",
        hint="run `gpuctl db check`",
    )


def job_values(job: Job) -> tuple[Any, ...]:
    return (
        job.id,
        job.name,
        spec_text(job),
        JobState(job.state).value,
        job.priority,
        job.tier,
        job.submitted_at,
        job.reason,
        job.incarnation,
        job.restarts,
        job.first_started_at,
        int(job.cancel_requested),
        job.updated_at,
        job.owner,
        job.version,
    )


class SpecMemo:
    """Each job's spec as decoded from its row, known again by the row's text. A spec is written
    once, at submit, and never changed (`JOB_FIXED`), while the control loop reads every job
    several times a pass: decoding it each time cost the pass more than the rest of the read."""

    LIMIT = 16384  # jobs remembered at most (then all are forgotten and decoded again)

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, JobSpec]] = {}

    def __call__(self, text: str, job_id: str) -> JobSpec:
        found = self._seen.get(job_id)
        if found is not None and found[0] == text:
            return found[1]
        spec = spec_from(text, job_id)
        if len(self._seen) >= self.LIMIT:
            self._seen.clear()
        self._seen[job_id] = (text, spec)
        return spec


T = TypeVar("T")


class RowMemo(Generic[T]):
    """Each row's value as decoded, known again while the row reads the same (every column
    equal), by its key (the first column unless said). The control loop reads every job and every
    incarnation holding cards at each pass, and few of them changed since the last: decoding
    them all again cost a pass at 10,000 jobs more than the queries did. The values are frozen,
    so one may be handed out twice."""

    LIMIT = 65536  # rows remembered at most (then all are forgotten and decoded again)

    def __init__(
        self,
        decode: Callable[[tuple[Any, ...]], T],
        key: Callable[[tuple[Any, ...]], Hashable] = lambda row: row[0],
    ) -> None:
        self._decode = decode
        self._key = key
        self._seen: dict[Hashable, tuple[tuple[Any, ...], T]] = {}

    def __call__(self, row: tuple[Any, ...]) -> T:
        key = self._key(row)
        found = self._seen.get(key)
        if found is not None and found[0] == row:
            return found[1]
        value = self._decode(row)
        if len(self._seen) >= self.LIMIT:
            self._seen.clear()
        self._seen[key] = (tuple(row), value)
        return value


def job_from(row: tuple[Any, ...], read_spec: Callable[[str, str], JobSpec] = spec_from) -> Job:
    return Job(
        id=row[0],
        name=row[1],
        spec=read_spec(row[2], row[0]),
        state=JobState(row[3]),
        priority=row[4],
        tier=row[5],
        submitted_at=row[6],
        reason=row[7],
        incarnation=row[8],
        restarts=row[9],
        first_started_at=row[10],
        cancel_requested=bool(row[11]),
        updated_at=row[12],
        owner=row[13],
        version=row[14],
    )


def inc_values(inc: Incarnation) -> tuple[Any, ...]:
    return (
        inc.job_id,
        inc.n,
        inc.node,
        dumps(list(inc.cards), "cards"),
        dumps(list(inc.gpu_uuids), "gpu_uuids"),
        inc.mib_per_card,
        int(inc.whole),
        IncarnationState(inc.state).value,
        inc.started_at,
        inc.run_dir,
        inc.pid,
        inc.ended_at,
        inc.exit_code,
        None if inc.end_reason is None else EndReason(inc.end_reason).value,
        inc.resume_step,
        inc.cpu_milli,
        inc.host_mem_mib,
        inc.clock_offset_s,
    )


def inc_from(row: tuple[Any, ...]) -> Incarnation:
    return Incarnation(
        job_id=row[0],
        n=row[1],
        node=row[2],
        cards=tuple(json.loads(row[3])),
        gpu_uuids=tuple(json.loads(row[4])),
        mib_per_card=row[5],
        whole=bool(row[6]),
        state=IncarnationState(row[7]),
        started_at=row[8],
        run_dir=row[9],
        pid=row[10],
        ended_at=row[11],
        exit_code=row[12],
        end_reason=None if row[13] is None else EndReason(row[13]),
        resume_step=row[14],
        cpu_milli=row[15],
        host_mem_mib=row[16],
        clock_offset_s=row[17],
    )


def checkpoint_from(row: tuple[Any, ...]) -> Checkpoint:
    return Checkpoint(
        job_id=row[0],
        incarnation=row[1],
        step=row[2],
        path=row[3],
        committed_at=row[4],
        location=row[5],
    )


def event_values(event: Event) -> tuple[Any, ...]:
    return (
        event.at,
        event.actor,
        event.kind,
        event.message,
        event.job_id,
        event.node,
        event.outcome,
        dumps(dict(event.data), f"event {event.kind}: data"),
    )


def event_from(row: tuple[Any, ...]) -> Event:
    return Event(
        id=row[0],
        at=row[1],
        actor=row[2],
        kind=row[3],
        message=row[4],
        job_id=row[5],
        node=row[6],
        outcome=row[7],
        data=json.loads(row[8]),
    )


def cordon_from(row: tuple[Any, ...]) -> Cordon:
    return Cordon(node=row[0], reason=row[1], operator=row[2], source=row[3], at=row[4])


def node_version_from(row: tuple[Any, ...]) -> NodeVersion:
    return NodeVersion(
        node=row[0], version=row[1], at=row[2], actor=row[3], kind=row[4], reason=row[5]
    )


def snapshot_from(row: tuple[Any, ...]) -> PublishedFleet:
    return PublishedFleet(
        id=row[0],
        taken_at=row[1],
        published_at=row[2],
        publisher=row[3],
        interval_s=row[4],
        nodes=row[5],
        body=bytes(row[6]),
    )


def liveness_from(row: tuple[Any, ...]) -> NodeLiveness:
    return NodeLiveness(node=row[0], last_ok_at=row[1], failing_since=row[2], down=bool(row[3]))


def job_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Column values for a job update; ValueError for a field that is unknown or fixed."""
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name in JOB_FIXED:
            raise ValueError(f"job field {name!r} cannot be changed once written")
        if name not in JOB_FIELDS:
            raise ValueError(f"unknown job field {name!r} (known: {', '.join(sorted(JOB_FIELDS))})")
        if name == "state":
            value = JobState(value).value
        elif name == "cancel_requested":
            value = int(bool(value))
        out[name] = value
    return out


def inc_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Column values for an incarnation update; ValueError for a field unknown or fixed."""
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name in INC_FIXED:
            raise ValueError(
                f"incarnation field {name!r} cannot be changed (cards are granted by begin_launch)"
            )
        if name not in INC_FIELDS:
            known = ", ".join(sorted(INC_FIELDS))
            raise ValueError(f"unknown incarnation field {name!r} (known: {known})")
        if name == "state":
            value = IncarnationState(value).value
        elif name == "end_reason" and value is not None:
            value = EndReason(value).value
        out[name] = value
    return out


def check_launch(inc: Incarnation) -> None:
    """What begin_launch accepts as an incarnation to start (ValueError otherwise)."""
    where = f"job {inc.job_id} incarnation {inc.n}"
    if inc.state is not IncarnationState.LAUNCHING:
        raise ValueError(f"{where}: begin_launch writes a launching incarnation, not {inc.state}")
    if inc.n < 1:
        raise ValueError(f"{where}: incarnations are numbered from 1")
    if not inc.cards or len(set(inc.cards)) != len(inc.cards):
        raise ValueError(f"{where}: cards must be distinct and at least one, got {inc.cards}")
    if inc.gpu_uuids and len(inc.gpu_uuids) != len(inc.cards):
        raise ValueError(f"{where}: {len(inc.gpu_uuids)} gpu_uuids for {len(inc.cards)} cards")
    if inc.mib_per_card <= 0:
        raise ValueError(f"{where}: mib_per_card must be positive, got {inc.mib_per_card}")


def res_values(r: Reservation) -> tuple[Any, ...]:
    return (
        r.job_id,
        r.from_incarnation,
        r.source_node,
        r.node,
        dumps(list(r.cards), "cards"),
        dumps(list(r.capacity_mib), "capacity_mib"),
        dumps(list(r.gpu_uuids), "gpu_uuids"),
        r.mib_per_card,
        int(r.whole),
        r.cpu_milli,
        r.host_mem_mib,
        r.created_at,
        r.deadline_at,
        r.grace_s,
        r.checkpoint_wait_s,
        r.reason,
        r.actor,
        r.source,
        Phase(r.phase).value,
        r.checkpoint_requested_at,
        r.baseline_step,
        r.stop_requested_at,
    )


def res_from(row: tuple[Any, ...]) -> Reservation:
    return Reservation(
        job_id=row[0],
        from_incarnation=row[1],
        source_node=row[2],
        node=row[3],
        cards=tuple(json.loads(row[4])),
        capacity_mib=tuple(json.loads(row[5])),
        gpu_uuids=tuple(json.loads(row[6])),
        mib_per_card=row[7],
        whole=bool(row[8]),
        cpu_milli=row[9],
        host_mem_mib=row[10],
        created_at=row[11],
        deadline_at=row[12],
        grace_s=row[13],
        checkpoint_wait_s=row[14],
        reason=row[15],
        actor=row[16],
        source=row[17],
        phase=Phase(row[18]),
        checkpoint_requested_at=row[19],
        baseline_step=row[20],
        stop_requested_at=row[21],
    )


def health_values(h: NodeHealth) -> tuple[Any, ...]:
    return (
        h.node,
        Action(h.action).value,
        h.streak,
        h.since,
        h.healthy_since,
        h.reason,
        h.drain_started_at,
        h.updated_at,
    )


def health_from(row: tuple[Any, ...]) -> NodeHealth:
    return NodeHealth(
        node=row[0],
        action=Action(row[1]),
        streak=row[2],
        since=row[3],
        healthy_since=row[4],
        reason=row[5],
        drain_started_at=row[6],
        updated_at=row[7],
    )
