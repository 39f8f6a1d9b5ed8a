"""A playbook's files in the state folder: its lock and its run journal.

`<state dir>/playbooks/<name>.lock`: one run of a playbook at a time. The run holds an exclusive
`flock` on it and writes who it is (pid, host, since when) into it; a second run is refused with
that holder's name. A run that ends (however it ends, short of a crash) empties the file; the
kernel drops the `flock` of a process that died, so a run that finds the lock free but the file
still naming a holder knows that holder crashed, says so, and takes the lock over.

`<state dir>/playbooks/<name>.journal.json`: the run's journal (`gpuctl.core.playbook.run.Journal`),
written atomically (temporary file, fsync, rename; 0600) before and after every unit, so a
crashed run can be resumed and skips the units already done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuctl.adapters.clock import local_stamp
from gpuctl.adapters.files import write_atomic
from gpuctl.core.playbook.run import Journal
from gpuctl.errors import StateError

FOLDER = "playbooks"
MAX_FILE_BYTES = 8 << 20


class LockHeld(StateError):
    """Another run of the playbook holds its lock."""


@dataclasses.dataclass(frozen=True, slots=True)
class Holder:
    pid: int
    host: str
    since: float
    run_id: str | None = None

    def text(self) -> str:
        return f"pid {self.pid} on {self.host} since {local_stamp(self.since)}"

    @staticmethod
    def parse(raw: bytes) -> Holder | None:
        try:
            data = json.loads(raw.decode("utf-8"))
            return Holder(
                int(data["pid"]),
                str(data["host"]),
                float(data["since"]),
                None if data.get("run_id") is None else str(data["run_id"]),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None


def folder(state_dir: Path) -> Path:
    path = state_dir / FOLDER
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        state_dir.chmod(0o700)
        path.chmod(0o700)
    return path


class PlaybookLock:
    """`with PlaybookLock(state_dir, name, now=...) as lock:` one run at a time; `lock.taken_over`
    names a crashed holder whose lock this run took over."""

    def __init__(
        self,
        state_dir: Path,
        name: str,
        *,
        now: Callable[[], float] = time.time,
        run_id: str | None = None,
    ) -> None:
        self.path = state_dir / FOLDER / f"{name}.lock"
        self.state_dir = state_dir
        self.name = name
        self.now = now
        self.run_id = run_id
        self.taken_over: Holder | None = None
        self._fd: int | None = None

    def __enter__(self) -> PlaybookLock:
        folder(self.state_dir)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StateError(
                f"{self.path}: cannot open the playbook lock: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Holder.parse(os.pread(fd, 4096, 0))
            os.close(fd)
            who = holder.text() if holder is not None else "another process"
            raise LockHeld(
                f"playbook {self.name} is running already: its lock ({self.path}) is held by {who}",
                hint="one run of a playbook at a time: wait for that run to end",
            ) from None
        self.taken_over = Holder.parse(os.pread(fd, 4096, 0))
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": self.now()}
        if self.run_id is not None:
            me["run_id"] = self.run_id
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # a clean release: nobody holds it
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


class JournalFile:
    """The run journal of one playbook."""

    def __init__(self, state_dir: Path, name: str) -> None:
        self.state_dir = state_dir
        self.path = state_dir / FOLDER / f"{name}.journal.json"

    def load(self) -> Journal | None:
        try:
            with self.path.open("rb") as fh:
                raw = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateError(f"{self.path}: cannot read the run journal: {exc.strerror}") from None
        try:
            if len(raw) > MAX_FILE_BYTES:
                raise ValueError("too large")
            data: Any = json.loads(raw.decode("utf-8"))
            return Journal.from_dict(data)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError) as exc:
            raise StateError(
                f"{self.path}: the run journal is unreadable ({exc})",
                hint=f"remove {self.path} to start the playbook afresh (nothing will be resumed)",
            ) from None

    def save(self, journal: Journal) -> None:
        folder(self.state_dir)
        body = json.dumps(journal.to_dict(), sort_keys=True, allow_nan=False) + "\n"
        try:
            write_atomic(self.path, body)
        except OSError as exc:
            raise StateError(f"{self.path}: cannot write the run journal: {exc.strerror}") from None
