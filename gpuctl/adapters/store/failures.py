"""What the user is told when SQLite fails, and the database file watched under an open store.

SQLite's error codes (Python 3.11's `sqlite_errorcode`) tell the causes apart, where the message
text does not: a damaged database (`SQLITE_CORRUPT`, `SQLITE_NOTADB`) is `StoreCorrupt`; a full
disk is `StoreFull`, whether SQLite saw it as `SQLITE_FULL` ("database or disk is full") or as an
I/O error (growing the shared-memory file on a full disk fails with `SQLITE_IOERR_SHMSIZE`, "disk
I/O error") while the state folder's file system has no room left. A full disk damages nothing:
SQLite rolls the change back.

A store kept open (the control loop) reads through SQLite's page cache and writes to the WAL, so a
database file truncated or replaced under it goes unnoticed by SQLite for as long as the pages it
needs are cached: the loop went on writing while every new command was refused. `DatabaseFile`
stats the file around each write transaction and at the start of each pass of the loop (a few
microseconds; a `quick_check` on the open connection reads the same cache and says "ok", and on a
fresh one costs a full read of the database: 0.1 s for 30 MiB).
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from gpuctl.errors import StateError, StoreCorrupt, StoreFull

CHECK_HINT = "run `gpuctl db check`"
LOW_SPACE_BYTES = 1 << 20  # an I/O error with less than this free is the disk being full
CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

# (bytes, inodes) free to gpuctl in a folder's file system; None when it cannot be told
Space = Callable[[Path], tuple[int, int] | None]


def free_space(folder: Path) -> tuple[int, int] | None:
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    root = os.geteuid() == 0  # root may use the blocks a file system keeps back
    blocks = st.f_bfree if root else st.f_bavail
    inodes = st.f_ffree if root else st.f_favail
    if st.f_files == 0:  # a file system without an inode count (btrfs, some network ones)
        inodes = 1
    return blocks * st.f_frsize, inodes


def disk_full(folder: Path, space: Space | None = None) -> bool:
    free = (space or free_space)(folder)
    return free is not None and (free[0] < LOW_SPACE_BYTES or free[1] == 0)


def state_error(
    exc: sqlite3.Error,
    path: Path,
    message: str,
    *,
    hint: str = CHECK_HINT,
    space: Space | None = None,
) -> StateError:
    """The error to raise for `exc` on the database `path`: a full disk says so (whatever the
    caller's `message`), a damaged database is `StoreCorrupt`, anything else a `StateError`."""
    code = primary_code(exc)
    if code == sqlite3.SQLITE_FULL or (
        code == sqlite3.SQLITE_IOERR and disk_full(path.parent, space)
    ):
        return full(path, str(exc))
    if code in CORRUPT_CODES:
        return StoreCorrupt(message, hint=hint)
    return StateError(message, hint=hint)


def primary_code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code (`SQLITE_IOERR` for `SQLITE_IOERR_SHMSIZE`), where known."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def is_corrupt(exc: sqlite3.Error) -> bool:
    return primary_code(exc) in CORRUPT_CODES


def os_error(exc: OSError, path: Path, message: str, *, hint: str | None = None) -> StateError:
    """The same for an OSError on one of the store's files."""
    if exc.errno in FULL_ERRNOS:
        return full(path, exc.strerror or str(exc))
    return StateError(message, hint=hint)


def full(path: Path, detail: str) -> StoreFull:
    return StoreFull(
        f"{path}: the disk is full (SQLite: {detail}); nothing was written, "
        "the database is as it was",
        hint=f"free space on the disk that holds {path.parent}, then run the command again",
    )


class DatabaseFile:
    """The database file a store opened: it must stay the same file (device and inode) and never
    get shorter (SQLite only grows it; gpuctl never vacuums). Once refused, always refused."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            st = path.stat()
        except OSError as exc:
            raise StateError(f"{path}: cannot read the database: {exc.strerror}") from exc
        self.identity = (st.st_dev, st.st_ino)
        self.size = st.st_size
        self.refused: str | None = None

    def check(self) -> None:
        """Look at the file (one stat): StoreCorrupt if it is not the one opened, or shorter."""
        if self.refused is None:
            self.refused = self._problem()
        self.raise_refused()

    def raise_refused(self) -> None:
        """StoreCorrupt if the file was refused before (without looking again)."""
        if self.refused is not None:
            raise StoreCorrupt(f"{self.path}: {self.refused}; refusing to use it", hint=CHECK_HINT)

    def refuse(self, problem: str) -> None:
        """SQLite found the database damaged: nothing more is read or written."""
        if self.refused is None:
            self.refused = problem

    def _problem(self) -> str | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return "the database file was removed while gpuctl had it open"
        except OSError as exc:
            raise StateError(f"{self.path}: cannot read the database: {exc.strerror}") from exc
        if (st.st_dev, st.st_ino) != self.identity:
            return "the database file was replaced while gpuctl had it open"
        if st.st_size < self.size:
            return (
                f"the database file shrank from {self.size} to {st.st_size} bytes while gpuctl "
                "had it open (truncated or overwritten)"
            )
        self.size = st.st_size
        return None
