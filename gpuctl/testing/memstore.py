"""An in-memory `Store` with the same compare-and-set rules as the SQLite one, for tests.

Thread-safe (one re-entrant lock around every method); `loop_lock` is a real lock shared by
everyone holding this object, so two control loops in two threads exclude each other. The
controller's lease is kept as the SQL stores keep it, on `now_s` (a test can hand it a fake
clock); `shared()` is a second handle on the same data with a fence of its own (a second
controller process's store).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from gpuctl.core.health.autodrain import NodeHealth
from gpuctl.core.history import (
    FleetSample,
    NodeSample,
    Pruned,
    PruneReport,
    Retention,
    average_nodes,
    downsample,
    is_checkpoint_event,
    table_rows,
)
from gpuctl.core.jobs.migration import Phase, Reservation, check_changes
from gpuctl.core.jobs.model import (
    CardClash,
    Checkpoint,
    Cordon,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    NodeLiveness,
    NodeVersion,
    job_changed,
)
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.lease import Fence, Lease, Member, lost_message
from gpuctl.core.shared import KEEP, PublishedFleet
from gpuctl.errors import LeaseLost, StalePlan, StateError, StoreConflict

F = TypeVar("F", bound=Callable[..., Any])

_JOB_FIELDS = frozenset(f.name for f in dataclasses.fields(Job)) - {"id"}
_INC_FIELDS = frozenset(f.name for f in dataclasses.fields(Incarnation)) - {"job_id", "n"}


def _write(method: F) -> F:
    """A write: under the lock, refused (LeaseLost) when the handle's fence is stale."""

    @functools.wraps(method)
    def fenced(self: MemoryStore, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._check_fence()
            return method(self, *args, **kwargs)

    return cast(F, fenced)


@dataclasses.dataclass
class _LeaseRow:
    holder: str
    token: int
    acquired_at: float
    renewed_at: float
    expires_at: float
    last_pass_at: float | None = None


def _live(inc: Incarnation) -> bool:
    """Launching, running or stopping (a lost incarnation holds its cards but is not live)."""
    return inc.state in (
        IncarnationState.LAUNCHING,
        IncarnationState.RUNNING,
        IncarnationState.STOPPING,
    )


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loop = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._incs: dict[tuple[str, int], Incarnation] = {}
        self._checkpoints: dict[tuple[str, int, int, str], Checkpoint] = {}
        self._events: list[Event] = []
        self._cordons: dict[str, Cordon] = {}
        self._node_versions: dict[str, NodeVersion] = {}
        self._snapshots: list[PublishedFleet] = []
        self._liveness: dict[str, NodeLiveness] = {}
        self._reservations: dict[str, Reservation] = {}
        self._health: dict[str, NodeHealth] = {}
        self._fleet_samples: dict[int, FleetSample] = {}
        self._node_samples: dict[tuple[int, str], NodeSample] = {}
        self._ids = itertools.count(1)
        self._lease: list[_LeaseRow] = []  # at most one; a list so `shared()` handles share it
        self._members: dict[str, Member] = {}
        self._fence: Fence | None = None
        self.now_s: Callable[[], float] = time.time
        self.closed = False

    def shared(self) -> MemoryStore:
        """Another handle on the same data (locks included), with no fence of its own yet."""
        other = object.__new__(MemoryStore)
        other.__dict__.update(self.__dict__)
        other._fence = None
        return other

    def close(self) -> None:
        self.closed = True

    # --- jobs --------------------------------------------------------------------------------

    @_write
    def add_job(self, job: Job, event: Event) -> None:
        # kept as the SQLite store keeps it: through its plain data, read back strictly
        job = dataclasses.replace(job, spec=JobSpec.from_dict(job.spec.to_dict()))
        with self._lock:
            if job.id in self._jobs:
                raise StoreConflict(f"job {job.id} exists already")
            self._jobs[job.id] = job
            self._append(event)

    def job(self, ref: str) -> Job | None:
        with self._lock:
            if ref in self._jobs:
                return self._jobs[ref]
            named = [j for j in self._jobs.values() if j.name == ref]
            return max(named, key=lambda j: (j.submitted_at, j.id)) if named else None

    def jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        with self._lock:
            wanted = None if states is None else set(states)
            found = [j for j in self._jobs.values() if wanted is None or j.state in wanted]
            return sorted(found, key=lambda j: (j.submitted_at, j.id))

    @_write
    def update_job(
        self,
        job_id: str,
        *,
        expect: JobState | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Job:
        unknown = set(changes) - _JOB_FIELDS
        if unknown:
            raise TypeError(f"unknown job fields: {', '.join(sorted(unknown))}")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise StoreConflict(f"job {job_id} does not exist")
            if expect is not None and job.state is not expect:
                raise StoreConflict(f"job {job_id} is {job.state.value}, not {expect.value}")
            if changes:
                job = dataclasses.replace(job, **changes, version=job.version + 1)
            self._jobs[job_id] = job
            if event is not None:
                self._append(event)
            return job

    # --- incarnations ------------------------------------------------------------------------

    @_write
    def begin_launch(
        self, inc: Incarnation, *, capacity_mib: Mapping[tuple[str, int], int], event: Event
    ) -> Job:
        with self._lock:
            job = self._jobs.get(inc.job_id)
            if job is None:
                raise StoreConflict(f"job {inc.job_id} does not exist")
            if job.state is not JobState.QUEUED:
                raise StoreConflict(f"job {job.id} is {job.state.value}, not queued")
            if inc.n != job.incarnation + 1 or (inc.job_id, inc.n) in self._incs:
                have = job.incarnation
                raise StoreConflict(f"job {job.id} is at incarnation {have}, not {inc.n - 1}")
            if any(i.job_id == job.id and _live(i) for i in self._incs.values()):
                raise StoreConflict(f"job {job.id} has a live incarnation already")
            self._not_cordoned(inc.node)
            own = self._reservations.get(job.id)
            if own is not None:
                if (own.node, sorted(own.cards), own.mib_per_card, own.whole) != (
                    inc.node,
                    sorted(inc.cards),
                    inc.mib_per_card,
                    inc.whole,
                ):
                    raise StoreConflict(f"job {job.id} holds a reservation on {own.node}")
                capacity_mib = {**own.capacity(), **capacity_mib}
            for card in inc.cards:
                self._check_card(inc.node, card, inc.mib_per_card, inc.whole, capacity_mib, job.id)
            self._reservations.pop(job.id, None)
            job = self._running_at(job, inc, inc.started_at, event)
            return job

    def _running_at(self, job: Job, inc: Incarnation, updated_at: float, event: Event) -> Job:
        """Under the lock: `inc` written, its job running at it, `event` appended."""
        self._incs[(inc.job_id, inc.n)] = inc
        job = dataclasses.replace(
            job,
            state=JobState.RUNNING,
            incarnation=inc.n,
            reason=None,
            version=job.version + 1,
            first_started_at=(
                job.first_started_at if job.first_started_at is not None else inc.started_at
            ),
            updated_at=updated_at,
        )
        self._jobs[job.id] = job
        self._append(event)
        return job

    @_write
    def record_run(
        self, inc: Incarnation, *, capacity_mib: Mapping[tuple[str, int], int], event: Event
    ) -> tuple[Job, tuple[CardClash, ...]]:
        """A run another scheduler started, written running: no cordon nor room checked."""
        with self._lock:
            if inc.state is not IncarnationState.RUNNING:
                raise ValueError(f"record_run writes a running incarnation, not {inc.state}")
            job = self._jobs.get(inc.job_id)
            if job is None:
                raise StoreConflict(f"job {inc.job_id} does not exist")
            if job.state.terminal:
                raise StoreConflict(f"job {job.id} is {job.state.value}")
            if inc.n != job.incarnation + 1 or (inc.job_id, inc.n) in self._incs:
                have = job.incarnation
                raise StoreConflict(f"job {job.id} is at incarnation {have}, not {inc.n - 1}")
            # as the SQL stores say it: each card's incarnations, then its reservations
            held: list[tuple[str, tuple[int, ...], str, int | None]] = [
                (i.node, i.cards, i.job_id, i.n)
                for _, i in sorted(self._incs.items())
                if i.state.holds_cards
            ]
            held += [
                (r.node, r.cards, r.job_id, None) for _, r in sorted(self._reservations.items())
            ]
            clashes = tuple(
                CardClash(inc.node, card, other, n)
                for card in inc.cards
                for node, cards, other, n in held
                if other != job.id and node == inc.node and card in cards
            )
            job = self._running_at(job, inc, event.at, event)
            return job, clashes

    @_write
    def update_incarnation(
        self,
        job_id: str,
        n: int,
        *,
        expect: IncarnationState | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Incarnation:
        unknown = set(changes) - _INC_FIELDS
        if unknown:
            raise TypeError(f"unknown incarnation fields: {', '.join(sorted(unknown))}")
        with self._lock:
            inc = self._incs.get((job_id, n))
            if inc is None:
                raise StoreConflict(f"incarnation {n} of job {job_id} does not exist")
            if expect is not None and inc.state is not expect:
                raise StoreConflict(
                    f"incarnation {n} of job {job_id} is {inc.state.value}, not {expect.value}"
                )
            inc = dataclasses.replace(inc, **changes)
            self._incs[(job_id, n)] = inc
            if event is not None:
                self._append(event)
            return inc

    def incarnations(
        self, job_id: str | None = None, *, node: str | None = None, holding: bool | None = None
    ) -> list[Incarnation]:
        with self._lock:
            out = [
                i
                for i in self._incs.values()
                if (job_id is None or i.job_id == job_id)
                and (node is None or i.node == node)
                and (holding is None or i.state.holds_cards == holding)
            ]
            return sorted(out, key=lambda i: (i.job_id, i.n))

    def incarnations_for(
        self, states: Iterable[JobState], *, holding: bool | None = None
    ) -> dict[str, list[Incarnation]]:
        with self._lock:
            wanted = {j.id for j in self.jobs(states)}
            found: dict[str, list[Incarnation]] = {}
            for key in sorted(self._incs):
                inc = self._incs[key]
                if key[0] in wanted and (holding is None or inc.state.holds_cards == holding):
                    found.setdefault(key[0], []).append(inc)
            return found

    # --- checkpoints -------------------------------------------------------------------------

    @_write
    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        with self._lock:
            c = checkpoint
            self._checkpoints[(c.job_id, c.incarnation, c.step, c.location)] = c

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        with self._lock:
            mine = [c for c in self._checkpoints.values() if c.job_id == job_id]
            return sorted(mine, key=lambda c: (c.step, c.incarnation, c.location), reverse=True)

    def checkpoints_for(self, states: Iterable[JobState]) -> dict[str, list[Checkpoint]]:
        with self._lock:
            wanted = {j.id for j in self.jobs(states)}
            found: dict[str, list[Checkpoint]] = {}
            for c in self._checkpoints.values():
                if c.job_id in wanted:
                    found.setdefault(c.job_id, []).append(c)
            order = lambda c: (c.step, c.incarnation, c.location)  # noqa: E731  # as checkpoints()
            return {j: sorted(cs, key=order, reverse=True) for j, cs in found.items()}

    # --- events ------------------------------------------------------------------------------

    def _append(self, event: Event) -> int:
        n = next(self._ids)
        self._events.append(dataclasses.replace(event, id=n))
        return n

    @_write
    def append_event(self, event: Event) -> int:
        with self._lock:
            return self._append(event)

    def events(
        self,
        *,
        since: float | None = None,
        job_id: str | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        with self._lock:
            wanted = None if kinds is None else set(kinds)
            out = [
                e
                for e in self._events
                if (since is None or e.at >= since)
                and (job_id is None or e.job_id == job_id)
                and (wanted is None or e.kind in wanted)
            ]
            return out[-limit:] if limit else out

    def _not_cordoned(self, node: str) -> None:
        if node in self._cordons:
            raise StoreConflict(f"{node} is cordoned ({self._cordons[node].reason})")

    def _check_card(
        self,
        node: str,
        card: int,
        mib: int,
        whole: bool,
        capacity_mib: Mapping[tuple[str, int], int],
        job_id: str,
    ) -> None:
        key = (node, card)
        if key not in capacity_mib:
            raise StoreConflict(f"{node} card {card}: capacity unknown")
        held = [
            (i.mib_per_card, i.whole)
            for i in self._incs.values()
            if i.state.holds_cards and i.node == node and card in i.cards
        ]
        held += [
            (r.mib_per_card, r.whole)
            for r in self._reservations.values()
            if r.job_id != job_id and r.node == node and card in r.cards
        ]
        if whole and held:
            raise StoreConflict(f"{node} card {card} is not free for a whole card")
        if any(w for _, w in held):
            raise StoreConflict(f"{node} card {card} is held whole by another job")
        if sum(m for m, _ in held) + mib > capacity_mib[key]:
            raise StoreConflict(f"{node} card {card} would be double-booked")

    # --- reservations ------------------------------------------------------------------------

    @_write
    def reserve(
        self, reservation: Reservation, *, event: Event, expect_job_version: int | None = None
    ) -> None:
        res = reservation
        with self._lock:
            job = self._jobs.get(res.job_id)
            if expect_job_version is not None and (
                job is None or job.version != expect_job_version
            ):
                last = next((e for e in reversed(self._events) if e.job_id == res.job_id), None)
                raise StalePlan(job_changed(res.job_id, last))
            if job is None or job.cancel_requested:
                raise StoreConflict(f"job {res.job_id} does not exist or is being cancelled")
            if job.state is not JobState.RUNNING or job.incarnation != res.from_incarnation:
                raise StoreConflict(
                    f"job {job.id} is {job.state.value} at incarnation {job.incarnation}, "
                    f"not running incarnation {res.from_incarnation}"
                )
            inc = self._incs.get((job.id, res.from_incarnation))
            if inc is None or inc.state is not IncarnationState.RUNNING:
                raise StoreConflict(f"job {job.id} incarnation {res.from_incarnation} not running")
            if inc.node != res.source_node:
                raise StoreConflict(f"job {job.id} runs on {inc.node}")
            if job.id in self._reservations:
                raise StoreConflict(f"job {job.id} is being moved already")
            self._not_cordoned(res.node)
            for card in res.cards:
                self._check_card(
                    res.node, card, res.mib_per_card, res.whole, res.capacity(), job.id
                )
            self._reservations[job.id] = res
            self._append(event)

    def reservations(self, node: str | None = None) -> list[Reservation]:
        with self._lock:
            found = [r for r in self._reservations.values() if node is None or r.node == node]
            return sorted(found, key=lambda r: r.job_id)

    @_write
    def update_reservation(
        self,
        job_id: str,
        *,
        expect: Phase | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Reservation:
        values = check_changes(changes)
        with self._lock:
            res = self._reservations.get(job_id)
            if res is None:
                raise StoreConflict(f"job {job_id} holds no reservation")
            if expect is not None and res.phase is not expect:
                raise StoreConflict(f"the reservation of {job_id} is {res.phase}, not {expect}")
            res = dataclasses.replace(res, **values)
            self._reservations[job_id] = res
            if event is not None:
                self._append(event)
            return res

    @_write
    def release_reservation(self, job_id: str, *, event: Event) -> Reservation | None:
        with self._lock:
            gone = self._reservations.pop(job_id, None)
            if gone is not None:
                self._append(event)
            return gone

    # --- cordons and liveness ----------------------------------------------------------------

    @_write
    def cordon(
        self,
        cordon: Cordon,
        event: Event,
        *,
        keep_existing: bool = False,
        expect_version: int | None = None,
    ) -> bool:
        with self._lock:
            before = self._check_version(cordon.node, expect_version)
            if keep_existing and cordon.node in self._cordons:
                return False
            self._cordons[cordon.node] = cordon
            self._bump(before, event, "cordon", cordon.reason)
            self._append(event)
            return True

    def _check_version(self, node: str, expect: int | None) -> NodeVersion:
        now = self._node_versions.get(node) or NodeVersion(node)
        if expect is not None and now.version != expect:
            raise StalePlan(now.changed())
        return now

    def _bump(self, before: NodeVersion, event: Event, kind: str, reason: str) -> None:
        self._node_versions[before.node] = NodeVersion(
            before.node, before.version + 1, event.at, event.actor, kind, reason
        )

    def node_versions(self) -> dict[str, NodeVersion]:
        with self._lock:
            return dict(sorted(self._node_versions.items()))

    @_write
    def publish_snapshot(self, published: PublishedFleet, *, keep: int = KEEP) -> int:
        with self._lock:
            new_id = (self._snapshots[-1].id or 0) + 1 if self._snapshots else 1
            self._snapshots.append(dataclasses.replace(published, id=new_id))
            del self._snapshots[: -max(1, keep)]
            return new_id

    def latest_snapshot(self) -> PublishedFleet | None:
        with self._lock:
            return self._snapshots[-1] if self._snapshots else None

    @_write
    def uncordon(
        self,
        node: str,
        event: Event,
        *,
        expect_source: str | None = None,
        expect_version: int | None = None,
    ) -> Cordon | None:
        with self._lock:
            before = self._check_version(node, expect_version)
            there = self._cordons.get(node)
            if expect_source is not None and (there is None or there.source != expect_source):
                raise StoreConflict(f"{node}'s cordon is not one of {expect_source}")
            gone = self._cordons.pop(node, None)
            if gone is not None:
                self._bump(before, event, "uncordon", gone.reason)
            self._append(event)
            return gone

    def node_health(self) -> dict[str, NodeHealth]:
        with self._lock:
            return dict(sorted(self._health.items()))

    @_write
    def set_node_health(self, health: NodeHealth) -> None:
        with self._lock:
            self._health[health.node] = health

    def cordons(self) -> list[Cordon]:
        with self._lock:
            return sorted(self._cordons.values(), key=lambda c: c.node)

    def liveness(self) -> dict[str, NodeLiveness]:
        with self._lock:
            return dict(self._liveness)

    @_write
    def set_liveness(self, *liveness: NodeLiveness) -> None:
        with self._lock:
            for lv in liveness:
                self._liveness[lv.node] = lv

    # --- the fleet's history -------------------------------------------------------------------

    @_write
    def record_samples(self, fleet: FleetSample | None, nodes: Sequence[NodeSample]) -> None:
        with self._lock:
            if fleet is not None:
                self._fleet_samples[fleet.at] = fleet
            for at in {n.at for n in nodes}:
                for key in [k for k in self._node_samples if k[0] == at]:
                    del self._node_samples[key]
            for n in nodes:
                self._node_samples[(n.at, n.node)] = n

    def fleet_samples(self, since: float, until: float | None = None) -> list[FleetSample]:
        with self._lock:
            return [
                s
                for at, s in sorted(self._fleet_samples.items())
                if at >= int(since) and (until is None or at <= int(until))
            ]

    def node_samples(
        self, since: float, until: float | None = None, node: str | None = None
    ) -> list[NodeSample]:
        with self._lock:
            return [
                s
                for (at, name), s in sorted(self._node_samples.items())
                if at >= int(since)
                and (until is None or at <= int(until))
                and (node is None or name == node)
            ]

    def last_sample_at(self) -> float | None:
        with self._lock:
            return max(self._fleet_samples) if self._fleet_samples else None

    @_write
    def prune_history(self, now: float, retention: Retention) -> Pruned:
        with self._lock:
            fleet, nodes, averaged, dropped = downsample(
                list(self._fleet_samples.values()),
                list(self._node_samples.values()),
                now,
                retention,
            )
            self._fleet_samples = {s.at: s for s in fleet}
            self._node_samples = {(s.at, s.node): s for s in nodes}
            before = len(self._events)
            self._events = [
                e
                for e in self._events
                if e.at
                >= now
                - (
                    retention.checkpoint_events_s
                    if is_checkpoint_event(e.kind)
                    else retention.events_s
                )
            ]
            return Pruned(averaged, dropped, before - len(self._events))

    def node_sample_buckets(
        self, since: float, step_s: int, until: float | None = None, node: str | None = None
    ) -> list[NodeSample]:
        return average_nodes(self.node_samples(since, until, node), step_s)

    def prune_history_report(
        self, now: float, retention: Retention, *, dry_run: bool = False
    ) -> PruneReport:
        with self._lock:
            kept = (self._fleet_samples, self._node_samples, self._events)
            before = self._history_counts()
            pruned = self.prune_history(now, retention)
            report = PruneReport(pruned, table_rows(before, self._history_counts()), dry_run)
            if dry_run:
                self._fleet_samples, self._node_samples, self._events = kept
            return report

    def _history_counts(self) -> dict[tuple[str, int | str], int]:
        out: dict[tuple[str, int | str], int] = {}
        for key in [("fleet_samples", s.step_s) for s in self._fleet_samples.values()] + [
            ("node_samples", n.step_s) for n in self._node_samples.values()
        ]:
            out[key] = out.get(key, 0) + 1
        for e in self._events:
            k: tuple[str, int | str] = (
                "events",
                "checkpoint" if is_checkpoint_event(e.kind) else "other",
            )
            out[k] = out.get(k, 0) + 1
        return out

    def check(self) -> list[str]:
        """The cheap invariants: at most one live incarnation per job, no double-booked card."""
        with self._lock:
            problems = []
            live: dict[str, int] = {}
            for i in self._incs.values():
                if _live(i):
                    live[i.job_id] = live.get(i.job_id, 0) + 1
            problems += [f"job {j} has {n} live incarnations" for j, n in live.items() if n > 1]
            whole: dict[tuple[str, int], int] = {}
            for i in self._incs.values():
                if i.state.holds_cards and i.whole:
                    for c in i.cards:
                        whole[(i.node, c)] = whole.get((i.node, c), 0) + 1
            problems += [
                f"{n} card {c} is held whole twice" for (n, c), k in whole.items() if k > 1
            ]
            return sorted(problems)

    # --- the controller's lease ---------------------------------------------------------------

    def _check_fence(self) -> None:
        if self._fence is None:
            return
        current = self.lease()
        if current is None or current.token != self._fence.token or not current.live:
            raise LeaseLost(
                lost_message(self._fence, current),
                holder=None if current is None else current.holder,
                token=None if current is None else current.token,
            )

    def set_fence(self, fence: Fence | None) -> None:
        self._fence = fence

    def lease(self) -> Lease | None:
        with self._lock:
            if not self._lease:
                return None
            r = self._lease[0]
            return Lease(
                r.holder,
                r.token,
                r.acquired_at,
                r.renewed_at,
                r.expires_at,
                r.last_pass_at,
                self.now_s(),
            )

    def acquire_lease(self, holder: str, lease_s: float) -> Lease:
        with self._lock:
            now = self.now_s()
            current = self.lease()
            if current is None:
                self._lease.append(_LeaseRow(holder, 1, now, now, now + lease_s))
            elif current.held_by(holder):
                self._lease[0].renewed_at, self._lease[0].expires_at = now, now + lease_s
            elif not current.live:
                row = _LeaseRow(holder, current.token + 1, now, now, now + lease_s)
                self._lease[0] = row
            found = self.lease()
            assert found is not None
            return found

    def renew_lease(self, lease_s: float) -> Lease:
        with self._lock:
            if self._fence is None:
                raise StateError("no lease to renew: this store carries no fence")
            self._check_fence()
            now = self.now_s()
            self._lease[0].renewed_at, self._lease[0].expires_at = now, now + lease_s
            found = self.lease()
            assert found is not None
            return found

    def release_lease(self) -> None:
        with self._lock:
            if self._fence is None:
                return
            self._check_fence()
            self._lease[0].expires_at = self.now_s()

    @_write
    def mark_pass(self) -> None:
        if self._lease:
            self._lease[0].last_pass_at = self.now_s()

    def heartbeat(self, holder: str, role: str, ttl_s: float) -> None:
        with self._lock:
            now = self.now_s()
            old = self._members.get(holder)
            started = now if old is None else old.started_at
            self._members[holder] = Member(holder, role, started, now, now + ttl_s)

    def leave(self, holder: str) -> None:
        with self._lock:
            self._members.pop(holder, None)

    def members(self) -> list[Member]:
        with self._lock:
            now = self.now_s()
            live = [m for m in self._members.values() if m.expires_at > now]
            return sorted(live, key=lambda m: (m.role, m.started_at, m.holder))

    @contextmanager
    def loop_lock(self, wait_s: float = 0.0) -> Iterator[None]:
        got = self._loop.acquire(timeout=wait_s) if wait_s > 0 else self._loop.acquire(False)
        if not got:
            raise StoreConflict("another control loop holds the lock")
        try:
            yield
        finally:
            self._loop.release()
