"""What `begin_launch` and `reserve` check inside their write transaction before granting cards,
and the little `record_run` checks before writing a run another scheduler started.

A card is held by the incarnations whose state holds cards (their `allocations` rows) and by the
reservations of other jobs (a migration's target, held before its source stops). A cordoned node
is granted nothing: the cordon and the grant are serialized by the write lock, so once a cordon
has committed nothing new starts there.
"""
# ruff: noqa: S608  (SQL built from constants only; values are bound)

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping

from gpuctl.adapters.store import codec
from gpuctl.core.jobs.migration import Reservation
from gpuctl.core.jobs.model import CardClash, Incarnation, IncarnationState, JobState
from gpuctl.errors import StoreConflict

Holder = tuple[str, int | None, int, bool]  # (job id, incarnation or None: reserved, MiB, whole)


def check_allowed(
    c: sqlite3.Connection, inc: Incarnation, capacity_mib: Mapping[tuple[str, int], int]
) -> Reservation | None:
    """Raise StoreConflict unless the job is queued for exactly this incarnation, its node is
    not cordoned, and every card has room (on its own reservation, if it holds one: then the
    incarnation must take exactly the reserved cards). Returns that reservation, to consume."""
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
        (inc.job_id, *codec.LIVE),
    ).fetchone()
    if live is not None:
        raise StoreConflict(f"{where}: incarnation {live[0]} is still {live[1]}")
    check_not_cordoned(c, inc.node, where)
    own = reservation(c, inc.job_id)
    if own is not None:
        same = (own.node, sorted(own.cards), own.mib_per_card, own.whole) == (
            inc.node,
            sorted(inc.cards),
            inc.mib_per_card,
            inc.whole,
        )
        if not same:
            cards = ",".join(str(x) for x in own.cards)
            raise StoreConflict(
                f"{where}: the job holds a reservation of cards {cards} on {own.node}; it "
                "starts there, or the reservation is released first"
            )
        capacity_mib = {**own.capacity(), **capacity_mib}
    check_cards(
        c, inc.node, inc.cards, inc.mib_per_card, inc.whole, capacity_mib, where, inc.job_id
    )
    return own


def check_run(inc: Incarnation) -> None:
    """What `record_run` accepts as a run that started (ValueError otherwise): running, numbered
    from 1, on distinct cards."""
    where = f"job {inc.job_id} incarnation {inc.n}"
    if inc.state is not IncarnationState.RUNNING:
        raise ValueError(f"{where}: record_run writes a running incarnation, not {inc.state}")
    if inc.n < 1:
        raise ValueError(f"{where}: incarnations are numbered from 1")
    if not inc.cards or len(set(inc.cards)) != len(inc.cards):
        raise ValueError(f"{where}: cards must be distinct and at least one, got {inc.cards}")
    if inc.gpu_uuids and len(inc.gpu_uuids) != len(inc.cards):
        raise ValueError(f"{where}: {len(inc.gpu_uuids)} gpu_uuids for {len(inc.cards)} cards")
    if inc.mib_per_card <= 0:
        raise ValueError(f"{where}: mib_per_card must be positive, got {inc.mib_per_card}")


def check_record(c: sqlite3.Connection, inc: Incarnation) -> tuple[CardClash, ...]:
    """Raise StoreConflict unless the job is there, unfinished, at incarnation `inc.n - 1`: all
    a run another scheduler started must agree with (no cordon, no room: it runs already).
    Returns who else holds its cards (other jobs' incarnations and reservations)."""
    where = f"job {inc.job_id} incarnation {inc.n}"
    row = c.execute("SELECT state, incarnation FROM jobs WHERE id = ?", (inc.job_id,)).fetchone()
    if row is None:
        raise StoreConflict(f"{where}: the job does not exist")
    state, current = JobState(row[0]), int(row[1])
    if state.terminal:
        raise StoreConflict(f"{where}: the job is {state}")
    if inc.n != current + 1:
        raise StoreConflict(
            f"{where}: the job is at incarnation {current}; the next one is {current + 1}"
        )
    return tuple(
        CardClash(inc.node, card, h[0], h[1])
        for card in inc.cards
        for h in holders(c, inc.node, card, job_id=inc.job_id)
        if h[0] != inc.job_id
    )


def check_reserve(c: sqlite3.Connection, res: Reservation) -> None:
    """Raise StoreConflict unless `res` may be written: its job runs `from_incarnation` on
    `source_node`, it holds no other reservation, the target is not cordoned and every card
    has room."""
    where = f"reservation for job {res.job_id}"
    row = c.execute(
        "SELECT state, incarnation, cancel_requested FROM jobs WHERE id = ?", (res.job_id,)
    ).fetchone()
    if row is None:
        raise StoreConflict(f"{where}: the job does not exist")
    state, current, cancel_requested = JobState(row[0]), int(row[1]), bool(row[2])
    if cancel_requested:
        raise StoreConflict(f"{where}: the job is being cancelled")
    if state is not JobState.RUNNING or current != res.from_incarnation:
        raise StoreConflict(
            f"{where}: the job is {state} at incarnation {current}, not running incarnation "
            f"{res.from_incarnation}"
        )
    inc = c.execute(
        "SELECT node, state FROM incarnations WHERE job_id = ? AND n = ?",
        (res.job_id, res.from_incarnation),
    ).fetchone()
    if inc is None or IncarnationState(inc[1]) is not IncarnationState.RUNNING:
        now = "missing" if inc is None else inc[1]
        raise StoreConflict(f"{where}: incarnation {res.from_incarnation} is {now}, not running")
    if inc[0] != res.source_node:
        raise StoreConflict(f"{where}: incarnation {res.from_incarnation} runs on {inc[0]}")
    if reservation(c, res.job_id) is not None:
        raise StoreConflict(f"{where}: the job is being moved already")
    check_not_cordoned(c, res.node, where)
    check_cards(
        c, res.node, res.cards, res.mib_per_card, res.whole, res.capacity(), where, res.job_id
    )


def check_not_cordoned(c: sqlite3.Connection, node: str, where: str) -> None:
    row = c.execute("SELECT reason, operator FROM cordons WHERE node = ?", (node,)).fetchone()
    if row is not None:
        raise StoreConflict(f"{where}: {node} is cordoned ({row[0]}, by {row[1]})")


def reservation(c: sqlite3.Connection, job_id: str) -> Reservation | None:
    row = c.execute(f"SELECT {codec.RES_COLS} FROM reservations WHERE job_id = ?", (job_id,))
    found = row.fetchone()
    return None if found is None else codec.res_from(found)


def holders(c: sqlite3.Connection, node: str, card: int, *, job_id: str) -> list[Holder]:
    """Who holds (node, card): incarnations holding cards, and other jobs' reservations."""
    marks = ", ".join("?" * len(codec.HOLDING))
    held: list[Holder] = [
        (str(r[0]), int(r[1]), int(r[2]), bool(r[3]))
        for r in c.execute(
            "SELECT a.job_id, a.n, a.mib, a.whole FROM allocations a JOIN incarnations i "
            "ON i.job_id = a.job_id AND i.n = a.n "
            f"WHERE a.node = ? AND a.card = ? AND i.state IN ({marks}) ORDER BY a.job_id, a.n",
            (node, card, *codec.HOLDING),
        )
    ]
    for r in c.execute(
        "SELECT job_id, cards, mib_per_card, whole FROM reservations WHERE node = ? "
        "AND job_id != ? ORDER BY job_id",
        (node, job_id),
    ):
        if card in json.loads(r[1]):
            held.append((str(r[0]), None, int(r[2]), bool(r[3])))
    return held


def check_cards(
    c: sqlite3.Connection,
    node: str,
    cards: tuple[int, ...],
    mib: int,
    whole: bool,
    capacity_mib: Mapping[tuple[str, int], int],
    where: str,
    job_id: str,
) -> None:
    """`check_card` for each of `cards` on `node`, its capacity looked up in `capacity_mib`."""
    for card in cards:
        check_card(
            c,
            node,
            card,
            mib=mib,
            whole=whole,
            capacity=capacity_mib.get((node, card)),
            who=f"{where}: card {card} of {node}",
            job_id=job_id,
        )


def check_card(
    c: sqlite3.Connection,
    node: str,
    card: int,
    *,
    mib: int,
    whole: bool,
    capacity: int | None,
    who: str,
    job_id: str,
) -> None:
    found = holders(c, node, card, job_id=job_id)
    if found and whole:
        raise StoreConflict(
            f"{who} is held by {_name(found[0])}; a whole card is shared with nobody"
        )
    taken = [h for h in found if h[3]]
    if taken:
        raise StoreConflict(f"{who} is held whole by {_name(taken[0])}")
    if whole:
        return
    if capacity is None:
        raise ValueError(f"{who}: no capacity given for this card")
    used = sum(h[2] for h in found)
    if used + mib > capacity:
        raise StoreConflict(
            f"{who} has {capacity - used} MiB free of {capacity} MiB "
            f"(held by {len(found)} incarnation(s) or reservation(s)); {mib} MiB do not fit"
        )


def _name(h: Holder) -> str:
    return f"job {h[0]} incarnation {h[1]}" if h[1] is not None else f"a reservation of job {h[0]}"
