"""The PostgreSQL implementation of `gpuctl.adapters.protocols.Store` (psycopg 3).

The SQL is `SqliteStore`'s, written once for both backends (`?` placeholders, which `PgConn` hands
to psycopg as `%s`; the schema's DDL in both dialects by `schema.Dialect`); this class replaces the
plumbing: connecting, transactions, locks and what a failure is called.

Isolation, operation by operation (docs/state.md says the same):

- reads: READ COMMITTED, one statement each (autocommit), like SQLite's reads in WAL mode;
- compare-and-set of one row (`update_job`, `update_incarnation`, `add_checkpoint`, `add_job`):
  READ COMMITTED, the row read `FOR UPDATE`, so two writers of one job queue on its row and the
  second sees the first's change (its `expect` then fails: StoreConflict, never a lost update);
- what checks many rows before granting (`begin_launch`, `reserve`, `update_reservation`,
  `release_reservation`, `cordon`, `uncordon`): READ COMMITTED behind a transaction-scoped
  advisory lock (the grants lock) plus the job's row lock: a cordon and a grant, or two grants of
  one card, are serialized as SQLite's write lock serializes them, without write skew;
- upserts of one row (`set_liveness`, `set_node_health`, `append_event`): READ COMMITTED;
- migrations: one transaction behind their own advisory lock (PostgreSQL's DDL is transactional:
  a failed migration leaves the database as it was).

A store that takes part in the controller's election (`acquire_lease`) keeps its transactions
shorter than the lease: the server ends its session when it sits idle inside a transaction for
half the lease (`idle_in_transaction_session_timeout`: a controller stopped mid-transaction,
SIGSTOP or a frozen VM, would otherwise keep the lease's row locked, and every standby out, until
its connection died), and it waits for a lock no longer than that either (`lock_timeout`).

A serialization failure, a deadlock or a lock wait past `LOCK_TIMEOUT_MS` is `StoreConflict`
(retry); a server that cannot be reached is `StateError` (exit 6) naming the host, never the
password; a full disk `StoreFull`; damaged data `StoreCorrupt`.
"""
# ruff: noqa: S608  (SQL built from constants only; values are bound)

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pgerrors

from gpuctl.adapters.store import codec, schema
from gpuctl.adapters.store.opening import Opened
from gpuctl.adapters.store.postgres import url as urls
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.core.jobs.migration import Reservation
from gpuctl.core.jobs.model import CardClash, Event, Incarnation, Job, JobState
from gpuctl.core.lease import Lease
from gpuctl.errors import (
    ReadOnlyRole,
    StateError,
    StoreConflict,
    StoreCorrupt,
    StoreFull,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from gpuctl.adapters.protocols import Store

CONNECT_TIMEOUT_S = 10
LOCK_TIMEOUT_MS = 10_000  # as SQLite's busy timeout
MIN_SESSION_LIMIT_MS = 100  # a controller's idle-transaction and lock limits, at the least
# advisory lock keys (per database): "gpuctl" and a number
LOOP_KEY = 0x6770756374_6C01
GRANTS_KEY = 0x6770756374_6C02
MIGRATE_KEY = 0x6770756374_6C03
_POLL_S = 0.05
_CONFLICTS = (
    pgerrors.SerializationFailure,
    pgerrors.DeadlockDetected,
    pgerrors.LockNotAvailable,
    pgerrors.UniqueViolation,  # two writers adding the same row: the second one lost
)
_CORRUPT = (pgerrors.DataCorrupted, pgerrors.IndexCorrupted)


class PgConn:
    """A psycopg connection that takes the store's `?` placeholders (`dbapi.Conn`)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn

    def execute(self, sql: str, parameters: Sequence[Any] | None = None, /) -> psycopg.Cursor[Any]:
        if parameters is None:
            return self.raw.execute(sql)
        return self.raw.execute(sql.replace("?", "%s"), tuple(parameters))

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> None:
        with self.raw.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), [tuple(p) for p in parameters])

    def close(self) -> None:
        self.raw.close()


def connect(url: str) -> PgConn:
    """A connection in autocommit (each read its own READ COMMITTED statement; writes open
    transactions themselves). StateError naming the server when it cannot be reached."""
    where = urls.describe(url)
    try:
        conn = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT_S,
            application_name=f"gpuctl pid {os.getpid()} on {socket.gethostname()}"[:63],
        )
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(
            f"{where}: cannot connect to the state store: {_first_line(exc)}",
            hint="is the server running and reachable, the database created, and the password "
            "in ~/.pgpass (or PGPASSFILE)?",
        ) from None
    except psycopg.Error as exc:
        raise StateError(f"{where}: cannot open the state store: {_first_line(exc)}") from None
    return PgConn(conn)


def translate(exc: psycopg.Error, where: str) -> StateError:
    """What to raise for `exc` on the store at `where`."""
    detail = _first_line(exc)
    if isinstance(exc, _CONFLICTS):
        return StoreConflict(
            f"{where}: another gpuctl changed the same rows at the same time ({detail}); "
            "nothing was written",
            hint="try again",
        )
    if isinstance(exc, pgerrors.InsufficientPrivilege):
        return ReadOnlyRole(
            "read-only: this role cannot change the state",
            hint=f"{where}: ask for a role with write grants (docs/team.md)",
        )
    if isinstance(exc, pgerrors.DiskFull):
        return StoreFull(
            f"{where}: the server's disk is full ({detail}); nothing was written",
            hint="free space on the database server, then run the command again",
        )
    if isinstance(exc, _CORRUPT):
        return StoreCorrupt(f"{where}: the database is corrupt: {detail}", hint=urls_hint())
    if isinstance(exc, psycopg.OperationalError):
        return StoreUnavailable(
            f"{where}: lost the connection to the state store: {detail}",
            hint="is the server running and reachable? then run the command again",
        )
    return StateError(f"{where}: {detail}", hint=urls_hint())


def urls_hint() -> str:
    return "run `gpuctl db check`"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return re.sub(r"\s+", " ", text[0]) if text else type(exc).__name__


class PostgresStore(SqliteStore):
    """The store on a PostgreSQL database (`open_url`). See the module docstring."""

    dialect = schema.POSTGRES

    def __init__(self, conn: PgConn, url: str, *, write: bool, version: int, db_id: str | None):
        self.url = urls.redact(url)
        self._connect_url = url  # carries no password (`url.check` refuses one)
        self.where = urls.describe(url)
        latest = schema.latest_version()
        super().__init__(
            Opened(
                conn,  # type: ignore[arg-type]  # PgConn gives the dbapi.Conn the SQL uses
                Path(),
                Path(),
                db_id,
                version,
                latest,
                writable=write,
                ephemeral=version == 0,
            )
        )
        self._file = None  # no file to watch: the server guards its own
        self._pg = conn
        self._closed = False
        self._scope = threading.local()
        self._session_ms: int | None = None  # the lease's limits, once this store takes part

    # --- plumbing ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _tx(self, *, fenced: bool = True) -> Iterator[PgConn]:  # type: ignore[override]
        # the same SQL, on psycopg
        if not self.writable:
            raise StateError(f"{self.where}: the state store was opened read-only")
        with self._lock, self._errors(), self._pg.raw.transaction():
            if getattr(self._scope, "grants", False):
                self._pg.execute("SELECT pg_advisory_xact_lock(?)", (GRANTS_KEY,))
            job_id = getattr(self._scope, "job", None)
            if job_id is not None:  # its state is checked, then changed: nobody else meanwhile
                self._pg.execute("SELECT 1 FROM jobs WHERE id = ? FOR UPDATE", (job_id,))
            self._check_fence(self._pg, fenced)
            self._scope.tx = True
            try:
                yield self._pg
            finally:
                self._scope.tx = False

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        if self.ephemeral:  # no schema yet: an empty store, and reading creates none
            return []
        with self._lock, self._errors():
            return list(self._pg.execute(sql, tuple(params)).fetchall())

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            self._reconnect_if_lost()
            yield
        except psycopg.Error as exc:
            raise translate(exc, self.where) from None

    def _reconnect_if_lost(self) -> None:
        """A connection the server dropped (restarted, a failover) is opened again at the next
        use: the call that lost it failed (its transaction rolled back, nothing half-written),
        the next one goes on. StateError naming the server while it cannot be reached."""
        raw = self._pg.raw
        if self._closed or not (raw.closed or raw.broken):
            return
        with contextlib.suppress(psycopg.Error):
            raw.close()
        self._pg = connect(self._connect_url)
        self._conn = self._pg  # type: ignore[assignment]  # the SQL SqliteStore runs
        if self._session_ms is not None:
            self._set_session_limits(self._session_ms)

    def _set_session_limits(self, ms: int) -> None:
        self._pg.execute(f"SET idle_in_transaction_session_timeout = {ms}")
        self._pg.execute(f"SET lock_timeout = {min(ms, LOCK_TIMEOUT_MS)}")

    def acquire_lease(self, holder: str, lease_s: float) -> Lease:
        """As SQLite's, and from now on this session's transactions are ended by the server when
        idle for half the lease, its lock waits too (the module's docstring says why)."""
        ms = max(MIN_SESSION_LIMIT_MS, int(lease_s * 1000 / 2))
        if ms != self._session_ms:
            with self._lock, self._errors():
                self._set_session_limits(ms)
            self._session_ms = ms
        return super().acquire_lease(holder, lease_s)

    def _append(self, conn: Any, event: Event) -> int:  # type: ignore[override]
        row = conn.execute(
            "INSERT INTO events (at, actor, kind, message, job_id, node, outcome, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            codec.event_values(event),
        ).fetchone()
        return int(row[0])

    def _job_row(self, conn: Any, job_id: str) -> Any:
        if getattr(self._scope, "tx", False):  # a compare-and-set: hold the row until commit
            conn.execute("SELECT 1 FROM jobs WHERE id = ? FOR UPDATE", (job_id,))
        return super()._job_row(conn, job_id)

    def _inc_row(self, conn: Any, job_id: str, n: int) -> Any:
        if getattr(self._scope, "tx", False):
            conn.execute(
                "SELECT 1 FROM incarnations WHERE job_id = ? AND n = ? FOR UPDATE", (job_id, n)
            )
        return super()._inc_row(conn, job_id, n)

    @contextlib.contextmanager
    def _granting(self, job_id: str | None = None) -> Iterator[None]:
        self._scope.grants, self._scope.job = True, job_id
        try:
            yield
        finally:
            self._scope.grants, self._scope.job = False, None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pg.close()

    def __enter__(self) -> PostgresStore:
        return self

    # --- reads: an empty filter matches nothing (PostgreSQL refuses SQLite's `IN ()`) ----------

    def jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        wanted = None if states is None else list(states)
        return [] if wanted == [] else super().jobs(wanted)

    def events(
        self,
        *,
        since: float | None = None,
        job_id: str | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        wanted = None if kinds is None else list(kinds)
        if wanted == []:
            return []
        return super().events(since=since, job_id=job_id, kinds=wanted, limit=limit)

    # --- what checks many rows: behind the grants lock -----------------------------------------

    def begin_launch(
        self, inc: Incarnation, *, capacity_mib: Mapping[tuple[str, int], int], event: Event
    ) -> Job:
        with self._granting(inc.job_id):
            return super().begin_launch(inc, capacity_mib=capacity_mib, event=event)

    def record_run(
        self, inc: Incarnation, *, capacity_mib: Mapping[tuple[str, int], int], event: Event
    ) -> tuple[Job, tuple[CardClash, ...]]:
        with self._granting(inc.job_id):  # who holds its cards, read with no grant under way
            return super().record_run(inc, capacity_mib=capacity_mib, event=event)

    def reserve(
        self, reservation: Reservation, *, event: Event, expect_job_version: int | None = None
    ) -> None:
        with self._granting(reservation.job_id):
            super().reserve(reservation, event=event, expect_job_version=expect_job_version)

    def update_reservation(self, *args: Any, **kwargs: Any) -> Any:
        with self._granting():
            return super().update_reservation(*args, **kwargs)

    def release_reservation(self, *args: Any, **kwargs: Any) -> Any:
        with self._granting():
            return super().release_reservation(*args, **kwargs)

    def cordon(self, *args: Any, **kwargs: Any) -> Any:
        with self._granting():
            return super().cordon(*args, **kwargs)

    def uncordon(self, *args: Any, **kwargs: Any) -> Any:
        with self._granting():
            return super().uncordon(*args, **kwargs)

    # --- integrity and the loop lock ---------------------------------------------------------

    def check(self) -> list[str]:
        """The schema version, every table of the schema there and readable. Never raises."""
        problems: list[str] = []
        try:
            with self._lock:
                meta = dict(self._pg.execute("SELECT key, value FROM meta").fetchall())
                version = int(meta.get("schema_version", "0"))
                if version > self.known_version:
                    problems.append(
                        f"schema version {version} is newer than this gpuctl knows "
                        f"({self.known_version})"
                    )
                present = {
                    r[0]
                    for r in self._pg.execute(
                        "SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema = current_schema()"
                    ).fetchall()
                }
                for table in sorted(tables(min(version, self.known_version)) - present):
                    problems.append(f"table {table} is missing")
                for table in sorted(tables(min(version, self.known_version)) & present):
                    self._pg.execute(f"SELECT count(*) FROM {table}").fetchone()
        except psycopg.Error as exc:
            problems.append(f"{self.where}: {_first_line(exc)}")
        except ValueError as exc:
            problems.append(f"{self.where}: meta: {exc}")
        return problems

    def loop_lock(self, wait_s: float = 0.0) -> AbstractContextManager[None]:
        """One control loop at a time: a session advisory lock on this store's connection; the
        server releases it when the holder's connection ends (a killed loop leaves none)."""
        if not self.writable:
            raise StateError(f"{self.where}: the state store was opened read-only")
        return self._loop_lock(wait_s)

    @contextlib.contextmanager
    def _loop_lock(self, wait_s: float) -> Iterator[None]:
        # a connection of its own: a session's advisory locks are re-entrant, and a second loop
        # in this process must be refused as one in another process is
        conn = connect(self._connect_url)
        try:
            deadline = time.monotonic() + max(0.0, wait_s)
            while True:
                with self._errors():
                    row = conn.execute("SELECT pg_try_advisory_lock(?)", (LOOP_KEY,)).fetchone()
                if row is not None and row[0]:
                    break
                if time.monotonic() >= deadline:
                    raise StoreConflict(
                        f"{self.where}: another control loop holds the lock{self._holder()}",
                        hint="one `gpuctl reconcile` at a time: wait for it, or stop it",
                    )
                time.sleep(_POLL_S)
            yield
        finally:
            # unlocked at once (a closed session's locks go only when its backend has exited,
            # which the next pass may beat); a dead connection's lock goes with it
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(?)", (LOOP_KEY,))
            conn.close()

    def _holder(self) -> str:
        try:
            with self._lock:
                row = self._pg.execute(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                    "AND l.objid = ? AND l.database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database()) LIMIT 1",
                    (LOOP_KEY & 0xFFFFFFFF,),
                ).fetchone()
        except psycopg.Error:
            return ""
        return f" ({row[0]})" if row and row[0] else ""


def tables(version: int) -> set[str]:
    """The tables the schema has at `version` (from the migrations' DDL)."""
    found: set[str] = set()
    for step in schema.MIGRATIONS[:version]:
        recorder = _Recorder()
        with contextlib.suppress(Exception):  # data steps need rows; only the DDL matters
            step.apply(recorder, schema.POSTGRES)
        for statement in recorder.statements:
            found |= set(re.findall(r"CREATE TABLE (\w+)", statement))
    return found


class _Recorder:
    def __init__(self) -> None:
        self.statements: list[str] = []

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        self.statements.append(sql)
        return _Empty()

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> None:
        self.statements.append(sql)


class _Empty:
    def fetchone(self) -> None:
        return None

    def fetchall(self) -> list[Any]:
        return []

    def __iter__(self) -> Iterator[Any]:
        return iter(())


if TYPE_CHECKING:  # mypy proves PostgresStore implements the Store protocol

    def _is_a_store(store: PostgresStore) -> Store:
        return store
