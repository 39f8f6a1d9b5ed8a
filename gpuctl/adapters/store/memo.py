"""A read-only store kept open across polls, whose reads are remembered until the database
changes: the dashboard reads the same jobs, incarnations and cordons every second, and on a busy
fleet they change every few seconds at most.

"Changes" is SQLite's `PRAGMA data_version`: it moves when any other connection (another process:
the control loop, `gpuctl submit`) commits. The kept connection is also dropped when the database
file is replaced (another inode), so a restored backup is never shown stale.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from gpuctl.adapters.store.opening import Opened
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.core.health.autodrain import NodeHealth
from gpuctl.core.jobs.migration import Reservation
from gpuctl.core.jobs.model import (
    Checkpoint,
    Cordon,
    Event,
    Incarnation,
    Job,
    JobState,
    NodeLiveness,
)

T = TypeVar("T")
MEMO_KEYS = 4096  # reads remembered at most (a poll asks ~2 per active job)


class MemoStore(SqliteStore):
    """`SqliteStore`, read-only, with every read answered from memory while `data_version` stays
    the same. Lists and dicts are handed out as copies (the remembered ones stay as read)."""

    def __init__(self, opened: Opened) -> None:
        super().__init__(opened)
        self._memo: dict[Hashable, Any] = {}
        self._memo_lock = threading.Lock()
        self._seen = self.data_version()
        self.file_id = _file_id(self.path)
        self.reads = 0  # reads that went to the database (tests)

    def data_version(self) -> int:
        with self._lock, self._errors():
            return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def still_current(self) -> bool:
        """False when the database file was replaced (reopen). Otherwise forget what was read
        if anything was committed since, and True."""
        if _file_id(self.path) != self.file_id:
            return False
        version = self.data_version()
        if version != self._seen:
            with self._memo_lock:
                self._memo.clear()
                self._seen = version
        return True

    def _remember(self, key: Hashable, read: Callable[[], T]) -> T:
        with self._memo_lock:
            if key in self._memo:
                found: T = self._memo[key]
                return found
        value = read()
        self.reads += 1
        with self._memo_lock:
            if len(self._memo) >= MEMO_KEYS:
                self._memo.clear()
            self._memo[key] = value
        return value

    def job(self, ref: str) -> Job | None:
        return self._remember(("job", ref), lambda: SqliteStore.job(self, ref))

    def jobs(self, states: Iterable[JobState] | None = None) -> list[Job]:
        wanted = None if states is None else tuple(JobState(s) for s in states)
        return list(self._remember(("jobs", wanted), lambda: SqliteStore.jobs(self, wanted)))

    def incarnations(
        self, job_id: str | None = None, *, node: str | None = None, holding: bool | None = None
    ) -> list[Incarnation]:
        key = ("incarnations", job_id, node, holding)
        return list(
            self._remember(
                key, lambda: SqliteStore.incarnations(self, job_id, node=node, holding=holding)
            )
        )

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        return list(
            self._remember(("checkpoints", job_id), lambda: SqliteStore.checkpoints(self, job_id))
        )

    def events(
        self,
        *,
        since: float | None = None,
        job_id: str | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        wanted = None if kinds is None else tuple(kinds)
        if since is not None:  # a window that moves with the clock: never asked twice
            return SqliteStore.events(self, since=since, job_id=job_id, kinds=wanted, limit=limit)
        key = ("events", job_id, wanted, limit)
        return list(
            self._remember(
                key,
                lambda: SqliteStore.events(
                    self, since=since, job_id=job_id, kinds=wanted, limit=limit
                ),
            )
        )

    def reservations(self, node: str | None = None) -> list[Reservation]:
        return list(
            self._remember(("reservations", node), lambda: SqliteStore.reservations(self, node))
        )

    def cordons(self) -> list[Cordon]:
        return list(self._remember(("cordons",), lambda: SqliteStore.cordons(self)))

    def liveness(self) -> dict[str, NodeLiveness]:
        return dict(self._remember(("liveness",), lambda: SqliteStore.liveness(self)))

    def node_health(self) -> dict[str, NodeHealth]:
        return dict(self._remember(("node_health",), lambda: SqliteStore.node_health(self)))


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino
