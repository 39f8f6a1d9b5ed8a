"""What `begin_launch` checks inside its write transaction before granting cards."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from gpuctl.adapters.store import rows
from gpuctl.core.jobs import Incarnation, JobState
from gpuctl.errors import StoreConflict


def check_allowed(
    c: sqlite3.Connection, inc: Incarnation, capacity_mib: Mapping[tuple[str, int], int]
) -> None:
    """Raise StoreConflict unless the job is queued for exactly this incarnation and every card
    has room. Runs inside the caller's `BEGIN IMMEDIATE` transaction."""
    where = f"job {inc.job_id} incarnation {inc.n}"
    row = c.execute(
        "SELECT state, incarnation, cancel_requested FROM jobs WHERE id = ?", (inc.job_id,)
    ).fetchone()
    if row is None:
        raise StoreConflict(f"{where}: the job does not exist")
    state, current, cancel_requested = JobState(row[0]), int(row[1]), bool(row[2])
    if cancel_requested:
        raise StoreConflict(f"{where}: the job is being cancelled")
    if state is not JobState.QUEUED:
        raise StoreConflict(f"{where}: the job is {state}, not queued")
    if inc.n != current + 1:
        raise StoreConflict(
            f"{where}: the job is at incarnation {current}; the next one is {current + 1}"
        )
    live = c.execute(
        "SELECT n, state FROM incarnations WHERE job_id = ? AND state IN (?, ?, ?)",
        (inc.job_id, *rows.LIVE),
    ).fetchone()
    if live is not None:
        raise StoreConflict(f"{where}: incarnation {live[0]} is still {live[1]}")
    for card in inc.cards:
        _check_card(c, inc, card, capacity_mib)


def _check_card(
    c: sqlite3.Connection,
    inc: Incarnation,
    card: int,
    capacity_mib: Mapping[tuple[str, int], int],
) -> None:
    marks = ", ".join("?" * len(rows.HOLDING))
    holders = c.execute(
        "SELECT a.job_id, a.n, a.mib, a.whole FROM allocations a JOIN incarnations i "  # noqa: S608
        "ON i.job_id = a.job_id AND i.n = a.n "
        f"WHERE a.node = ? AND a.card = ? AND i.state IN ({marks}) ORDER BY a.job_id, a.n",
        (inc.node, card, *rows.HOLDING),
    ).fetchall()
    where = f"job {inc.job_id} incarnation {inc.n}: card {card} of {inc.node}"
    if holders and inc.whole:
        raise StoreConflict(
            f"{where} is held by job {holders[0][0]} incarnation {holders[0][1]}; "
            "a whole card is shared with nobody"
        )
    whole = [h for h in holders if h[3]]
    if whole:
        raise StoreConflict(f"{where} is held whole by job {whole[0][0]} incarnation {whole[0][1]}")
    if inc.whole:
        return
    capacity = capacity_mib.get((inc.node, card))
    if capacity is None:
        raise ValueError(f"{where}: no capacity given for this card")
    used = sum(int(h[2]) for h in holders)
    if used + inc.mib_per_card > capacity:
        raise StoreConflict(
            f"{where} has {capacity - used} MiB free of {capacity} MiB "
            f"(held by {len(holders)} incarnation(s)); {inc.mib_per_card} MiB do not fit"
        )
