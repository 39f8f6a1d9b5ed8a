"""The SQLite implementation of `gpuctl.adapters.protocols.Store`.

Every mutating method is one `BEGIN IMMEDIATE` transaction (the write lock is taken before anything
is read, so two control loops in two processes serialize instead of both acting on what they read).
The connection is shared by threads behind one lock. Opening (fail-closed checks, modes, WAL,
migrations) is in `opening.py`.

SQL text is built only from constants (column lists, `?` placeholders) and from field names
checked against a fixed set (`codec.job_changes`, `codec.inc_changes`); values are always bound.
"""
# ruff: noqa: S608  (see the paragraph above: no value is ever formatted into SQL)

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from gpuctl.adapters.store import (
    codec,
    failures,
    integrity,
    launch,
    leases,
    lock,
    schema,
    series,
    versions,
)
from gpuctl.adapters.store.opening import LOCK_NAME, MARKER_NAME, Opened
from gpuctl.core.health.autodrain import NodeHealth
from gpuctl.core.history import FleetSample, NodeSample, Pruned, PruneReport, Retention
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
)
from gpuctl.core.lease import Fence, Lease, Member
from gpuctl.core.shared import KEEP, PublishedFleet
from gpuctl.errors import StateError, StoreConflict

if TYPE_CHECKING:
    from gpuctl.adapters.protocols import Store

RESERVATIONS_SINCE = 2  # the schema version that added reservations and node health
CLOCK_OFFSET_SINCE = 3  # ... and incarnations.clock_offset_s
BY_ID = 500  # rows asked by id in one statement, at most


class SqliteStore:
    dialect = schema.SQLITE

    def __init__(self, opened: Opened) -> None:
        self._conn = opened.conn
        self.state_dir = opened.state_dir
        self.path = opened.db_path
        self.database_id = opened.database_id
        self.schema_version = opened.schema_version
        self.known_version = opened.known_version
        self.writable = opened.writable
        self.ephemeral = opened.ephemeral  # nothing stored yet; an empty, read-only view
        # an older database opened for reading (never migrated) lacks the newer columns
        self._inc_cols = (
            codec.INC_COLS
            if self.schema_version >= CLOCK_OFFSET_SINCE
            else codec.INC_COLS.replace("clock_offset_s", "NULL")
        )
        self._versioned = self.schema_version >= versions.SINCE
        self._job_cols = codec.JOB_COLS if self._versioned else codec.JOB_COLS_V6
        self._bump = ", version = version + 1" if self._versioned else ""
        self._lock = threading.RLock()
        self._fence: Fence | None = None  # a controller's: every write checks it (`set_fence`)
        self._specs = codec.SpecMemo()  # a job's spec, decoded once: the loop reads jobs often
        # and each job and incarnation as decoded, while its row reads the same: a pass reads
        # them all, and few changed since the last
        self._jobs_read = codec.RowMemo(lambda r: codec.job_from(r, self._specs))
        self._job_versions: dict[str, Job] = {}  # each job as read last (`jobs`)
        self._select_jobs = f"SELECT {self._job_cols} FROM jobs"
        self._incs_read = codec.RowMemo(codec.inc_from, key=lambda r: (r[0], r[1]))
        # the loop's long-lived connection would go on past a truncated or replaced file
        self._file = (
            failures.DatabaseFile(self.path) if self.writable and not self.ephemeral else None
        )

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self, *, fenced: bool = True) -> Iterator[sqlite3.Connection]:
        if not self.writable:
            raise StateError(f"{self.path}: the state store was opened read-only")
        with self._lock, self._errors():
            self._check_file()
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._check_fence(self._conn, fenced)
                yield self._conn
                self._check_file()  # never commit into a file that changed under the transaction
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:  # a failed COMMIT (disk full) leaves it open
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                raise

    def _check_fence(self, conn: Any, fenced: bool) -> None:
        """In a write transaction, first: LeaseLost when this store carries a controller's fence
        that is no longer the live lease's (the lease row stays locked until the commit)."""
        if fenced and self._fence is not None:
            leases.check(conn, self.dialect, self._fence)

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._errors():
            if self._file is not None:
                self._file.raise_refused()  # reads look at the file only at each pass's start
            return list(self._conn.execute(sql, tuple(params)).fetchall())

    def _check_file(self) -> None:
        if self._file is not None:
            self._file.check()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            if failures.primary_code(exc) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise StoreConflict(  # another writer, not a broken store: the loop retries
                    f"{self.path}: the state store stayed busy (another gpuctl is writing): {exc}",
                    hint="try again",
                ) from exc
            if failures.is_corrupt(exc) and self._file is not None:
                self._file.check()  # a truncated or replaced file says so first
                self._file.refuse(f"the database is corrupt: {exc}")  # and stays refused
            what = "the database is corrupt: " if failures.is_corrupt(exc) else ""
            raise failures.state_error(exc, self.path, f"{self.path}: {what}{exc}") from exc

    @staticmethod
    def _append(conn: sqlite3.Connection, event: Event) -> int:
        cur = conn.execute(
            "INSERT INTO events (at, actor, kind, message, job_id, node, outcome, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            codec.event_values(event),
        )
        return int(cur.lastrowid or 0)

    def _job_row(self, conn: sqlite3.Connection, job_id: str) -> Job | None:
        row = conn.execute(f"SELECT {self._job_cols} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else self._jobs_read(row)

    def _inc_row(self, conn: sqlite3.Connection, job_id: str, n: int) -> Incarnation | None:
        row = conn.execute(
            f"SELECT {self._inc_cols} FROM incarnations WHERE job_id = ? AND n = ?", (job_id, n)
        ).fetchone()
        return None if row is None else self._incs_read(row)

    # --- jobs --------------------------------------------------------------------------------

    def add_job(self, job: Job, event: Event) -> None:
        values = codec.job_values(job)
        with self._tx() as c:
            if self._job_row(c, job.id) is not None:
                raise StoreConflict(f"job {job.id} already exists")
            n = codec.JOB_N if self._versioned else codec.JOB_N - 2
            cols = (
                codec.JOB_COLS
                if self._versioned
                else codec.JOB_COLS.replace(", owner, version", "")
            )
            c.execute(f"INSERT INTO jobs ({cols}) VALUES ({_marks(n)})", values[:n])
            self._append(c, event)

    def job(self, ref: str) -> Job | None:
        """By id; else the newest job of that name."""
        found = self._read(f"SELECT {self._job_cols} FROM jobs WHERE id = ?", (ref,))
        if not found:
            found = self._read(
                f"SELECT {self._job_cols} FROM jobs WHERE name = ? "
                "ORDER BY submitted_at DESC, rowid DESC LIMIT 1",
                (ref,),
            )
        return self._jobs_read(found[0]) if found else None

    def jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        """Oldest submission first. Each job's version is read, and its whole row only when
        that version is not the one this store read last (each change of a job's row adds one
        to its version): the control loop reads every job at every pass, and few changed."""
        where = ""
        params: list[str] = []
        wanted = None if states is None else {JobState(s) for s in states}
        if wanted is not None:
            params = [s.value for s in wanted]
            where = f" WHERE state IN ({_marks(len(params))})"
        if not self._versioned:
            found = [self._jobs_read(r) for r in self._read(self._select_jobs + where, params)]
        else:
            versions = self._read(f"SELECT id, version FROM jobs{where}", params)
            known = self._job_versions
            stale = [i for i, v in versions if i not in known or known[i].version != v]
            if len(known) + len(stale) > codec.RowMemo.LIMIT:
                known.clear()
                stale = [i for i, _ in versions]
            if len(stale) > len(versions) // 2:  # all at once
                rows = self._read(self._select_jobs + where, params)
            else:
                rows = [
                    r
                    for k in range(0, len(stale), BY_ID)
                    for r in self._read(
                        f"{self._select_jobs} WHERE id IN ({_marks(len(stale[k : k + BY_ID]))})",
                        stale[k : k + BY_ID],
                    )
                ]
            for r in rows:
                job = self._jobs_read(r)
                known[job.id] = job
            # a job that changed state after its version was read is left out, as it would be
            found = [
                kept
                for i, _ in versions
                if (kept := known.get(i)) is not None and (wanted is None or kept.state in wanted)
            ]
        found.sort(key=_submitted)  # here, not by the database: sorting the rows cost it more
        return found

    def update_job(
        self,
        job_id: str,
        *,
        expect: JobState | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Job:
        """Compare-and-set. `updated_at` defaults to the event's time when an event is given."""
        values = codec.job_changes(changes)
        if event is not None:
            values.setdefault("updated_at", event.at)
        with self._tx() as c:
            job = self._job_row(c, job_id)
            if job is None:
                raise StoreConflict(f"job {job_id} does not exist")
            if expect is not None and job.state is not JobState(expect):
                raise StoreConflict(f"job {job_id} is {job.state}, not {JobState(expect)}")
            if values:
                sets = ", ".join(f"{k} = ?" for k in values) + self._bump
                c.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*values.values(), job_id))
            if event is not None:
                self._append(c, event)
            updated = self._job_row(c, job_id)
        assert updated is not None
        return updated

    # --- incarnations ------------------------------------------------------------------------

    def begin_launch(
        self, inc: Incarnation, *, capacity_mib: Mapping[tuple[str, int], int], event: Event
    ) -> Job:
        """Write the intent to launch `inc` and grant its cards, or raise StoreConflict (also
        for a cordoned node). A reservation the job holds is consumed: `inc` must take its
        cards."""
        codec.check_launch(inc)
        values = codec.inc_values(inc)
        with self._tx() as c:
            own = launch.check_allowed(c, inc, capacity_mib)
            if own is not None:
                capacity_mib = {**own.capacity(), **capacity_mib}
                c.execute("DELETE FROM reservations WHERE job_id = ?", (inc.job_id,))
            return self._grant(c, inc, values, capacity_mib, event)

    def _grant(
        self,
        c: sqlite3.Connection,
        inc: Incarnation,
        values: Sequence[Any],
        capacity_mib: Mapping[tuple[str, int], int],
        event: Event,
    ) -> Job:
        """Inside the caller's transaction: write `inc`, the rows of its cards, its job running
        at it, and `event`; the job as it is then."""
        c.execute(
            f"INSERT INTO incarnations ({codec.INC_COLS}) VALUES ({_marks(codec.INC_N)})",
            values,
        )
        c.executemany(
            "INSERT INTO allocations (job_id, n, node, card, mib, whole, capacity_mib) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (inc.job_id, inc.n, inc.node, card, inc.mib_per_card, int(inc.whole), cap)
                for card in inc.cards
                for cap in [capacity_mib.get((inc.node, card))]
            ],
        )
        c.execute(
            "UPDATE jobs SET state = ?, incarnation = ?, reason = NULL, updated_at = ?, "
            f"first_started_at = COALESCE(first_started_at, ?){self._bump} WHERE id = ?",
            (JobState.RUNNING.value, inc.n, event.at, inc.started_at, inc.job_id),
        )
        self._append(c, event)
        updated = self._job_row(c, inc.job_id)
        assert updated is not None
        return updated

    def record_run(
        self, inc: Incarnation, *, capacity_mib: Mapping[tuple[str, int], int], event: Event
    ) -> tuple[Job, tuple[CardClash, ...]]:
        """Write `inc`, a run another scheduler started (Slurm's), running, and its job running
        at it, in one transaction: only `launch.check_record` holds it back (a cordon or a full
        card does not: it runs already). Returns the job and who else holds its cards."""
        launch.check_run(inc)
        with self._tx() as c:
            clashes = launch.check_record(c, inc)
            return self._grant(c, inc, codec.inc_values(inc), capacity_mib, event), clashes

    def update_incarnation(
        self,
        job_id: str,
        n: int,
        *,
        expect: IncarnationState | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Incarnation:
        """Compare-and-set. An incarnation that released its cards cannot take them back."""
        values = codec.inc_changes(changes)
        with self._tx() as c:
            inc = self._inc_row(c, job_id, n)
            if inc is None:
                raise StoreConflict(f"job {job_id} has no incarnation {n}")
            if expect is not None and inc.state is not IncarnationState(expect):
                raise StoreConflict(
                    f"job {job_id} incarnation {n} is {inc.state}, not {IncarnationState(expect)}"
                )
            new_state = IncarnationState(values.get("state", inc.state))
            if new_state.holds_cards and not inc.state.holds_cards:
                raise StoreConflict(
                    f"job {job_id} incarnation {n} is {inc.state} and released its cards; "
                    f"it cannot become {new_state} (start a new incarnation)"
                )
            if values:
                sets = ", ".join(f"{k} = ?" for k in values)
                c.execute(
                    f"UPDATE incarnations SET {sets} WHERE job_id = ? AND n = ?",
                    (*values.values(), job_id, n),
                )
            if event is not None:
                self._append(c, event)
            updated = self._inc_row(c, job_id, n)
        assert updated is not None
        return updated

    def incarnations(
        self, job_id: str | None = None, *, node: str | None = None, holding: bool | None = None
    ) -> list[Incarnation]:
        """By job id, then incarnation number."""
        where: list[str] = []
        params: list[Any] = []
        if job_id is not None:
            where.append("job_id = ?")
            params.append(job_id)
        if node is not None:
            where.append("node = ?")
            params.append(node)
        if holding is not None:
            where.append(f"state {'' if holding else 'NOT '}IN ({_marks(len(codec.HOLDING))})")
            params.extend(codec.HOLDING)
        sql = f"SELECT {self._inc_cols} FROM incarnations"
        if where:
            sql += " WHERE " + " AND ".join(where)
        found = [self._incs_read(r) for r in self._read(sql, params)]
        found.sort(key=_numbered)
        return found

    def incarnations_for(
        self, states: Iterable[JobState], *, holding: bool | None = None
    ) -> dict[str, list[Incarnation]]:
        """The incarnations (by number; `holding` as `incarnations`) of the jobs in `states`, by
        job, in one query: what the control loop asks per job, for all its jobs at once. A job
        without any is not a key."""
        wanted = [JobState(s).value for s in states]
        found: dict[str, list[Incarnation]] = {}
        if not wanted:
            return found
        where = f"j.state IN ({_marks(len(wanted))})"
        if holding is not None:
            where += f" AND i.state {'' if holding else 'NOT '}IN ({_marks(len(codec.HOLDING))})"
            wanted.extend(codec.HOLDING)
        cols = ", ".join(c if c == "NULL" else f"i.{c}" for c in self._inc_cols.split(", "))
        sql = f"SELECT {cols} FROM incarnations i JOIN jobs j ON j.id = i.job_id WHERE {where}"
        for r in self._read(sql, wanted):
            inc = self._incs_read(r)
            found.setdefault(inc.job_id, []).append(inc)
        for incs in found.values():
            incs.sort(key=_numbered)
        return found

    # --- checkpoints -------------------------------------------------------------------------

    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Idempotent: the same (job, incarnation, step, location) again updates path and time."""
        cp = checkpoint
        with self._tx() as c:
            if self._job_row(c, cp.job_id) is None:
                raise StoreConflict(f"checkpoint of job {cp.job_id}: the job does not exist")
            c.execute(
                f"INSERT INTO checkpoints ({codec.CHECKPOINT_COLS}) VALUES ({_marks(6)}) "
                "ON CONFLICT (job_id, incarnation, step, location) "
                "DO UPDATE SET path = excluded.path, committed_at = excluded.committed_at",
                (cp.job_id, cp.incarnation, cp.step, cp.path, cp.committed_at, cp.location),
            )

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        """Newest step first."""
        found = self._read(
            f"SELECT {codec.CHECKPOINT_COLS} FROM checkpoints WHERE job_id = ? "
            "ORDER BY step DESC, incarnation DESC, committed_at DESC, location",
            (job_id,),
        )
        return [codec.checkpoint_from(r) for r in found]

    def checkpoints_for(self, states: Iterable[JobState]) -> dict[str, list[Checkpoint]]:
        """The checkpoints (newest step first) of the jobs in `states`, by job, in one query. A
        job without any is not a key."""
        wanted = [JobState(s).value for s in states]
        found: dict[str, list[Checkpoint]] = {}
        if not wanted:
            return found
        cols = ", ".join(f"c.{c}" for c in codec.CHECKPOINT_COLS.split(", "))
        sql = (
            f"SELECT {cols} FROM checkpoints c JOIN jobs j ON j.id = c.job_id "
            f"WHERE j.state IN ({_marks(len(wanted))}) "
            "ORDER BY c.job_id, c.step DESC, c.incarnation DESC, c.committed_at DESC, c.location"
        )
        for r in self._read(sql, wanted):
            cp = codec.checkpoint_from(r)
            found.setdefault(cp.job_id, []).append(cp)
        return found

    # --- the audit log -----------------------------------------------------------------------

    def append_event(self, event: Event) -> int:
        with self._tx() as c:
            return self._append(c, event)

    def events(
        self,
        *,
        since: float | None = None,
        job_id: str | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Oldest first; with `limit`, the newest `limit` of those that match."""
        where: list[str] = []
        params: list[Any] = []
        if since is not None:
            where.append("at >= ?")
            params.append(since)
        if job_id is not None:
            where.append("job_id = ?")
            params.append(job_id)
        if kinds is not None:
            wanted = list(kinds)
            where.append(f"kind IN ({_marks(len(wanted))})")
            params.extend(wanted)
        sql = f"SELECT {codec.EVENT_COLS} FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(max(0, int(limit)))
        return [codec.event_from(r) for r in reversed(self._read(sql, params))]

    # --- reservations (migration targets) -----------------------------------------------------

    def reserve(
        self, reservation: Reservation, *, event: Event, expect_job_version: int | None = None
    ) -> None:
        """Hold cards for the job's next incarnation, or raise StoreConflict (a card taken, the
        target cordoned, the job not running `from_incarnation`, already being moved, or changed
        since the plan that named `expect_job_version`)."""
        values = codec.res_values(reservation)
        with self._tx() as c:
            versions.check_job(c, reservation.job_id, expect_job_version)
            launch.check_reserve(c, reservation)
            c.execute(
                f"INSERT INTO reservations ({codec.RES_COLS}) VALUES ({_marks(codec.RES_N)})",
                values,
            )
            self._append(c, event)

    def reservations(self, node: str | None = None) -> list[Reservation]:
        """By job id; with `node`, those whose target is that node. (An older store read
        without migrating has none.)"""
        if self.schema_version < RESERVATIONS_SINCE:
            return []
        sql = f"SELECT {codec.RES_COLS} FROM reservations"
        params: tuple[str, ...] = ()
        if node is not None:
            sql, params = sql + " WHERE node = ?", (node,)
        return [codec.res_from(r) for r in self._read(sql + " ORDER BY job_id", params)]

    def update_reservation(
        self,
        job_id: str,
        *,
        expect: Phase | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Reservation:
        """Compare-and-set on the phase; only the phase and its times may change."""
        values = check_changes(changes)
        if "phase" in values:
            values["phase"] = Phase(values["phase"]).value
        with self._tx() as c:
            res = launch.reservation(c, job_id)
            if res is None:
                raise StoreConflict(f"job {job_id} holds no reservation")
            if expect is not None and res.phase is not Phase(expect):
                raise StoreConflict(
                    f"the reservation of job {job_id} is {res.phase}, not {Phase(expect)}"
                )
            if values:
                sets = ", ".join(f"{k} = ?" for k in values)
                c.execute(
                    f"UPDATE reservations SET {sets} WHERE job_id = ?", (*values.values(), job_id)
                )
            if event is not None:
                self._append(c, event)
            updated = launch.reservation(c, job_id)
        assert updated is not None
        return updated

    def release_reservation(self, job_id: str, *, event: Event) -> Reservation | None:
        """Drop the job's reservation (a rolled-back migration); None when it held none (then
        nothing is recorded)."""
        with self._tx() as c:
            res = launch.reservation(c, job_id)
            if res is None:
                return None
            c.execute("DELETE FROM reservations WHERE job_id = ?", (job_id,))
            self._append(c, event)
        return res

    # --- cordons and liveness ----------------------------------------------------------------

    def cordon(
        self,
        cordon: Cordon,
        event: Event,
        *,
        keep_existing: bool = False,
        expect_version: int | None = None,
    ) -> bool:
        """Cordon a node (a cordon already there is replaced: newest reason wins), or with
        `keep_existing` leave one that is there alone. True when this cordon was written. With
        `expect_version`: StoreConflict saying what changed when the node's cordon version
        (`node_versions`) is no longer the one the plan saw."""
        with self._tx() as c:
            before = versions.check_node(c, cordon.node, expect_version)
            if keep_existing:
                there = c.execute("SELECT 1 FROM cordons WHERE node = ?", (cordon.node,))
                if there.fetchone() is not None:
                    return False
            c.execute(
                f"INSERT INTO cordons ({codec.CORDON_COLS}) VALUES ({_marks(5)}) "
                "ON CONFLICT (node) DO UPDATE SET reason = excluded.reason, "
                "operator = excluded.operator, source = excluded.source, at = excluded.at",
                (cordon.node, cordon.reason, cordon.operator, cordon.source, cordon.at),
            )
            versions.bump_node(c, before, event, "cordon", cordon.reason)
            self._append(c, event)
        return True

    def uncordon(
        self,
        node: str,
        event: Event,
        *,
        expect_source: str | None = None,
        expect_version: int | None = None,
    ) -> Cordon | None:
        """Remove a node's cordon; the event is recorded even when there was none. With
        `expect_source`, only a cordon of that source is removed (StoreConflict otherwise):
        gpuctl lifting its own health cordon never lifts one a person put there meanwhile.
        `expect_version`: as `cordon`'s."""
        with self._tx() as c:
            before = versions.check_node(c, node, expect_version)
            row = c.execute(
                f"SELECT {codec.CORDON_COLS} FROM cordons WHERE node = ?", (node,)
            ).fetchone()
            if expect_source is not None and (row is None or row[3] != expect_source):
                now = "not cordoned" if row is None else f"cordoned by {row[2]} ({row[3]})"
                raise StoreConflict(f"{node} is {now}, not by {expect_source}")
            c.execute("DELETE FROM cordons WHERE node = ?", (node,))
            if row is not None:
                versions.bump_node(c, before, event, "uncordon", str(row[1]))
            self._append(c, event)
        return None if row is None else codec.cordon_from(row)

    def node_versions(self) -> dict[str, NodeVersion]:
        """Each node's cordon version (a node never cordoned is absent: version 0)."""
        if self.schema_version < versions.SINCE:
            return {}
        with self._lock, self._errors():
            return versions.all_nodes(self._conn)

    def publish_snapshot(self, published: PublishedFleet, *, keep: int = KEEP) -> int:
        """Keep `published` as the fleet's newest snapshot (the oldest past `keep` dropped)."""
        with self._tx() as c:
            return versions.publish(c, published, keep)

    def latest_snapshot(self) -> PublishedFleet | None:
        """The newest published snapshot (None: none, or a store older than v7)."""
        if self.schema_version < versions.SINCE:
            return None
        with self._lock, self._errors():
            return versions.latest(self._conn)

    def cordons(self) -> list[Cordon]:
        found = self._read(f"SELECT {codec.CORDON_COLS} FROM cordons ORDER BY node")
        return [codec.cordon_from(r) for r in found]

    def liveness(self) -> dict[str, NodeLiveness]:
        found = self._read("SELECT node, last_ok_at, failing_since, down FROM liveness")
        return {r[0]: codec.liveness_from(r) for r in sorted(found)}

    def set_liveness(self, *liveness: NodeLiveness) -> None:
        """Each node's liveness, in one transaction."""
        with self._tx() as c:
            c.executemany(
                "INSERT INTO liveness (node, last_ok_at, failing_since, down) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (node) DO UPDATE SET last_ok_at = excluded.last_ok_at, "
                "failing_since = excluded.failing_since, down = excluded.down",
                [(lv.node, lv.last_ok_at, lv.failing_since, int(lv.down)) for lv in liveness],
            )

    def node_health(self) -> dict[str, NodeHealth]:
        if self.schema_version < RESERVATIONS_SINCE:
            return {}
        found = self._read(f"SELECT {codec.HEALTH_COLS} FROM node_health ORDER BY node")
        return {r[0]: codec.health_from(r) for r in found}

    def set_node_health(self, health: NodeHealth) -> None:
        with self._tx() as c:
            c.execute(
                f"INSERT INTO node_health ({codec.HEALTH_COLS}) VALUES ({_marks(8)}) "
                "ON CONFLICT (node) DO UPDATE SET action = excluded.action, "
                "streak = excluded.streak, since = excluded.since, "
                "healthy_since = excluded.healthy_since, reason = excluded.reason, "
                "drain_started_at = excluded.drain_started_at, updated_at = excluded.updated_at",
                codec.health_values(health),
            )

    # --- the fleet's history (schema v5) ----------------------------------------------------

    def record_samples(self, fleet: FleetSample | None, nodes: Sequence[NodeSample]) -> None:
        """One sample of the five numbers and of each node's use (one transaction)."""
        with self._tx() as c:
            series.record(c, fleet, nodes)

    def fleet_samples(self, since: float, until: float | None = None) -> list[FleetSample]:
        """Oldest first. (An older store read without migrating has none.)"""
        if self.schema_version < series.HISTORY_SINCE:
            return []
        with self._lock, self._errors():
            return series.read_fleet(self._conn, since, until)

    def node_samples(
        self, since: float, until: float | None = None, node: str | None = None
    ) -> list[NodeSample]:
        """Oldest first, then by node."""
        if self.schema_version < series.HISTORY_SINCE:
            return []
        with self._lock, self._errors():
            return series.read_nodes(self._conn, since, until, node)

    def last_sample_at(self) -> float | None:
        if self.schema_version < series.HISTORY_SINCE:
            return None
        with self._lock, self._errors():
            return series.last_at(self._conn)

    def prune_history(self, now: float, retention: Retention) -> Pruned:
        """Downsample aged samples, drop those past the retention, and events past theirs."""
        with self._tx() as c:
            return series.prune(c, now, retention)

    def node_sample_buckets(
        self, since: float, step_s: int, until: float | None = None, node: str | None = None
    ) -> list[NodeSample]:
        """Each node's samples averaged into buckets of `step_s` by the database."""
        if self.schema_version < series.HISTORY_SINCE:
            return []
        with self._lock, self._errors():
            return series.read_node_buckets(self._conn, since, until, node, step_s)

    def prune_history_report(
        self, now: float, retention: Retention, *, dry_run: bool = False
    ) -> PruneReport:
        """`prune_history`, each table's rows by level counted before and after, in one
        transaction; a dry run rolls it back (its counts are the prune's own)."""
        report: PruneReport | None = None
        try:
            with self._tx() as c:
                report = series.prune_report(c, now, retention, dry_run=dry_run)
                if dry_run:
                    raise _RollBack
        except _RollBack:
            pass
        assert report is not None
        return report

    def card_capacities(self) -> dict[tuple[str, int], int]:
        """Each card's capacity as given when its cards were last granted (for `db check`)."""
        found = self._read(
            "SELECT node, card, capacity_mib FROM allocations WHERE capacity_mib IS NOT NULL "
            "ORDER BY rowid"
        )
        out = {(r[0], int(r[1])): int(r[2]) for r in found}
        for res in self.reservations():
            out.update(res.capacity())
        return out

    def counts(self) -> dict[str, int]:
        """Rows per table: jobs, incarnations, checkpoints, events, cordons, reservations, and the
        history's fleet and node samples."""
        tables = ["jobs", "incarnations", "checkpoints", "events", "cordons"]
        if self.schema_version >= RESERVATIONS_SINCE:
            tables.append("reservations")
        if self.schema_version >= series.HISTORY_SINCE:
            tables += ["fleet_samples", "node_samples"]
        return {t: int(self._read(f"SELECT count(*) FROM {t}")[0][0]) for t in tables}

    # --- the controller's lease (schema v6) -------------------------------------------------

    def set_fence(self, fence: Fence | None) -> None:
        """From now on every write of this store object carries `fence` (None: none)."""
        self._fence = fence

    def lease(self) -> Lease | None:
        """The lease as the store holds it now (None: never taken)."""
        if self.schema_version < leases.SINCE or self.ephemeral:
            return None
        with self._lock, self._errors():
            return leases.read(self._conn, self.dialect)

    def acquire_lease(self, holder: str, lease_s: float) -> Lease:
        """Take the lease when none is live (its token grows by one), renew it when `holder`
        holds it; the lease as it is after (another's when it is held)."""
        with self._tx(fenced=False) as c:
            return leases.acquire(c, self.dialect, holder, lease_s)

    def renew_lease(self, lease_s: float) -> Lease:
        """Renew the lease of this store's fence: LeaseLost when it is no longer live."""
        if self._fence is None:
            raise StateError("no lease to renew: this store carries no fence")
        with self._tx() as c:
            return leases.renew(c, self.dialect, lease_s)

    def release_lease(self) -> None:
        """Expire the lease of this store's fence now (a clean stop); LeaseLost if not held."""
        if self._fence is None:
            return
        with self._tx() as c:
            leases.release(c, self.dialect)

    def mark_pass(self) -> None:
        """The leader's pass ended now (`controller status`'s last pass)."""
        with self._tx() as c:
            leases.mark_pass(c, self.dialect)

    def heartbeat(self, holder: str, role: str, ttl_s: float) -> None:
        with self._tx(fenced=False) as c:
            leases.heartbeat(c, self.dialect, holder, role, ttl_s)

    def leave(self, holder: str) -> None:
        with self._tx(fenced=False) as c:
            leases.leave(c, holder)

    def members(self) -> list[Member]:
        """The controllers that sent a heartbeat lately (leader first)."""
        if self.schema_version < leases.SINCE or self.ephemeral:
            return []
        with self._lock, self._errors():
            return leases.members(self._conn, self.dialect)

    # --- integrity and the loop lock ---------------------------------------------------------

    def check(self) -> list[str]:
        """`PRAGMA integrity_check`, foreign keys, schema version, the marker. Never raises."""
        with self._lock:
            return integrity.check(
                self._conn,
                self.path,
                None if self.ephemeral else self.state_dir / MARKER_NAME,
                self.known_version,
            )

    def loop_lock(self, wait_s: float = 0.0) -> AbstractContextManager[None]:
        """One control loop at a time: flock on `state_dir/loop.lock`, released on exit.

        Taken at the start of each pass, it also makes the pass read the database afresh: the
        file is checked and SQLite's page cache dropped, so damage to any page the pass reads is
        seen (a kept connection would serve it from memory)."""
        if not self.writable:
            raise StateError(f"{self.path}: the state store was opened read-only")
        with self._lock, self._errors():
            self._check_file()
            self._conn.execute("PRAGMA shrink_memory")
        return lock.loop_lock(self.state_dir / LOCK_NAME, wait_s)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _submitted(job: Job) -> tuple[float, str]:
    return job.submitted_at, job.id


def _numbered(inc: Incarnation) -> tuple[str, int]:
    return inc.job_id, inc.n


class _RollBack(Exception):
    """Raised inside a transaction to roll it back (`prune_history_report`'s dry run)."""


if TYPE_CHECKING:  # mypy proves SqliteStore implements the Store protocol

    def _is_a_store(store: SqliteStore) -> Store:
        return store
