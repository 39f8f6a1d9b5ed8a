"""The invariants of the job store, checked in one place (the fault tests share this checker).

`check_invariants(store)` returns one human line per violation (empty: all hold):

- **no job lost**: a running job has exactly one live incarnation, its current one; a queued, held
  or finished job has none (a live copy of a job gpuctl no longer runs is an orphan);
- **at most one live incarnation per job** (live: launching, running, stopping);
- **no double-booked card**: a whole card is held by one incarnation (or reservation) only, and the
  slices held on a card fit its capacity (when capacities are given); a *reservation* (the cards
  a migration holds for a job's next incarnation) counts as holding its cards, but it is not a
  second live incarnation of its job. A card Slurm gave one of its runs while gpuctl gives it to
  another job is said as such: two owners of a card (the loop records what Slurm did as it is);
- **reservations are current**: a job holding one is running (or queued: its old copy stopped)
  at the incarnation the reservation moves, and it holds at most one;
- **incarnations numbered 1, 2, ... n** with no gap, and the job's `incarnation` is n;
- **resume step = the last committed step**: each incarnation resumed from the newest committed
  checkpoint the store knew of before it started (one of an older incarnation, committed at or
  before its start), or started fresh when there was none. Checked for jobs with checkpoints. One
  the loop found unusable at that start (a `checkpoint_invalid` event) does not count; a job whose
  committed checkpoints are all unusable is held, never started fresh, so it has nothing to check.

`check_database(state_dir)` is `gpuctl db check`: opening (read-only), integrity, schema version and
these invariants, as one report.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuctl.adapters.protocols import Store

if TYPE_CHECKING:
    from gpuctl.adapters.store import SqliteStore
from gpuctl.core.jobs.migration import Reservation
from gpuctl.core.jobs.model import Incarnation, IncarnationState, Job, JobState, is_slurm_run

LIVE = frozenset({IncarnationState.LAUNCHING, IncarnationState.RUNNING, IncarnationState.STOPPING})


def check_invariants(
    store: Store, *, capacity_mib: Mapping[tuple[str, int], int] | None = None
) -> list[str]:
    jobs = {job.id: job for job in store.jobs()}
    by_job: dict[str, list[Incarnation]] = defaultdict(list)
    for inc in store.incarnations():
        by_job[inc.job_id].append(inc)
    problems: list[str] = []
    for job_id in sorted(set(jobs) | set(by_job)):
        incs = sorted(by_job.get(job_id, []), key=lambda i: i.n)
        job = jobs.get(job_id)
        if job is None:
            problems.append(f"job {job_id}: incarnations {_ns(incs)} belong to no job")
            continue
        problems += _job_problems(job, incs)
        problems += _resume_problems(store, job, incs)
    reservations = store.reservations()
    problems += _reservation_problems(jobs, reservations)
    slurms = {j.id for j in jobs.values() if is_slurm_run(j)}
    problems += _card_problems(
        [i for incs in by_job.values() for i in incs], reservations, capacity_mib, slurms
    )
    return problems


def _ns(incs: list[Incarnation]) -> str:
    return ", ".join(str(i.n) for i in incs)


def _job_problems(job: Job, incs: list[Incarnation]) -> list[str]:
    out: list[str] = []
    live = [i for i in incs if i.state in LIVE]
    if len(live) > 1:
        out.append(
            f"job {job.id}: {len(live)} live incarnations ({_ns(live)}); at most one may run"
        )
    numbers = [i.n for i in incs]
    if numbers != list(range(1, len(incs) + 1)):
        out.append(f"job {job.id}: incarnations {numbers} are not numbered 1..{len(incs)}")
    newest = numbers[-1] if numbers else 0
    if job.incarnation != newest:
        out.append(f"job {job.id}: at incarnation {job.incarnation}, but the newest is {newest}")
    slurms = is_slurm_run(job)  # the loop records Slurm's runs a pass late
    if job.state is JobState.RUNNING and (not slurms or job.incarnation):
        current = [i for i in incs if i.n == job.incarnation]
        if not current:
            out.append(f"job {job.id}: running, but its incarnation {job.incarnation} is missing")
        elif current[0].state is IncarnationState.EXITED and current[0].ended_at is not None:
            # the exit is recorded and the job's own transition is the next write: a control
            # loop killed between the two leaves this, and its next pass settles it. Not lost.
            pass
        elif current[0].state not in LIVE:
            out.append(
                f"job {job.id}: running, but its incarnation {job.incarnation} is "
                f"{current[0].state}: nothing runs it (a lost job)"
            )
        stale = [i for i in live if i.n != job.incarnation]
        if stale:
            out.append(f"job {job.id}: incarnation {_ns(stale)} still live beside the current one")
    elif live and not slurms:  # Slurm's: closed at the pass that sees Slurm let it go
        out.append(
            f"job {job.id}: {job.state}, but incarnation {_ns(live)} is still {live[0].state} "
            "(an orphan copy)"
        )
    return out


def _resume_problems(store: Store, job: Job, incs: list[Incarnation]) -> list[str]:
    checkpoints = store.checkpoints(job.id)
    if not checkpoints:
        return []
    # a recorded checkpoint found damaged later was rightly skipped (the loop says so loudly)
    unusable = [
        (e.at, e.data.get("incarnation"), e.data.get("step"))
        for e in store.events(job_id=job.id, kinds=("checkpoint_invalid",))
    ]
    out: list[str] = []
    for inc in incs:
        known = [
            c.step
            for c in checkpoints
            if c.incarnation < inc.n
            and c.committed_at <= inc.started_at
            and not any(
                at <= inc.started_at and (i, st) == (c.incarnation, c.step)
                for at, i, st in unusable
            )
        ]
        expected = max(known) if known else None
        if inc.resume_step != expected:
            got = "fresh" if inc.resume_step is None else f"from step {inc.resume_step}"
            want = "none" if expected is None else f"step {expected}"
            out.append(
                f"job {job.id}: incarnation {inc.n} started {got}, but the newest committed "
                f"checkpoint before it was {want}"
            )
    return out


def _reservation_problems(jobs: Mapping[str, Job], reservations: list[Reservation]) -> list[str]:
    out: list[str] = []
    for res in reservations:
        job = jobs.get(res.job_id)
        if job is None:
            out.append(f"reservation on {res.node}: job {res.job_id} does not exist")
        elif job.state not in (JobState.RUNNING, JobState.QUEUED):
            out.append(f"job {job.id}: {job.state}, but it still holds a reservation on {res.node}")
        elif job.incarnation != res.from_incarnation:
            out.append(
                f"job {job.id}: at incarnation {job.incarnation}, but its reservation on "
                f"{res.node} moves incarnation {res.from_incarnation}"
            )
    return out


def _card_problems(
    incs: list[Incarnation],
    reservations: list[Reservation],
    capacity_mib: Mapping[tuple[str, int], int] | None,
    slurms: frozenset[str] | set[str] = frozenset(),
) -> list[str]:
    # (name, MiB, whole) of each holder of (node, card)
    holders: dict[tuple[str, int], list[tuple[str, int, bool]]] = defaultdict(list)
    for inc in incs:
        if inc.state.holds_cards:
            for card in inc.cards:
                holders[(inc.node, card)].append(
                    (f"{inc.job_id}#{inc.n}", inc.mib_per_card, inc.whole)
                )
    for res in reservations:
        for card in res.cards:
            holders[(res.node, card)].append(
                (f"{res.job_id}#reserved", res.mib_per_card, res.whole)
            )
    out: list[str] = []
    for (node, card), held in sorted(holders.items()):
        names = ", ".join(h[0] for h in held)
        theirs = [h[0] for h in held if h[0].split("#")[0] in slurms]
        if theirs and len(theirs) < len(held):
            ours = ", ".join(h[0] for h in held if h[0] not in theirs)
            out.append(
                f"card {card} of {node}: two owners: Slurm runs {', '.join(theirs)} there, and "
                f"gpuctl gives it to {ours}"
            )
            continue
        if len(held) > 1 and any(h[2] for h in held):
            out.append(f"card {card} of {node}: a whole card is held by {len(held)} ({names})")
            continue
        capacity = None if capacity_mib is None else capacity_mib.get((node, card))
        used = sum(h[1] for h in held)
        if capacity is not None and used > capacity:
            out.append(f"card {card} of {node}: {used} MiB held ({names}) on a {capacity} MiB card")
    return out


# --- gpuctl db check -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class DbReport:
    state_dir: str
    database: str
    exists: bool
    database_id: str | None
    schema_version: int | None
    known_schema_version: int
    jobs: int | None
    incarnations: int | None
    events: int | None
    problems: tuple[str, ...]
    history_samples: int | None = None  # fleet and node samples (schema v5)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "problems": list(self.problems),
            "healthy": self.healthy,
        }


def check_database(state_dir: Path, state_url: str | None = None) -> DbReport:
    """Open the store read-only and check everything; a store that refuses to open is a problem
    in the report, not an exception. With `state_url`, the PostgreSQL store there."""
    from gpuctl.adapters.store import SCHEMA_VERSION, db_path, open_store
    from gpuctl.errors import StateError

    path = db_path(state_dir)
    base = DbReport(
        state_dir=str(state_dir),
        database=str(path),
        exists=path.exists(),
        database_id=None,
        schema_version=None,
        known_schema_version=SCHEMA_VERSION,
        jobs=None,
        incarnations=None,
        events=None,
        problems=(),
    )
    if state_url is not None:
        from gpuctl.adapters.store.postgres import open_url
        from gpuctl.adapters.store.postgres.url import redact

        base = dataclasses.replace(base, database=redact(state_url), exists=True)
        try:
            pg = open_url(state_url, write=False)
        except StateError as exc:
            return dataclasses.replace(base, problems=(exc.message,))
        return _checked(pg, dataclasses.replace(base, exists=not pg.ephemeral))
    try:
        store = open_store(state_dir, write=False)
    except StateError as exc:
        return dataclasses.replace(base, problems=(exc.message,))
    return _checked(store, base)


def _checked(store: SqliteStore, base: DbReport) -> DbReport:
    with store:
        if store.ephemeral:
            return base
        problems = store.check()
        if not problems:
            problems += check_invariants(store, capacity_mib=store.card_capacities())
        counts = store.counts()
        return dataclasses.replace(
            base,
            database_id=store.database_id,
            schema_version=store.schema_version,
            jobs=counts["jobs"],
            incarnations=counts["incarnations"],
            events=counts["events"],
            problems=tuple(problems),
            history_samples=(
                counts["fleet_samples"] + counts["node_samples"]
                if "fleet_samples" in counts
                else None
            ),
        )
