"""`gpuctl db migrate --to postgresql://…`: the SQLite store's rows, copied into PostgreSQL.

Every table the SQLite store has (its columns as that store has them: the same schema version on
both sides) is copied in rowid order, in one transaction on the target: a copy that fails leaves
the target as it was. A target that holds any row already is refused: the copy never merges two
stores' jobs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import psycopg

from gpuctl.adapters.store.postgres import open_url
from gpuctl.adapters.store.postgres.store import GRANTS_KEY, LOOP_KEY, translate
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.errors import StateError

BATCH = 5_000
# parents before the rows that refer to them; any other table after, by name
FIRST = ("jobs", "incarnations", "allocations", "checkpoints", "reservations", "events")

Progress = Callable[[str, int, int], None]  # (table, rows copied, rows in the table)


@dataclasses.dataclass(frozen=True, slots=True)
class Copied:
    tables: tuple[tuple[str, int], ...]  # (table, rows), in the order copied
    schema_version: int

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.tables)

    def to_dict(self) -> dict[str, object]:
        return {"schema_version": self.schema_version, "tables": dict(self.tables)}


def plan(source: SqliteStore) -> Copied:
    """What a copy of `source` would write: each table and its rows (`meta` is the target's)."""
    tables = [
        str(r[0])
        for r in source._read(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "AND name != 'meta'"
        )
    ]
    ordered = [t for t in FIRST if t in tables] + sorted(set(tables) - set(FIRST))
    counts = tuple((t, int(source._read(f"SELECT count(*) FROM {t}")[0][0])) for t in ordered)  # noqa: S608
    return Copied(counts, source.schema_version)


def copy(source: SqliteStore, url: str, progress: Progress | None = None) -> Copied:
    """Copy every row of `source` into the empty store at `url` (created or migrated to this
    gpuctl's schema first), in one transaction. StateError if the target holds rows already or
    the two schemas differ."""
    what = plan(source)
    with open_url(url, write=True) as target:
        if target.schema_version != source.schema_version:
            raise StateError(
                f"{source.path}: schema v{source.schema_version}, but {target.where} is at "
                f"v{target.schema_version}",
                hint="open the SQLite store with this gpuctl for writing first (it migrates "
                "forward), then copy",
            )
        conn = target._pg.raw
        try:
            with target._lock, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (GRANTS_KEY,))
                held = conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (LOOP_KEY,))
                row = held.fetchone()
                if row is None or not row[0]:
                    raise StateError(
                        f"{target.where}: a control loop is running on this database",
                        hint="db migrate copies into an empty store that nothing uses yet",
                    )
                _refuse_rows(conn, target.where, [t for t, _ in what.tables])
                for table, total in what.tables:
                    _copy_table(source, conn, table, total, progress)
                    if table == "events" and total:
                        conn.execute(
                            "SELECT setval(pg_get_serial_sequence('events', 'id'), "
                            "(SELECT max(id) FROM events))"
                        )
        except psycopg.Error as exc:
            raise translate(exc, target.where) from None
    return what


def _refuse_rows(
    conn: psycopg.Connection[tuple[object, ...]], where: str, tables: list[str]
) -> None:
    held = []
    for table in tables:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608
        if row is not None and row[0]:
            held.append(f"{row[0]} {table}")
    if held:
        raise StateError(
            f"{where}: the target already holds rows ({', '.join(held)}); refusing to copy "
            "into a store in use",
            hint="give an empty database (db migrate never merges two stores)",
        )


def _copy_table(
    source: SqliteStore,
    conn: psycopg.Connection[tuple[object, ...]],
    table: str,
    total: int,
    progress: Progress | None,
) -> None:
    cols = [str(r[1]) for r in source._read(f"PRAGMA table_info({table})")]
    names = ", ".join(cols)
    done, last = 0, -1
    with conn.cursor().copy(f"COPY {table} ({names}) FROM STDIN") as out:
        while True:
            batch = source._read(
                f"SELECT rowid, {names} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?",  # noqa: S608
                (last, BATCH),
            )
            if not batch:
                break
            for r in batch:
                out.write_row(r[1:])
            last = int(batch[-1][0])
            done += len(batch)
            if progress is not None:
                progress(table, done, total)
    if progress is not None and total == 0:
        progress(table, 0, 0)
