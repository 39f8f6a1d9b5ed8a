"""Opening the SQLite state store, failing closed.

A store that cannot be trusted is refused with `StateError` (hint: `gpuctl db check`), never
replaced by an empty one: a corrupt or unreadable database file, a database missing (or emptied)
where the marker `store.id` says one existed, a marker naming another database, a file that is
not gpuctl's, or a schema newer than this gpuctl knows. Nothing is created or overwritten then.
A full disk is told apart from damage (`failures.state_error`): `StoreFull`, hint: free space.

The state folder is 0700 and owned by the user running gpuctl; the database and the marker are 0600
(SQLite gives the WAL and shared-memory files the database's mode).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
import stat
import time
import uuid
from pathlib import Path
from urllib.parse import quote

from gpuctl.adapters.files import fsync_dir, write_atomic
from gpuctl.adapters.store import failures, schema
from gpuctl.errors import StateError, StoreCorrupt

log = logging.getLogger(__name__)

DB_NAME = "state.db"
MARKER_NAME = "store.id"
LOCK_NAME = "loop.lock"
HINT = failures.CHECK_HINT
BUSY_TIMEOUT_MS = 10_000


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    conn: sqlite3.Connection
    state_dir: Path
    db_path: Path
    database_id: str | None
    schema_version: int
    known_version: int  # the newest schema this gpuctl knows
    writable: bool
    ephemeral: bool  # read-only view of a store that does not exist yet (nothing submitted)


def db_path(state_dir: Path) -> Path:
    return state_dir / DB_NAME


def open_connection(
    state_dir: Path, *, write: bool, migrations: tuple[schema.Migration, ...] | None = None
) -> Opened:
    chain = schema.MIGRATIONS if migrations is None else migrations
    path = db_path(state_dir)
    marker = state_dir / MARKER_NAME
    if not _prepare_dir(state_dir, write=write):
        return _ephemeral(state_dir, chain)
    marker_id = read_marker(marker)
    if not os.path.lexists(path):
        if marker_id is not None:
            raise StateError(
                f"{path}: the database is missing, but {marker} says this folder held one "
                f"(database {marker_id}); refusing to start an empty store",
                hint=f"{HINT}; restore the database from a backup, or move {marker} aside to "
                "start a new, empty store",
            )
        if not write:
            return _ephemeral(state_dir, chain)
        _create_file(path)
    _check_file(path, write=write)
    conn = _connect(path, write=write)
    try:
        return _open_checked(conn, state_dir, path, marker, marker_id, write, chain)
    except BaseException:
        conn.close()
        raise


def _open_checked(
    conn: sqlite3.Connection,
    state_dir: Path,
    path: Path,
    marker: Path,
    marker_id: str | None,
    write: bool,
    chain: tuple[schema.Migration, ...],
) -> Opened:
    _quick_check(conn, path)
    version, db_id = _version(conn, path, marker, marker_id)
    latest = schema.latest_version(chain)
    if version > latest:
        raise StateError(
            f"{path}: schema version {version} is newer than this gpuctl knows ({latest}); "
            "refusing to use it",
            hint=f"{HINT}; use the gpuctl that wrote it (upgrade this one)",
        )
    if not write:
        if version == 0:  # an empty file, no marker: a creation that never finished
            conn.close()
            return _ephemeral(state_dir, chain)
        _pragma(conn, path, "PRAGMA foreign_keys = ON")
        return Opened(
            conn, state_dir, path, db_id, version, latest, writable=False, ephemeral=False
        )
    _pragma(conn, path, "PRAGMA journal_mode = WAL")
    _pragma(conn, path, "PRAGMA synchronous = FULL")
    _pragma(conn, path, "PRAGMA foreign_keys = ON")
    if 0 < version < latest:
        _backup(conn, path, version)
    version, db_id = _migrate(conn, path, chain)
    if marker_id is None and db_id is not None:
        try:
            _write_marker(marker, db_id)
        except OSError as exc:
            raise failures.os_error(
                exc, path, f"{marker}: cannot write the store marker: {exc.strerror}"
            ) from exc
    _tighten(path)
    return Opened(conn, state_dir, path, db_id, version, latest, writable=True, ephemeral=False)


def _prepare_dir(state_dir: Path, *, write: bool) -> bool:
    """Create (write) or check the state folder. False: it does not exist (read-only open)."""
    try:
        st = state_dir.stat()
    except FileNotFoundError:
        if not write:
            return False
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            state_dir.chmod(0o700)
        except OSError as exc:
            raise StateError(
                f"{state_dir}: cannot create the state folder: {exc.strerror}",
                hint="choose another with --state-dir or GPUCTL_STATE_DIR",
            ) from exc
        return True
    except OSError as exc:
        raise StateError(f"{state_dir}: cannot read the state folder: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{state_dir}: the state folder is not a folder", hint=HINT)
    if st.st_uid != os.geteuid():
        raise StateError(
            f"{state_dir}: the state folder belongs to uid {st.st_uid}, not to you "
            f"(uid {os.geteuid()}); refusing to use it",
            hint="run gpuctl as its owner, or choose another folder with --state-dir",
        )
    if write and st.st_mode & 0o077:
        log.warning("%s: mode %o was looser than 0700; tightened", state_dir, st.st_mode & 0o777)
        state_dir.chmod(0o700)
    return True


def read_marker(marker: Path) -> str | None:
    try:
        text = marker.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(
            f"{marker}: cannot read the store marker: {exc.strerror}", hint=HINT
        ) from exc
    try:
        doc = json.loads(text)
        value = doc["database_id"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"{marker}: the store marker is damaged", hint=HINT) from exc
    if not isinstance(value, str) or not value:
        raise StateError(f"{marker}: database_id: not a database id", hint=HINT)
    return value


def _write_marker(marker: Path, database_id: str) -> None:
    """Atomically (0600): the old marker or the new one, never a part."""
    doc = {"database_id": database_id, "database": DB_NAME, "written_at": time.time()}
    write_atomic(marker, json.dumps(doc) + "\n")


def _create_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another gpuctl is creating it at this moment
        return
    except OSError as exc:
        raise failures.os_error(
            exc, path, f"{path}: cannot create the database: {exc.strerror}"
        ) from exc
    os.close(fd)
    fsync_dir(path.parent)


def _check_file(path: Path, *, write: bool) -> None:
    try:
        st = path.lstat()
    except OSError as exc:
        raise StateError(f"{path}: cannot read the database: {exc.strerror}", hint=HINT) from exc
    if not stat.S_ISREG(st.st_mode):
        raise StateError(f"{path}: the database is not a regular file", hint=HINT)
    if st.st_uid != os.geteuid():
        raise StateError(
            f"{path}: the database belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})",
            hint="run gpuctl as its owner, or choose another folder with --state-dir",
        )
    if not os.access(path, os.R_OK | (os.W_OK if write else 0)):
        raise StateError(
            f"{path}: the database is not {'writable' if write else 'readable'}", hint=HINT
        )


def _connect(path: Path, *, write: bool) -> sqlite3.Connection:
    """Open without ever creating the file. A read-only open of a file we may write uses `rw` with
    `query_only`, so that closing it removes the WAL files as SQLite does for writers (a `ro`
    connection would leave them behind)."""
    mode = "rw" if write or os.access(path, os.W_OK) else "ro"
    target = f"file:{quote(str(path))}?mode={mode}"
    try:
        conn = sqlite3.connect(
            target,
            uri=True,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE ... COMMIT
            check_same_thread=False,  # SqliteStore serializes access with its own lock
            timeout=BUSY_TIMEOUT_MS / 1000,
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not write:
            conn.execute("PRAGMA query_only = ON")
    except sqlite3.Error as exc:
        raise failures.state_error(exc, path, f"{path}: cannot open the database: {exc}") from exc
    return conn


def _pragma(conn: sqlite3.Connection, path: Path, statement: str) -> None:
    try:
        conn.execute(statement).fetchall()
    except sqlite3.Error as exc:
        raise failures.state_error(exc, path, f"{path}: {statement}: {exc}") from exc


def _quick_check(conn: sqlite3.Connection, path: Path) -> None:
    try:
        rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as exc:
        raise failures.state_error(
            exc, path, f"{path}: the database is unreadable or corrupt: {exc}"
        ) from exc
    problems = [one_line(str(r[0])) for r in rows if r[0] != "ok"]
    if problems:
        raise StoreCorrupt(
            f"{path}: the database is corrupt: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            hint=HINT,
        )


def one_line(text: str) -> str:
    return " ".join(text.replace("*** in database main ***", "").split())


def _version(
    conn: sqlite3.Connection, path: Path, marker: Path, marker_id: str | None
) -> tuple[int, str | None]:
    """(schema version, database id); version 0: an empty file (a creation that never finished)."""
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            if marker_id is not None:
                raise StateError(
                    f"{path}: the database is empty, but {marker} says this folder held "
                    f"database {marker_id}; refusing to start an empty store",
                    hint=f"{HINT}; restore the database from a backup, or move {marker} aside",
                )
            return 0, None
        if "meta" not in tables:
            raise StateError(f"{path}: not a gpuctl state database (no meta table)", hint=HINT)
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.Error as exc:
        raise failures.state_error(exc, path, f"{path}: the database is unreadable: {exc}") from exc
    try:
        version = int(meta["schema_version"])
        db_id = str(meta["database_id"])
    except (KeyError, ValueError) as exc:
        raise StateError(f"{path}: meta: schema_version or database_id missing", hint=HINT) from exc
    if marker_id is not None and marker_id != db_id:
        raise StateError(
            f"{path}: this is database {db_id}, but {marker} says the folder held "
            f"database {marker_id}; refusing to use another store's state",
            hint=f"{HINT}; put the right database back, or move {marker} aside to adopt this one",
        )
    return version, db_id


def _backup(conn: sqlite3.Connection, path: Path, version: int) -> None:
    """A copy beside the database before migrating it: `state.db.v1.bak`."""
    target = path.with_name(f"{path.name}.v{version}.bak")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    dest = sqlite3.connect(target)
    try:
        conn.backup(dest)
    except sqlite3.Error as exc:
        raise failures.state_error(
            exc, path, f"{path}: cannot back up before migrating: {exc}"
        ) from exc
    finally:
        dest.close()
    log.info("%s: backed up to %s before migrating from schema v%d", path, target, version)


def _migrate(
    conn: sqlite3.Connection, path: Path, chain: tuple[schema.Migration, ...]
) -> tuple[int, str | None]:
    """Apply pending migrations in one write transaction; create the meta rows on a new store."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            current = 0
            if "meta" in tables:
                row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                current = int(row[0])
            for step in schema.pending(current, chain):
                step.apply(conn, schema.SQLITE)
                if step.version == 1:
                    conn.executemany(
                        "INSERT INTO meta (key, value) VALUES (?, ?)",
                        [("database_id", uuid.uuid4().hex), ("created_at", repr(time.time()))],
                    )
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(step.version),),
                )
                log.info("%s: migrated to schema v%d (%s)", path, step.version, step.description)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise failures.state_error(
            exc, path, f"{path}: cannot prepare the database: {exc}"
        ) from exc
    return int(meta["schema_version"]), meta.get("database_id")


def _tighten(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            if p.stat().st_mode & 0o077:
                p.chmod(0o600)


def _ephemeral(state_dir: Path, chain: tuple[schema.Migration, ...]) -> Opened:
    """A read-only, empty, in-memory store: no state exists yet, and reading creates none."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    _migrate(conn, Path(":memory:"), chain)
    conn.execute("PRAGMA query_only = ON")
    return Opened(
        conn,
        state_dir,
        db_path(state_dir),
        None,
        schema.latest_version(chain),
        schema.latest_version(chain),
        writable=False,
        ephemeral=True,
    )
