"""Local files written whole or not at all.

`write_atomic` is the one way gpuctl replaces a file it owns (the state folder's health history,
playbook journals and store marker, the known_hosts file it records keys in, the lab fleet's
files): a temporary file beside the target, written and fsynced, renamed over the target, then
the folder fsynced. A crash or a full disk at any point leaves the old file whole or the new one,
never a part of either. Callers word the `OSError` it raises as their own error (naming the file).

The checkpoint helper (`gpuctl.checkpoint`) keeps its own copy: it is copied alone onto job hosts
and imports nothing of gpuctl.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

PRIVATE = 0o600  # the state folder's files (the folder itself is 0700)


def write_atomic(
    path: Path, data: str | bytes, *, mode: int = PRIVATE, keep_owner: bool = False
) -> None:
    """Replace `path` with `data` (text is UTF-8), mode `mode` whatever the umask.

    `keep_owner`: run as root, give the new file the replaced file's owner and group (the lab
    fleet's files stay its user's). On any failure the temporary file is removed and `path` is as
    it was; the `OSError` is raised."""
    body = data.encode("utf-8") if isinstance(data, str) else data
    owner: tuple[int, int] | None = None
    if keep_owner and os.geteuid() == 0:
        with contextlib.suppress(OSError):
            st = path.stat()
            owner = (st.st_uid, st.st_gid)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            if owner is not None:
                os.fchown(fh.fileno(), *owner)
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new name in `folder` survive a crash (fsync the folder itself)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
