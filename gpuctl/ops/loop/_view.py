"""One pass's reads of the store: each table the pass asks about is read once (the jobs, the
incarnations holding cards, the other incarnations and every checkpoint of the jobs not finished,
the reservations, the cordons), and the pass's many questions (a job, its incarnations, its
checkpoints, per job and step) are answered from those reads. Without it a pass over J jobs made
about 3 J queries (`benchmarks/store_pass.py`).

Writes go to the store as they are, each its own transaction with its compare-and-set and the
controller's fence: the view never writes. What a write changes is read again: the rows of the job
it touched at the next question about that job (or about the whole table), and the reservations or
cordons whole. So the pass sees its own writes as it did when every question was a query; what it
does not see, as before between two of its queries, is another process's write made after the
table was read: the compare-and-set of each write refuses to act on what changed
(`StoreConflict`), as it always did.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from gpuctl.adapters.protocols import Store
from gpuctl.core.jobs.migration import Reservation
from gpuctl.core.jobs.model import Checkpoint, Cordon, Event, Incarnation, Job, JobState

# calls the view passes through as they are, nothing kept and nothing forgotten: reads of what it
# does not keep, and writes of what it does not keep; any other call forgets what was read
PASSED = frozenset(
    {"events", "liveness", "node_health", "lease", "latest_snapshot", "node_versions",
     "last_sample_at", "fleet_samples", "node_samples", "members", "card_capacities",
     "loop_lock", "check", "set_liveness", "set_node_health", "publish_snapshot",
     "record_samples", "prune_history", "mark_pass", "heartbeat", "renew_lease", "leave"}
)  # fmt: skip


UNFINISHED = tuple(s for s in JobState if not s.terminal)


class PassView:
    """The store as one pass reads it (see the module's docstring). `reads`: the queries it made
    (the tests bound them)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._jobs: dict[str, Job] | None = None  # every job, oldest submission first
        self._holding: list[Incarnation] | None = None  # incarnations holding cards
        self._incs: dict[str, list[Incarnation]] | None = None  # per unfinished job
        self._ckpts: dict[str, list[Checkpoint]] | None = None  # per unfinished job
        self._reservations: list[Reservation] | None = None
        self._cordons: list[Cordon] | None = None
        # jobs written since each table was read: their rows are read again when asked
        self._dirty: dict[str, set[str]] = {t: set() for t in ("jobs", "holding", "incs", "ckpts")}

    # --- reads ---------------------------------------------------------------------------------

    def jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        every = self._all_jobs()
        if states is None:
            return list(every.values())
        wanted = {JobState(s) for s in states}
        return [j for j in every.values() if j.state in wanted]

    def job(self, ref: str) -> Job | None:
        every = self._all_jobs()
        if ref in every:
            return every[ref]
        return self.store.job(ref)  # by name, or a job submitted since the table was read

    def incarnations(
        self, job_id: str | None = None, *, node: str | None = None, holding: bool | None = None
    ) -> list[Incarnation]:
        if job_id is not None:
            found = self._incarnations_of(job_id)
        elif holding:
            found = self._all_holding()
        else:  # every incarnation ever, or those released: not a question a pass asks often
            return self.store.incarnations(job_id, node=node, holding=holding)
        return [
            i
            for i in found
            if (node is None or i.node == node)
            and (holding is None or i.state.holds_cards == holding)
        ]

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        if self._ckpts is None:
            self._ckpts = {j: [] for j in self._unfinished()}  # those without any too
            self._ckpts.update(self.store.checkpoints_for(UNFINISHED))
            self._dirty["ckpts"].clear()
        if job_id in self._dirty["ckpts"] or job_id not in self._ckpts:
            self._ckpts[job_id] = self.store.checkpoints(job_id)
            self._dirty["ckpts"].discard(job_id)
        return list(self._ckpts[job_id])

    def reservations(self, node: str | None = None) -> list[Reservation]:
        if self._reservations is None:
            self._reservations = self.store.reservations()
        return [r for r in self._reservations if node is None or r.node == node]

    def cordons(self) -> list[Cordon]:
        if self._cordons is None:
            self._cordons = self.store.cordons()
        return list(self._cordons)

    # --- writes: the store's, then what they changed is read again -----------------------------

    def update_job(self, job_id: str, **kwargs: Any) -> Job:
        try:
            return self.store.update_job(job_id, **kwargs)
        finally:
            self._touched(job_id)

    def begin_launch(self, inc: Incarnation, **kwargs: Any) -> Job:
        try:
            return self.store.begin_launch(inc, **kwargs)
        finally:
            self._touched(inc.job_id, reservations=True)  # it consumes the job's reservation

    def update_incarnation(self, job_id: str, n: int, **kwargs: Any) -> Incarnation:
        try:
            return self.store.update_incarnation(job_id, n, **kwargs)
        finally:
            self._touched(job_id)

    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        try:
            self.store.add_checkpoint(checkpoint)
        finally:
            self._touched(checkpoint.job_id)

    def append_event(self, event: Event) -> int:
        return self.store.append_event(event)  # the view keeps no events

    def reserve(self, reservation: Reservation, **kwargs: Any) -> None:
        try:
            self.store.reserve(reservation, **kwargs)
        finally:
            self._touched(reservation.job_id, reservations=True)

    def update_reservation(self, job_id: str, **kwargs: Any) -> Reservation:
        try:
            return self.store.update_reservation(job_id, **kwargs)
        finally:
            self._touched(job_id, reservations=True)

    def release_reservation(self, job_id: str, **kwargs: Any) -> Reservation | None:
        try:
            return self.store.release_reservation(job_id, **kwargs)
        finally:
            self._touched(job_id, reservations=True)

    def cordon(self, *args: Any, **kwargs: Any) -> bool:
        try:
            return self.store.cordon(*args, **kwargs)
        finally:
            self._cordons = None

    def uncordon(self, *args: Any, **kwargs: Any) -> Cordon | None:
        try:
            return self.store.uncordon(*args, **kwargs)
        finally:
            self._cordons = None

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if name in PASSED or not callable(found):
            return found

        def written(*args: Any, **kwargs: Any) -> Any:  # any other call may write: forget all
            try:
                return found(*args, **kwargs)
            finally:
                self.forget()

        return written

    def forget(self) -> None:
        """Read every table again at its next question."""
        self._jobs = self._holding = self._incs = self._ckpts = None
        self._reservations = self._cordons = None
        for dirty in self._dirty.values():
            dirty.clear()

    # --- the tables ----------------------------------------------------------------------------

    def _touched(self, job_id: str, *, reservations: bool = False) -> None:
        for dirty in self._dirty.values():
            dirty.add(job_id)
        if reservations:
            self._reservations = None

    def _all_jobs(self) -> dict[str, Job]:
        if self._jobs is None:
            self._jobs = {j.id: j for j in self.store.jobs()}
            self._dirty["jobs"].clear()
        for job_id in _drain(self._dirty["jobs"]):
            job = self.store.job(job_id)
            if job is None:
                self._jobs.pop(job_id, None)
            elif job_id in self._jobs:
                self._jobs[job_id] = job  # its place (submission order) is kept
        return self._jobs

    def _all_holding(self) -> list[Incarnation]:
        if self._holding is None:
            self._holding = self.store.incarnations(holding=True)
            self._dirty["holding"].clear()
        dirty = _drain(self._dirty["holding"])
        if dirty:
            kept = [i for i in self._holding if i.job_id not in dirty]
            for job_id in dirty:
                kept += self.store.incarnations(job_id, holding=True)
            self._holding = sorted(kept, key=lambda i: (i.job_id, i.n))
        return self._holding

    def _incarnations_of(self, job_id: str) -> list[Incarnation]:
        if self._incs is None:  # those holding cards are read already: the others, and merge
            holding = self._all_holding()
            self._incs = {j: [] for j in self._unfinished()}  # those without any too
            for job_id, released in self.store.incarnations_for(UNFINISHED, holding=False).items():
                self._incs[job_id] = released
            for inc in holding:
                if inc.job_id in self._incs:
                    self._incs[inc.job_id].append(inc)
            for incs in self._incs.values():
                incs.sort(key=lambda i: i.n)
            self._dirty["incs"].clear()
        if job_id in self._dirty["incs"] or job_id not in self._incs:
            self._incs[job_id] = self.store.incarnations(job_id)
            self._dirty["incs"].discard(job_id)
        return list(self._incs[job_id])

    def _unfinished(self) -> list[str]:
        """The jobs not finished as the view read them: those whose incarnations and checkpoints
        it knows from one read of all (a job an operator cancels after that read is still one;
        its incarnations changed not, and only the loop changes them)."""
        return [j.id for j in self._all_jobs().values() if not j.state.terminal]


def _drain(ids: set[str]) -> set[str]:
    taken = set(ids)
    ids.clear()
    return taken


def view(store: Store) -> Store:
    """`store` as one pass reads it (a `PassView`: it answers all that a pass asks of a store)."""
    return cast(Store, PassView(store))
