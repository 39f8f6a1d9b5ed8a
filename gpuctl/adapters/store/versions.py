"""What the write transactions of several operators check and record so that a plan made on an
older state is refused (schema v7): each node's cordon version (`node_versions`: every cordon and
uncordon adds one, with who, when and why), each job's version (`jobs.version`, +1 at each change
of its row), and the fleet snapshot the control loop publishes (`fleet_snapshots`, the newest few).

A refusal is `StoreConflict` saying what changed since the plan, who did it and when, and that
nothing was written (the transaction is rolled back).
"""
# ruff: noqa: S608  (SQL built from constants only; values are bound)

from __future__ import annotations

import time
from typing import Any

from gpuctl.adapters.store import codec
from gpuctl.core.jobs.model import Event, NodeVersion, job_changed
from gpuctl.core.shared import PublishedFleet
from gpuctl.errors import StalePlan

SINCE = 7  # the schema version that added owners, versions and published snapshots


def local_offset_s(at: float) -> int:
    """The reader's zone at `at`, for the times a refusal names (`adapters.clock`'s, which the
    store may not import)."""
    return time.localtime(at).tm_gmtoff


def node_version(c: Any, node: str) -> NodeVersion:
    row = c.execute(
        f"SELECT {codec.NODE_VERSION_COLS} FROM node_versions WHERE node = ?", (node,)
    ).fetchone()
    return NodeVersion(node) if row is None else codec.node_version_from(row)


def check_node(c: Any, node: str, expect: int | None) -> NodeVersion:
    """The node's version now; StoreConflict saying who changed it when it is not `expect`."""
    now = node_version(c, node)
    if expect is not None and now.version != expect:
        offset = 0 if now.at is None else local_offset_s(now.at)
        raise StalePlan(now.changed(offset), hint="look again, then plan again")
    return now


def bump_node(c: Any, before: NodeVersion, event: Event, kind: str, reason: str) -> None:
    c.execute(
        f"INSERT INTO node_versions ({codec.NODE_VERSION_COLS}) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (node) DO UPDATE SET version = excluded.version, at = excluded.at, "
        "actor = excluded.actor, kind = excluded.kind, reason = excluded.reason",
        (before.node, before.version + 1, event.at, event.actor, kind, reason),
    )


def all_nodes(c: Any) -> dict[str, NodeVersion]:
    rows = c.execute(f"SELECT {codec.NODE_VERSION_COLS} FROM node_versions ORDER BY node")
    return {r[0]: codec.node_version_from(r) for r in rows.fetchall()}


def check_job(c: Any, job_id: str, expect: int | None) -> None:
    """StoreConflict naming the job's newest event (who did what, when) when its version is not
    `expect`."""
    if expect is None:
        return
    row = c.execute("SELECT version FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise StalePlan(f"job {job_id} is gone since your plan; nothing changed")
    if int(row[0]) == expect:
        return
    last = c.execute(
        "SELECT at, actor, kind, message FROM events WHERE job_id = ? ORDER BY id DESC LIMIT 1",
        (job_id,),
    ).fetchone()
    event = None if last is None else Event(float(last[0]), last[1], last[2], last[3], job_id)
    offset = 0 if event is None else local_offset_s(event.at)
    raise StalePlan(job_changed(job_id, event, offset), hint="look again, then plan again")


def publish(c: Any, published: PublishedFleet, keep: int) -> int:
    """Insert `published`, drop all but the newest `keep`; its id."""
    p = published
    row = c.execute(
        "INSERT INTO fleet_snapshots (taken_at, published_at, publisher, interval_s, nodes, body) "
        "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        (p.taken_at, p.published_at, p.publisher, p.interval_s, p.nodes, p.body),
    ).fetchone()
    new_id = int(row[0])
    c.execute("DELETE FROM fleet_snapshots WHERE id <= ?", (new_id - max(1, keep),))
    return new_id


def latest(c: Any) -> PublishedFleet | None:
    row = c.execute(
        f"SELECT {codec.SNAPSHOT_COLS} FROM fleet_snapshots ORDER BY id DESC LIMIT 1"
    ).fetchone()
    return None if row is None else codec.snapshot_from(row)
