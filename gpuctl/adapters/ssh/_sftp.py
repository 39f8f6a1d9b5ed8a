"""Folder copies over SFTP, for checkpoints: bounded in time, bytes and files, atomic at the end.

A copy is written into a temporary sibling of its destination (`.<name>.gpuctl-<random>`), files
in name order with the names in `last` (the checkpoint marker) at the very end, then renamed into
place in one step; a destination that exists is refused (`TreeExists`), never merged. Only plain
files and folders are copied: a symlink or a device in the tree is an error.

The SFTP session is the node's `sftp` subsystem, or, where sshd has none configured, the
`sftp-server` program started over an exec (the same protocol). One deadline covers the whole
copy: the channel gets socket timeouts, and a watchdog closes it when the deadline passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import posixpath
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gpuctl.adapters.files import fsync_dir
from gpuctl.adapters.protocols import TreeExists, TreeTooLarge
from gpuctl.errors import GpuctlError, TransportError, TransportTimeout

if TYPE_CHECKING:
    import paramiko

DEFAULT_MAX_FILES = 10_000
_CHUNK = 1 << 18
_SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/sftp-server",
)
SFTP_FALLBACK = (
    "for p in "
    + " ".join(_SFTP_SERVERS)
    + '; do [ -x "$p" ] && exec "$p"; done; '
    + 'echo "gpuctl: no sftp-server on this node" >&2; exit 127'
)


class TransferTimeout(TransportTimeout):
    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.phase = "transfer"


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    rel: str  # posix path relative to the tree's root
    size: int
    is_dir: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    deadline: float  # time.monotonic()
    max_bytes: int
    max_files: int = DEFAULT_MAX_FILES
    where: str = ""

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TransferTimeout(
                f"{self.where}: timeout (transfer): the copy ran past its deadline"
            )
        return left


def ordered(entries: Sequence[Entry], last: Sequence[str]) -> list[Entry]:
    """Folders first (parents before children), then files by name, the `last` names at the end."""
    dirs = sorted((e for e in entries if e.is_dir), key=lambda e: e.rel)
    files = sorted((e for e in entries if not e.is_dir), key=lambda e: (e.rel in last, e.rel))
    return dirs + files


def _check_budget(entries: Sequence[Entry], limits: Limits, what: str) -> None:
    if len(entries) > limits.max_files:
        raise TreeTooLarge(f"{what}: more than {limits.max_files} files and folders")
    total = sum(e.size for e in entries)
    if total > limits.max_bytes:
        raise TreeTooLarge(f"{what}: {total} bytes, more than the limit of {limits.max_bytes}")


def _guard(limits: Limits, total: list[int]) -> Callable[[int, int], None]:
    """A paramiko transfer callback that stops a file growing past the byte budget."""
    start = total[0]

    def callback(done: int, _size: int) -> None:
        total[0] = start + done
        if total[0] > limits.max_bytes:
            raise TreeTooLarge(f"{limits.where}: the copy passed {limits.max_bytes} bytes")
        limits.remaining()

    return callback


# -- the session ----------------------------------------------------------------------------------


def open_sftp(
    transport: paramiko.Transport, limits: Limits, channels: list[paramiko.Channel]
) -> paramiko.SFTPClient:
    """An SFTP session: the `sftp` subsystem, else `sftp-server` over an exec. Each channel is
    added to `channels` (which the caller's watchdog closes at the deadline)."""
    import paramiko

    for attempt in ("subsystem", "exec"):
        chan = transport.open_session(timeout=limits.remaining())
        channels.append(chan)
        chan.settimeout(limits.remaining())
        try:
            if attempt == "subsystem":
                chan.invoke_subsystem("sftp")
            else:
                chan.exec_command(SFTP_FALLBACK)
            return paramiko.SFTPClient(chan)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            limits.remaining()
            if attempt == "exec":
                raise TransportError(
                    f"{limits.where}: no SFTP session: {exc or type(exc).__name__}",
                    hint="the node needs sshd's sftp subsystem or an sftp-server program",
                ) from None
    raise AssertionError("unreachable")  # pragma: no cover


# -- remote -> local ------------------------------------------------------------------------------


def remote_walk(sftp: paramiko.SFTPClient, root: str, limits: Limits) -> list[Entry]:
    out: list[Entry] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        limits.remaining()
        for attr in sftp.listdir_attr(posixpath.join(root, rel) if rel else root):
            child = posixpath.join(rel, attr.filename) if rel else attr.filename
            mode = attr.st_mode or 0
            if stat.S_ISDIR(mode):
                out.append(Entry(child, 0, True))
                pending.append(child)
            elif stat.S_ISREG(mode):
                out.append(Entry(child, attr.st_size or 0, False))
            else:
                raise GpuctlError(f"{limits.where}: {root}/{child} is not a plain file or folder")
            if len(out) > limits.max_files:
                raise TreeTooLarge(f"{limits.where}: {root} has more than {limits.max_files} files")
    return out


def download(
    sftp: paramiko.SFTPClient,
    remote_dir: str,
    local_dir: Path,
    limits: Limits,
    last: Sequence[str] = (),
) -> int:
    """Copy the remote folder to `local_dir` (which must not exist); the bytes copied."""
    if local_dir.exists():
        raise TreeExists(f"{local_dir} already exists")
    try:
        if not stat.S_ISDIR(sftp.stat(remote_dir).st_mode or 0):
            raise GpuctlError(f"{limits.where}: {remote_dir} is not a folder")
    except FileNotFoundError:
        raise GpuctlError(f"{limits.where}: {remote_dir} not found") from None
    entries = remote_walk(sftp, remote_dir, limits)
    _check_budget(entries, limits, f"{limits.where}: {remote_dir}")
    local_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = local_dir.parent / f".{local_dir.name}.gpuctl-{secrets.token_hex(4)}"
    tmp.mkdir(mode=0o700)
    total = [0]
    try:
        for entry in ordered(entries, last):
            target = tmp / entry.rel
            if entry.is_dir:
                target.mkdir(mode=0o700)
                continue
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                sftp.getfo(
                    posixpath.join(remote_dir, entry.rel), out, callback=_guard(limits, total)
                )
                out.flush()
                os.fsync(out.fileno())
        for folder in [tmp, *(tmp / e.rel for e in entries if e.is_dir)]:
            fsync_dir(folder)
        if local_dir.exists():
            raise TreeExists(f"{local_dir} already exists")
        tmp.rename(local_dir)
        fsync_dir(local_dir.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return total[0]


# -- local -> remote ------------------------------------------------------------------------------


def local_walk(root: Path, limits: Limits) -> list[Entry]:
    out: list[Entry] = []
    for path in sorted(_walk(root)):
        info = path.lstat()
        rel = path.relative_to(root).as_posix()
        if stat.S_ISDIR(info.st_mode):
            out.append(Entry(rel, 0, True))
        elif stat.S_ISREG(info.st_mode):
            out.append(Entry(rel, info.st_size, False))
        else:
            raise GpuctlError(f"{path} is not a plain file or folder")
        if len(out) > limits.max_files:
            raise TreeTooLarge(f"{root} has more than {limits.max_files} files")
    return out


def _walk(root: Path) -> Iterator[Path]:
    for path in root.iterdir():
        yield path
        if path.is_dir() and not path.is_symlink():
            yield from _walk(path)


def _remote_exists(sftp: paramiko.SFTPClient, path: str) -> bool:
    try:
        sftp.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _remote_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = [p for p in path.split("/") if p]
    current = "/" if path.startswith("/") else ""
    for part in parts:
        current = posixpath.join(current, part) if current else part
        if not _remote_exists(sftp, current):
            with contextlib.suppress(OSError):  # lost a race: the stat below decides
                sftp.mkdir(current, mode=0o700)
            if not stat.S_ISDIR(sftp.stat(current).st_mode or 0):
                raise GpuctlError(f"{current} is not a folder")


def _remote_rmtree(sftp: paramiko.SFTPClient, path: str) -> None:
    for attr in sftp.listdir_attr(path):
        child = posixpath.join(path, attr.filename)
        if stat.S_ISDIR(attr.st_mode or 0):
            _remote_rmtree(sftp, child)
        else:
            sftp.remove(child)
    sftp.rmdir(path)


def upload(
    sftp: paramiko.SFTPClient,
    local_dir: Path,
    remote_dir: str,
    limits: Limits,
    last: Sequence[str] = (),
) -> int:
    """Copy `local_dir` to the remote folder (which must not exist); the bytes copied."""
    if not local_dir.is_dir():
        raise GpuctlError(f"{local_dir} is not a folder")
    entries = local_walk(local_dir, limits)
    _check_budget(entries, limits, str(local_dir))
    remote_dir = remote_dir.rstrip("/") or remote_dir
    if _remote_exists(sftp, remote_dir):
        raise TreeExists(f"{limits.where}: {remote_dir} already exists")
    parent, name = posixpath.split(remote_dir)
    if parent:
        _remote_makedirs(sftp, parent)
    tmp = posixpath.join(parent, f".{name}.gpuctl-{secrets.token_hex(4)}")
    sftp.mkdir(tmp, mode=0o700)
    total = [0]
    try:
        for entry in ordered(entries, last):
            target = posixpath.join(tmp, entry.rel)
            if entry.is_dir:
                sftp.mkdir(target, mode=0o700)
                continue
            with open(local_dir / entry.rel, "rb") as src:
                _put(sftp, src, target, _guard(limits, total))
        if _remote_exists(sftp, remote_dir):
            raise TreeExists(f"{limits.where}: {remote_dir} already exists")
        sftp.rename(tmp, remote_dir)
    except BaseException:
        with contextlib.suppress(Exception):  # the channel may be gone (deadline)
            _remote_rmtree(sftp, tmp)
        raise
    return total[0]


def _put(
    sftp: paramiko.SFTPClient, src: BinaryIO, target: str, callback: Callable[[int, int], None]
) -> None:
    with sftp.open(target, "wb") as out:
        out.chmod(0o600)
        out.set_pipelined(True)
        done = 0
        while chunk := src.read(_CHUNK):
            out.write(chunk)
            done += len(chunk)
            callback(done, 0)


def translate(exc: BaseException, limits: Limits, what: str) -> BaseException:
    """A paramiko/OS error of a copy as a gpuctl error (a closed channel past the deadline is a
    timeout)."""
    if isinstance(exc, GpuctlError):
        return exc
    if time.monotonic() >= limits.deadline:
        return TransferTimeout(f"{limits.where}: timeout (transfer): {what} ran past its deadline")
    if isinstance(exc, FileNotFoundError) or getattr(exc, "errno", None) == errno.ENOENT:
        return GpuctlError(f"{limits.where}: {what}: not found ({exc})")
    if isinstance(exc, PermissionError):
        return GpuctlError(f"{limits.where}: {what}: permission denied ({exc})")
    return TransportError(f"{limits.where}: {what} failed: {exc or type(exc).__name__}")
