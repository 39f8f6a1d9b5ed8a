"""The fleet's history in SQL (schema v5): fleet and node samples written, read, downsampled and
pruned, and the events past their retention deleted. Plain SQL (integer division buckets, no
SQLite-only functions), so the PostgreSQL store runs the same statements.
"""
# ruff: noqa: S608  (column lists are constants; values are always bound)

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from gpuctl.core.history import (
    CHECKPOINT_EVENT_PREFIX,
    FLEET_SERIES,
    NODE_SERIES,
    FleetSample,
    NodeSample,
    Pruned,
    PruneReport,
    Retention,
    average_fleet,
    average_nodes,
    bucket,
    node_average,
    table_rows,
)

T = TypeVar("T")

HISTORY_SINCE = 5  # the schema version that added the samples
FLEET_COLS = "at, step_s, " + ", ".join(FLEET_SERIES)
NODE_COLS = "at, node_id, step_s, " + ", ".join(NODE_SERIES)
# read through the node's name
NODE_READ = (
    "SELECT s.at, h.name, s.step_s, "
    + ", ".join(f"s.{k}" for k in NODE_SERIES)
    + " FROM node_samples s JOIN history_nodes h ON h.id = s.node_id"
)
PRUNE_KEY = "events_prune_before"


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def fleet_values(s: FleetSample) -> tuple[Any, ...]:
    return (s.at, s.step_s, *(s.get(k) for k in FLEET_SERIES))


def node_ids(conn: sqlite3.Connection, names: Iterable[str]) -> dict[str, int]:
    """Each node's id in `history_nodes`, the new ones given max + 1 onwards."""
    ids = {str(r[1]): int(r[0]) for r in conn.execute("SELECT id, name FROM history_nodes")}
    new = sorted(set(names) - ids.keys())
    next_id = max(ids.values(), default=0) + 1
    for i, name in enumerate(new, start=next_id):
        conn.execute("INSERT INTO history_nodes (id, name) VALUES (?, ?)", (i, name))
        ids[name] = i
    return ids


def _insert_nodes(conn: sqlite3.Connection, nodes: Sequence[NodeSample]) -> None:
    if not nodes:
        return
    ids = node_ids(conn, {n.node for n in nodes})
    conn.executemany(
        f"INSERT INTO node_samples ({NODE_COLS}) VALUES ({_marks(3 + len(NODE_SERIES))})",
        [(n.at, ids[n.node], n.step_s, *n.values()) for n in nodes],
    )


def fleet_from(row: Sequence[Any]) -> FleetSample:
    return FleetSample(int(row[0]), int(row[1]), dict(zip(FLEET_SERIES, row[2:], strict=True)))


def node_from(row: Sequence[Any]) -> NodeSample:
    ints = [None if v is None else int(v) for v in row[4:]]
    util = None if row[3] is None else float(row[3])
    return NodeSample(int(row[0]), int(row[2]), str(row[1]), util, *ints)


def record(
    conn: sqlite3.Connection, fleet: FleetSample | None, nodes: Sequence[NodeSample]
) -> None:
    """Write samples; a sample at a time already recorded replaces it (the newest wins)."""
    if fleet is not None:
        conn.execute("DELETE FROM fleet_samples WHERE at = ?", (fleet.at,))
        conn.execute(
            f"INSERT INTO fleet_samples ({FLEET_COLS}) VALUES ({_marks(2 + len(FLEET_SERIES))})",
            fleet_values(fleet),
        )
    if nodes:
        ats = sorted({n.at for n in nodes})
        conn.execute(
            f"DELETE FROM node_samples WHERE at IN ({_marks(len(ats))})",
            ats,
        )
        _insert_nodes(conn, nodes)


def read_fleet(conn: sqlite3.Connection, since: float, until: float | None) -> list[FleetSample]:
    sql = f"SELECT {FLEET_COLS} FROM fleet_samples WHERE at >= ?"
    params: list[Any] = [int(since)]
    if until is not None:
        sql += " AND at <= ?"
        params.append(int(until))
    return [fleet_from(r) for r in conn.execute(sql + " ORDER BY at", params).fetchall()]


def read_nodes(
    conn: sqlite3.Connection, since: float, until: float | None, node: str | None
) -> list[NodeSample]:
    sql = NODE_READ + " WHERE s.at >= ?"
    params: list[Any] = [int(since)]
    if until is not None:
        sql += " AND s.at <= ?"
        params.append(int(until))
    if node is not None:
        sql += " AND h.name = ?"
        params.append(node)
    return [node_from(r) for r in conn.execute(sql + " ORDER BY s.at, h.name", params).fetchall()]


def read_node_buckets(
    conn: sqlite3.Connection, since: float, until: float | None, node: str | None, step: int
) -> list[NodeSample]:
    """Each node's samples averaged into buckets of `step` by the database (GROUP BY node and
    at / step): one row per node and bucket comes back, each column's sum and count of defined
    values, which `core.history.node_average` turns into the means `average_nodes` gives."""
    sums = ", ".join(f"sum({k}), count({k})" for k in NODE_SERIES)
    sql = f"SELECT (at / ?) * ?, node_id, {sums} FROM node_samples WHERE at >= ?"
    params: list[Any] = [step, step, int(since)]
    if until is not None:
        sql += " AND at <= ?"
        params.append(int(until))
    if node is not None:
        sql += " AND node_id IN (SELECT id FROM history_nodes WHERE name = ?)"
        params.append(node)
    rows = conn.execute(sql + " GROUP BY 1, 2", params).fetchall()
    if not rows:
        return []
    names = {int(r[0]): str(r[1]) for r in conn.execute("SELECT id, name FROM history_nodes")}
    out = []
    for r in rows:
        totals = [
            (0 if r[i] is None else float(r[i]) if i == 2 else int(r[i]), int(r[i + 1]))
            for i in range(2, 2 + 2 * len(NODE_SERIES), 2)
        ]
        out.append(node_average(int(r[0]), step, names[int(r[1])], totals))
    out.sort(key=lambda n: (n.at, n.node))  # by name as Python orders it, whatever the collation
    return out


def last_at(conn: sqlite3.Connection) -> int | None:
    row = conn.execute("SELECT max(at) FROM fleet_samples").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def prune(conn: sqlite3.Connection, now: float, retention: Retention) -> Pruned:
    """Average what aged past each level into that level's buckets, drop samples past the
    retention, and delete events past theirs (checkpoint events sooner than the rest)."""
    averaged = 0
    for step, before in retention.levels(now):
        averaged += _downsample(conn, step, before)
    horizon = int(now - retention.keep_s)
    dropped = conn.execute("DELETE FROM fleet_samples WHERE at < ?", (horizon,)).rowcount
    dropped += conn.execute("DELETE FROM node_samples WHERE at < ?", (horizon,)).rowcount
    return Pruned(averaged, dropped, _prune_events(conn, now, retention))


def row_counts(conn: sqlite3.Connection) -> dict[tuple[str, int | str], int]:
    """Rows by (table, level): the sample tables by resolution, events by class."""
    out: dict[tuple[str, int | str], int] = {}
    for table in ("fleet_samples", "node_samples"):
        for step, n in conn.execute(f"SELECT step_s, count(*) FROM {table} GROUP BY step_s"):
            out[(table, int(step))] = int(n)
    like = CHECKPOINT_EVENT_PREFIX + "%"
    for is_checkpoint, n in conn.execute(
        "SELECT CASE WHEN kind LIKE ? THEN 1 ELSE 0 END, count(*) FROM events GROUP BY 1",
        (like,),
    ):
        out[("events", "checkpoint" if int(is_checkpoint) else "other")] = int(n)
    return out


def prune_report(
    conn: sqlite3.Connection, now: float, retention: Retention, *, dry_run: bool
) -> PruneReport:
    """`prune`, each table's rows by level counted before and after (in the caller's
    transaction, which a dry run rolls back)."""
    before = row_counts(conn)
    pruned = prune(conn, now, retention)
    return PruneReport(pruned, table_rows(before, row_counts(conn)), dry_run)


def _downsample(conn: sqlite3.Connection, step: int, before: int) -> int:
    """Samples finer than `step` starting before `before` replaced by their bucket averages (an
    average already in one of those buckets, from a sample recorded late, is folded in)."""
    where = "step_s < ? AND at < ?"
    fleet = [
        fleet_from(r)
        for r in conn.execute(
            f"SELECT {FLEET_COLS} FROM fleet_samples WHERE {where}", (step, before)
        ).fetchall()
    ]
    nodes = [
        node_from(r)
        for r in conn.execute(
            f"{NODE_READ} WHERE s.step_s < ? AND s.at < ?", (step, before)
        ).fetchall()
    ]
    if not fleet and not nodes:
        return 0
    buckets = sorted({bucket(s.at, step) for s in fleet} | {bucket(s.at, step) for s in nodes})
    fleet += _at(conn, f"SELECT {FLEET_COLS} FROM fleet_samples", "", step, buckets, fleet_from)
    nodes += _at(conn, NODE_READ, "s.", step, buckets, node_from)
    conn.execute(f"DELETE FROM fleet_samples WHERE {where}", (step, before))
    conn.execute(f"DELETE FROM node_samples WHERE {where}", (step, before))
    for chunk in _chunks(buckets):
        marks = _marks(len(chunk))
        conn.execute(
            f"DELETE FROM fleet_samples WHERE step_s = ? AND at IN ({marks})", [step, *chunk]
        )
        conn.execute(
            f"DELETE FROM node_samples WHERE step_s = ? AND at IN ({marks})", [step, *chunk]
        )
    record_many(conn, average_fleet(fleet, step), average_nodes(nodes, step))
    return len(fleet) + len(nodes)


def _chunks(values: list[int], size: int = 500) -> list[list[int]]:
    return [values[i : i + size] for i in range(0, len(values), size)]


def _at(
    conn: sqlite3.Connection,
    select: str,
    prefix: str,
    step: int,
    buckets: list[int],
    decode: Callable[[Sequence[Any]], T],
) -> list[T]:
    out: list[T] = []
    for chunk in _chunks(buckets):
        rows = conn.execute(
            f"{select} WHERE {prefix}step_s = ? AND {prefix}at IN ({_marks(len(chunk))})",
            [step, *chunk],
        ).fetchall()
        out += [decode(r) for r in rows]
    return out


def record_many(
    conn: sqlite3.Connection, fleet: Sequence[FleetSample], nodes: Sequence[NodeSample]
) -> None:
    """Samples written as they are (a benchmark's month, a downsampled bucket)."""
    conn.executemany(
        f"INSERT INTO fleet_samples ({FLEET_COLS}) VALUES ({_marks(2 + len(FLEET_SERIES))})",
        [fleet_values(f) for f in fleet],
    )
    _insert_nodes(conn, nodes)


def _prune_events(conn: sqlite3.Connection, now: float, retention: Retention) -> int:
    checkpoint_before = now - retention.checkpoint_events_s
    other_before = now - retention.events_s
    horizon = max(checkpoint_before, other_before)
    conn.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (PRUNE_KEY, repr(float(horizon))),
    )
    try:
        like = CHECKPOINT_EVENT_PREFIX + "%"
        deleted = conn.execute(
            "DELETE FROM events WHERE (kind LIKE ? AND at < ?) OR (kind NOT LIKE ? AND at < ?)",
            (like, checkpoint_before, like, other_before),
        ).rowcount
    finally:
        conn.execute("DELETE FROM meta WHERE key = ?", (PRUNE_KEY,))
    return int(deleted)
