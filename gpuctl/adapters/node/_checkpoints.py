"""Remote `sh` scripts that list a job's checkpoint folders on a node and hash the files their
markers name, the parsers of what they print, and the verdict on each folder from both (`verify`).
PURE: no I/O; `gpuctl.adapters.node` sends these over a `Transport` (two execs per look: one lists
the markers, one hashes the files they name). The checkpoint dir's layout and the marker's format
are `gpuctl.core.jobs.checkpoints`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import posixpath
import re
from collections.abc import Mapping, Sequence

from gpuctl.adapters.node._script import (
    TILDE_FUNCTION,
    RemoteCommand,
    check_text,
    marked_lines,
    sh_command,
)
from gpuctl.core.jobs import checkpoints
from gpuctl.core.jobs.model import CheckpointMarker
from gpuctl.errors import UsageError

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MARKER_NAME = checkpoints.MARKER_NAME
MAX_MARKER_BYTES = checkpoints.MAX_MARKER_BYTES
MAX_MANIFEST_FILES = 4096

# Positional parameters: DIR MAX. Prints the newest MAX step folders (by step number), each with
# its marker base64-encoded on one line when the marker is there and small enough.
_LIST_CHECKPOINTS = (
    TILDE_FUNCTION
    + r"""
d=$1; gpuctl_tilde d
cd "$d" 2>/dev/null || { echo "gpuctl-ckpt nodir"; exit 0; }
for s in step-*; do
  case $s in step- | step-*[!0-9]*) continue ;; esac
  [ -d "$s" ] && printf '%s\n' "$s"
done | sort -t- -k2,2n | tail -n "$2" | while IFS= read -r s; do
  m="$s/COMMITTED"
  # a folder removed while it is listed (the job pruned an old checkpoint) is not listed
  if [ ! -f "$m" ]; then [ -d "$s" ] && echo "gpuctl-ckpt none $s"; continue; fi
  z=$(wc -c <"$m" 2>/dev/null) || continue
  if [ "$z" -gt __MAX__ ]; then echo "gpuctl-ckpt big $s"; continue; fi
  b=$(base64 <"$m" 2>/dev/null) || continue
  printf 'gpuctl-ckpt marker %s %s\n' "$s" "$(printf '%s' "$b" | tr -d '\n')"
done
""".replace("__MAX__", str(MAX_MARKER_BYTES))
)

# Positional parameters: DIR. stdin: pairs of lines (index, path relative to DIR).
_HASH = (
    TILDE_FUNCTION
    + r"""
d=$1; gpuctl_tilde d
cd "$d" 2>/dev/null || { echo "gpuctl-ckpt nodir"; exit 0; }
while IFS= read -r i && IFS= read -r f; do
  if [ -f "$f" ] && h=$(sha256sum <"$f" 2>/dev/null); then
    echo "gpuctl-sum $i ${h%% *}"
  else
    echo "gpuctl-sum $i missing"
  fi
done
"""
)


@dataclasses.dataclass(frozen=True, slots=True)
class Listed:
    """One step folder as listed on the node: its marker's bytes (None: no marker, or `problem`)
    and the marker's fields as `gpuctl.core.jobs.checkpoints.parse_marker` reads them."""

    name: str
    step: int
    marker: bytes | None
    fields: checkpoints.MarkerFields | None
    problem: str | None = None


def list_checkpoints_command(checkpoint_dir: str, max_count: int) -> RemoteCommand:
    check_text("checkpoint dir", checkpoint_dir)
    if not checkpoint_dir:
        raise UsageError("checkpoint dir is empty")
    args = [checkpoint_dir, str(max(1, int(max_count)))]
    return RemoteCommand(sh_command(_LIST_CHECKPOINTS, "gpuctl-checkpoints", args))


def parse_checkpoint_listing(stdout: bytes) -> list[Listed] | None:
    """The listed step folders, newest first, or None when the checkpoint dir does not exist."""
    out = []
    for fields in marked_lines(stdout, "gpuctl-ckpt"):
        if fields == ["nodir"]:
            return None
        if len(fields) < 2:
            continue
        name = fields[1]
        step = checkpoints.step_of_dir(name)
        if step is None or "/" in name:
            continue
        if fields[0] == "none":
            out.append(Listed(name, step, None, None))
        elif fields[0] == "big":
            out.append(Listed(name, step, None, None, "unreadable marker: too large"))
        elif fields[0] == "marker" and len(fields) == 3 and fields[2]:
            try:
                raw = base64.b64decode(fields[2], validate=True)
            except (ValueError, binascii.Error):
                out.append(Listed(name, step, None, None, "unreadable marker: garbled listing"))
                continue
            out.append(Listed(name, step, raw, checkpoints.parse_marker(raw)))
    return sorted(out, key=lambda c: c.step, reverse=True)


def hash_command(checkpoint_dir: str, listed: Sequence[Listed]) -> RemoteCommand:
    """sha256 of every file the listed markers name, computed on the node; the paths travel on
    stdin (no length limit of a command line, no quoting)."""
    lines = []
    for ci, item in enumerate(listed):
        if item.fields is None or not item.fields.ok:
            continue
        for fi, (name, _digest) in enumerate(item.fields.files):
            if checkpoints.valid_file_name(name):
                lines += [f"{ci}.{fi}", f"{item.name}/{name}"]
    stdin = ("\n".join(lines) + "\n").encode("utf-8") if lines else b""
    return RemoteCommand(sh_command(_HASH, "gpuctl-verify", [checkpoint_dir]), stdin)


def parse_hashes(stdout: bytes) -> dict[str, str]:
    """index -> sha256 (or "missing")."""
    out = {}
    for fields in marked_lines(stdout, "gpuctl-sum"):
        if len(fields) == 2 and (fields[1] == "missing" or SHA256_RE.fullmatch(fields[1])):
            out[fields[0]] = fields[1]
    return out


def verify(
    checkpoint_dir: str, listed: Sequence[Listed], sums: Mapping[str, str]
) -> list[CheckpointMarker]:
    """Listed folders and their on-node checksums -> markers (`judge_checkpoint`), newest first."""
    out = []
    for ci, item in enumerate(listed):
        path = posixpath.join(checkpoint_dir, item.name)
        if item.problem is not None:
            out.append(CheckpointMarker(path, None, item.step, None, False, item.problem))
            continue
        actual: dict[str, str | None] = {}
        if item.fields is not None:
            for fi, (name, _digest) in enumerate(item.fields.files):
                got = sums.get(f"{ci}.{fi}")
                actual[name] = None if got in (None, "missing") else got
        out.append(checkpoints.judge_checkpoint(path, item.marker, actual))
    return out
