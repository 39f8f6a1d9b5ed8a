"""The control loop's cross-process lock: `flock` on a file in the state folder."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from gpuctl.errors import StoreConflict

_POLL_S = 0.05


@contextlib.contextmanager
def loop_lock(path: Path, wait_s: float = 0.0) -> Iterator[None]:
    """Hold an exclusive lock on `path` (0600) while the block runs; StoreConflict naming the
    holder's pid when another process keeps it past `wait_s`. The kernel releases it when the
    holder dies, so a SIGKILLed loop never leaves a stale lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreConflict(
                        f"{path}: another control loop holds the lock{_holder(fd)}",
                        hint="one `gpuctl reconcile` at a time: wait for it, or stop it",
                    ) from None
                time.sleep(_POLL_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""
