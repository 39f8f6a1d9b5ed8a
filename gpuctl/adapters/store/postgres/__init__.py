"""The state store on PostgreSQL (`--state-url postgresql://…`, `GPUCTL_STATE_URL`).

`open_url(url, write=True)` creates the schema on first use and migrates an older one forward (in
one transaction); `write=False` creates nothing (a database without gpuctl's tables reads as an
empty store). Both refuse a schema newer than this gpuctl knows, as the SQLite store does.
"""

from __future__ import annotations

import logging
import time
import uuid

import psycopg

from gpuctl.adapters.store import schema
from gpuctl.adapters.store.postgres import url as urls
from gpuctl.adapters.store.postgres.store import (
    MIGRATE_KEY,
    PgConn,
    PostgresStore,
    connect,
    translate,
)
from gpuctl.errors import StateError

log = logging.getLogger(__name__)
HINT = "run `gpuctl db check`"


def open_url(url: str, *, write: bool) -> PostgresStore:
    urls.check(url)
    conn = connect(url)
    try:
        version, db_id = _opened_version(conn, url, write=write)
        return PostgresStore(conn, url, write=write, version=version, db_id=db_id)
    except BaseException:
        conn.close()
        raise


def _opened_version(conn: PgConn, url: str, *, write: bool) -> tuple[int, str | None]:
    where = urls.describe(url)
    latest = schema.latest_version()
    try:
        version, db_id = _version(conn, where)
        if version > latest:
            raise StateError(
                f"{where}: schema version {version} is newer than this gpuctl knows ({latest}); "
                "refusing to use it",
                hint=f"{HINT}; use the gpuctl that wrote it (upgrade this one)",
            )
        if write and version < latest:
            version, db_id = _migrate(conn, where)
    except psycopg.Error as exc:
        raise translate(exc, where) from None
    return version, db_id


def _version(conn: PgConn, where: str) -> tuple[int, str | None]:
    """(schema version, database id); 0: no gpuctl tables yet."""
    tables = {
        r[0]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
    }
    if "meta" not in tables:
        if "jobs" in tables:
            raise StateError(f"{where}: not a gpuctl state database (no meta table)", hint=HINT)
        return 0, None
    meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    try:
        return int(meta["schema_version"]), str(meta["database_id"])
    except (KeyError, ValueError) as exc:
        raise StateError(
            f"{where}: meta: schema_version or database_id missing", hint=HINT
        ) from exc


def _migrate(conn: PgConn, where: str) -> tuple[int, str | None]:
    """Apply the pending migrations in one transaction, one gpuctl at a time."""
    with conn.raw.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATE_KEY,))
        current, _ = _version(conn, where)  # another gpuctl may have migrated meanwhile
        for step in schema.pending(current):
            step.apply(conn, schema.POSTGRES)
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
            log.info("%s: migrated to schema v%d (%s)", where, step.version, step.description)
        return _version(conn, where)


__all__ = ["PostgresStore", "open_url"]
