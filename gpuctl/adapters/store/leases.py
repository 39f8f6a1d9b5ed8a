"""The controller's lease and its members in the store (schema v6), on either backend.

Each function runs inside the caller's write transaction (or, for reads, on its own): SQLite's
`BEGIN IMMEDIATE` holds the database, PostgreSQL's rows are locked as they are read (`FOR UPDATE`
to take the lease, `FOR SHARE` to check a fence, so a standby cannot take the lease between a
leader's check and its commit). Times are the database's clock (`schema.Dialect.now`).
"""
# ruff: noqa: S608  (SQL built from constants only; values are bound)

from __future__ import annotations

from gpuctl.adapters.store.dbapi import Conn
from gpuctl.adapters.store.schema import Dialect
from gpuctl.core.lease import Fence, Lease, Member, lost_message
from gpuctl.errors import LeaseLost, StoreConflict

SINCE = 6  # the schema version that added the lease
NAME = "controller"
_COLS = "holder, token, acquired_at, renewed_at, expires_at, last_pass_at"
MEMBER_GONE_S = 3600.0  # a member not seen for this long is forgotten


def now(conn: Conn, dialect: Dialect) -> float:
    return float(conn.execute(f"SELECT {dialect.now}").fetchone()[0])


def read(conn: Conn, dialect: Dialect, lock: str | None = None) -> Lease | None:
    row = conn.execute(
        f"SELECT {_COLS}, {dialect.now} FROM controller_lease WHERE name = ?"
        + (dialect.locking(lock) if lock else ""),
        (NAME,),
    ).fetchone()
    if row is None:
        return None
    holder, token, acquired, renewed, expires, last_pass, at = row
    return Lease(
        str(holder),
        int(token),
        float(acquired),
        float(renewed),
        float(expires),
        None if last_pass is None else float(last_pass),
        float(at),
    )


def acquire(conn: Conn, dialect: Dialect, holder: str, lease_s: float) -> Lease:
    """Take the lease for `holder` when nobody holds a live one (the token grows by one), renew
    it when `holder` holds it; the lease as it is after."""
    current = read(conn, dialect, "UPDATE")
    if current is None:
        conn.execute(
            f"INSERT INTO controller_lease (name, {_COLS}) "
            f"VALUES (?, ?, 1, {dialect.now}, {dialect.now}, {dialect.now} + ?, NULL)",
            (NAME, holder, lease_s),
        )
    elif current.held_by(holder):
        conn.execute(
            f"UPDATE controller_lease SET renewed_at = {dialect.now}, "
            f"expires_at = {dialect.now} + ? WHERE name = ?",
            (lease_s, NAME),
        )
    elif not current.live:
        conn.execute(
            f"UPDATE controller_lease SET holder = ?, token = token + 1, "
            f"acquired_at = {dialect.now}, renewed_at = {dialect.now}, "
            f"expires_at = {dialect.now} + ? WHERE name = ? AND token = ?",
            (holder, lease_s, NAME, current.token),
        )
    after = read(conn, dialect)
    if after is None:  # pragma: no cover - written above in this transaction
        raise StoreConflict("the controller lease vanished while it was taken")
    return after


def check(conn: Conn, dialect: Dialect, fence: Fence) -> Lease:
    """LeaseLost unless `fence` is the live lease's: called first in each fenced write."""
    current = read(conn, dialect, "SHARE")
    if current is None or current.token != fence.token or not current.live:
        raise LeaseLost(
            lost_message(fence, current),
            holder=None if current is None else current.holder,
            token=None if current is None else current.token,
        )
    return current


def renew(conn: Conn, dialect: Dialect, lease_s: float) -> Lease:
    """Push the expiry out (after `check` in the same transaction)."""
    conn.execute(
        f"UPDATE controller_lease SET renewed_at = {dialect.now}, expires_at = {dialect.now} + ? "
        "WHERE name = ?",
        (lease_s, NAME),
    )
    after = read(conn, dialect)
    assert after is not None
    return after


def release(conn: Conn, dialect: Dialect) -> None:
    """Expire the lease now (a clean stop): a standby takes it at its next try."""
    conn.execute(f"UPDATE controller_lease SET expires_at = {dialect.now} WHERE name = ?", (NAME,))


def mark_pass(conn: Conn, dialect: Dialect) -> None:
    conn.execute(
        f"UPDATE controller_lease SET last_pass_at = {dialect.now} WHERE name = ?", (NAME,)
    )


def heartbeat(conn: Conn, dialect: Dialect, holder: str, role: str, ttl_s: float) -> None:
    """Register `holder` (or say it is still there, in `role`); forget long-gone members."""
    conn.execute(
        f"INSERT INTO controllers (holder, role, started_at, seen_at, expires_at) "
        f"VALUES (?, ?, {dialect.now}, {dialect.now}, {dialect.now} + ?) "
        "ON CONFLICT (holder) DO UPDATE SET role = excluded.role, seen_at = excluded.seen_at, "
        "expires_at = excluded.expires_at",
        (holder, role, ttl_s),
    )
    conn.execute(f"DELETE FROM controllers WHERE expires_at < {dialect.now} - ?", (MEMBER_GONE_S,))


def leave(conn: Conn, holder: str) -> None:
    conn.execute("DELETE FROM controllers WHERE holder = ?", (holder,))


def members(conn: Conn, dialect: Dialect) -> list[Member]:
    """The controllers seen within their heartbeat's time to live, leader first, then by age."""
    rows = conn.execute(
        "SELECT holder, role, started_at, seen_at, expires_at FROM controllers "
        f"WHERE expires_at > {dialect.now} ORDER BY role, started_at, holder"
    ).fetchall()
    return [Member(str(h), str(r), float(s), float(seen), float(e)) for h, r, s, seen, e in rows]
