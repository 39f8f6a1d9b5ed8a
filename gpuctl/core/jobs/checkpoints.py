"""Which checkpoint a job resumes from, and what a checkpoint marker says. Pure: no I/O, no clock.

The checkpoint layout is the job author's side of the contract (`gpuctl.checkpoint`,
docs/checkpoints.md): `<checkpoint_dir>/step-<00000123>/` holds the files and, written last and
atomically, the marker `COMMITTED`, a JSON object::

    {"format": 1, "job_id": "train-demo-1a2b3c", "incarnation": 2, "step": 123,
     "committed_at": 1717171717.5, "files": {"state.json": "<sha256 hex>"}}

`parse_marker` reads a marker's text into fields (never raises), `judge_checkpoint` turns a
folder's marker and the checksums found on the node into a `CheckpointMarker`, and
`choose_resume` picks the newest committed, verified, non-stale checkpoint for the next
incarnation, with a warning for every newer one it had to skip. When it finds none,
`unusable_committed` says whether the job had committed checkpoints all the same (every one now
unusable: a person decides, gpuctl does not start it fresh) and why each is refused.

`gpuctl.checkpoint` (stdlib only, importable without gpuctl's dependencies) writes this format on
its own; tests hold the two to the same format.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from gpuctl.core.jobs.model import Checkpoint, CheckpointMarker, Incarnation, IncarnationState

MARKER_NAME = "COMMITTED"
MARKER_FORMAT = 1
MAX_MARKER_BYTES = 1 << 20
STEP_DIR_PREFIX = "step-"
ANOTHER_JOB = "marker of another job"
CLOCK_IN_SYNC_S = 5.0  # node clock offsets up to this are measurement error, not skew
_STEP_DIR = re.compile(r"^step-([0-9]{8,})$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BAD_NAME_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


def step_dir_name(step: int) -> str:
    """`step-00000123`: the folder of the checkpoint at `step` (zero-padded to 8 digits)."""
    if step < 0:
        raise ValueError(f"a checkpoint step is 0 or more, not {step}")
    return f"{STEP_DIR_PREFIX}{step:08d}"


def step_of_dir(name: str) -> int | None:
    """The step a checkpoint folder's name stands for (`step-00000123` -> 123), else None."""
    found = _STEP_DIR.match(PurePosixPath(name).name)
    return int(found.group(1)) if found else None


def valid_file_name(name: str) -> bool:
    """A manifest entry: a relative POSIX path inside the folder, no `..`, no control characters,
    not the marker itself (so a hostile marker cannot make a checker read outside the folder)."""
    if not name or len(name) > 1024 or name.startswith("/") or _BAD_NAME_CHARS.search(name):
        return False
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return False
    return name != MARKER_NAME


@dataclasses.dataclass(frozen=True, slots=True)
class MarkerFields:
    """A marker as read. `problem` is None when it is well-formed; the fields are then all set."""

    job_id: str | None
    incarnation: int | None
    step: int | None
    committed_at: float | None
    files: tuple[tuple[str, str], ...]  # (name, sha256 hex), sorted by name
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def _broken(problem: str) -> MarkerFields:
    return MarkerFields(None, None, None, None, (), problem)


def _int_field(data: Mapping[str, object], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_marker(text: str | bytes) -> MarkerFields:
    """The fields of a `COMMITTED` marker; a malformed one gives `problem` ("unreadable marker:
    ..."), never an exception. Unknown keys are ignored (a later format may add some)."""
    if len(text) > MAX_MARKER_BYTES:
        return _broken(f"unreadable marker: larger than {MAX_MARKER_BYTES} bytes")
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        return _broken(f"unreadable marker: not JSON ({type(exc).__name__})")
    if not isinstance(data, dict):
        return _broken("unreadable marker: not a JSON object")
    fmt = data.get("format", MARKER_FORMAT)
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt > MARKER_FORMAT:
        return _broken(f"unreadable marker: format {fmt!r} is newer than this gpuctl understands")
    job_id = data.get("job_id")
    job_id = None if job_id == "" else job_id  # a shell writer without GPUCTL_JOB_ID
    if job_id is not None and not isinstance(job_id, str):
        return _broken("unreadable marker: job_id is not a string")
    incarnation = _int_field(data, "incarnation")
    if data.get("incarnation") is not None and incarnation is None:
        return _broken("unreadable marker: incarnation is not a whole number")
    step = _int_field(data, "step")
    if step is None:
        return _broken("unreadable marker: step is missing or not a whole number")
    committed_at = data.get("committed_at")
    if (
        not isinstance(committed_at, int | float)
        or isinstance(committed_at, bool)
        or not math.isfinite(committed_at)
    ):
        return _broken("unreadable marker: committed_at is missing or not a time")
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        return _broken("unreadable marker: files (name -> sha256) is missing or empty")
    entries: list[tuple[str, str]] = []
    for name, digest in files.items():
        if not valid_file_name(name):
            return _broken(f"unreadable marker: bad file name {name!r}")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            return _broken(f"unreadable marker: bad sha256 for {name!r}")
        entries.append((name, digest))
    return MarkerFields(job_id, incarnation, step, float(committed_at), tuple(sorted(entries)))


def judge_checkpoint(
    path: str,
    marker_text: str | bytes | None,
    actual_sha256: Mapping[str, str | None],
    *,
    job_id: str | None = None,
) -> CheckpointMarker:
    """A checkpoint folder as found: its marker's text (None: no marker) and the sha256 of each
    file the marker lists as computed where it lies (None: missing or unreadable). Valid only when
    the marker parses, names this folder's step (and `job_id`, when given) and every file matches.
    """
    if marker_text is None:
        return CheckpointMarker(path, None, step_of_dir(path), None, False, "no marker")
    fields = parse_marker(marker_text)
    if fields.problem is not None:
        return CheckpointMarker(path, None, step_of_dir(path), None, False, fields.problem)

    def invalid(problem: str) -> CheckpointMarker:
        return CheckpointMarker(
            path, fields.incarnation, fields.step, fields.committed_at, False, problem
        )

    folder_step = step_of_dir(path)
    if folder_step is not None and folder_step != fields.step:
        return invalid(f"marker names step {fields.step}, the folder step {folder_step}")
    if job_id is not None and fields.job_id is not None and fields.job_id != job_id:
        return invalid(f"{ANOTHER_JOB} ({fields.job_id})")
    for name, digest in fields.files:
        actual = actual_sha256.get(name)
        if actual is None:
            return invalid(f"missing file: {name}")
        if actual.lower() != digest:
            return invalid(f"checksum mismatch: {name}")
    return CheckpointMarker(path, fields.incarnation, fields.step, fields.committed_at, True, None)


def _rank(marker: CheckpointMarker) -> tuple[int, int, str]:
    step = marker.step if marker.step is not None else step_of_dir(marker.path)
    return (
        step if step is not None else -1,
        marker.incarnation if marker.incarnation is not None else -1,
        marker.path,
    )


def clock_correction_s(inc: Incarnation) -> float:
    """What to take off a commit time stamped on `inc`'s node to read it on gpuctl's clock: the
    node's clock offset measured when it was launched, when it is larger than the measurement's
    own error (the node's clock is read in whole seconds, during a probe that takes a moment);
    0 for a node in sync or not measured."""
    offset = inc.clock_offset_s
    if offset is None or abs(offset) <= CLOCK_IN_SYNC_S:
        return 0.0
    return offset


def _why_not(
    marker: CheckpointMarker, by_n: Mapping[int, Incarnation], next_incarnation: int
) -> str | None:
    """Why `marker` may not be resumed from, or None when it may."""
    if not marker.valid:
        return marker.problem or "not committed"
    return _not_its(marker, by_n, next_incarnation)


def _not_its(
    marker: CheckpointMarker, by_n: Mapping[int, Incarnation], next_incarnation: int
) -> str | None:
    """Why `marker` (valid or not) is not one an older incarnation of this job committed while
    it ran, or None when it is."""
    if marker.incarnation is None:
        return "its marker names no incarnation"
    if marker.step is None or marker.committed_at is None:
        return "its marker names no step or commit time"
    if marker.incarnation >= next_incarnation:
        return f"not older than the incarnation being started ({next_incarnation})"
    inc = by_n.get(marker.incarnation)
    if inc is None:
        return "no such incarnation in this job's history (another job's checkpoint?)"
    committed_at = marker.committed_at - clock_correction_s(inc)  # on gpuctl's clock
    if committed_at < inc.started_at:
        return "committed before that incarnation started (another job's checkpoint?)"
    if inc.ended_at is not None and committed_at > inc.ended_at:
        if inc.state is IncarnationState.LOST:
            return "stale: committed after that incarnation was declared lost (a fenced copy)"
        return "stale: committed after that incarnation ended"
    return None


def choose_resume(
    markers: Sequence[CheckpointMarker],
    *,
    history: Sequence[Incarnation],
    next_incarnation: int,
) -> tuple[CheckpointMarker | None, list[str]]:
    """The checkpoint incarnation `next_incarnation` resumes from (None: a fresh start), and a
    warning for every newer checkpoint it skipped, newest first.

    Eligible: valid (marker present and parsable, every checksum matching), of an incarnation older
    than `next_incarnation` that is in `history` (every incarnation of this job), committed while
    that incarnation ran (not before it started, not after it ended or was declared lost: a fenced
    copy that kept writing is stale). The newest by step, then incarnation, wins. A marker's time
    is the node's clock; it is read on gpuctl's (the clock of `history`) through the incarnation's
    `clock_offset_s` (see `clock_correction_s`).
    """
    by_n = {inc.n: inc for inc in history}
    judged = [(marker, _why_not(marker, by_n, next_incarnation)) for marker in markers]
    eligible = [marker for marker, reason in judged if reason is None]
    chosen = max(eligible, key=_rank) if eligible else None
    floor = _rank(chosen) if chosen is not None else None
    warnings = []
    for marker, reason in sorted(judged, key=lambda pair: _rank(pair[0]), reverse=True):
        if reason is None or (floor is not None and _rank(marker) <= floor):
            continue
        name = PurePosixPath(marker.path).name or marker.path
        of = f" of incarnation {marker.incarnation}" if marker.incarnation is not None else ""
        warnings.append(f"skipping {name}{of}: {reason}")
    return chosen, warnings


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """A committed checkpoint of the job that cannot be resumed from, and why."""

    incarnation: int
    step: int
    why: str

    def __str__(self) -> str:
        return f"step {self.step} of incarnation {self.incarnation}: {self.why}"


def unusable_committed(
    markers: Sequence[CheckpointMarker],
    *,
    recorded: Sequence[Checkpoint],
    history: Sequence[Incarnation],
    next_incarnation: int,
) -> list[Refused]:
    """The job's committed checkpoints that incarnation `next_incarnation` cannot resume from,
    newest first. When `choose_resume` chose nothing and this is empty, the job never committed
    one (a fresh start is right); when it is not, starting fresh would throw that work away.

    Counted: every checkpoint of an older incarnation the store recorded (`recorded`; one whose
    marker is not among `markers` is "not found": pruned, deleted, or its storage not there), and
    every damaged marker that names an older incarnation of this job and a commit time while it
    ran (committed since the store last looked). Not counted: a folder without a marker (a write
    that never committed), a marker of another job, one a fenced copy wrote after its incarnation
    was lost.
    """
    by_n = {inc.n: inc for inc in history}
    found: dict[tuple[int, int], CheckpointMarker] = {}
    for marker in sorted(markers, key=lambda m: (not m.valid, m.path)):  # a good copy first
        if marker.incarnation is not None and marker.step is not None:
            found.setdefault((marker.incarnation, marker.step), marker)
    refused: dict[tuple[int, int], str] = {}
    for c in recorded:
        if c.incarnation >= next_incarnation:
            continue
        seen = found.get((c.incarnation, c.step))
        why = "not found" if seen is None else _why_not(seen, by_n, next_incarnation)
        if why is not None:
            refused[(c.incarnation, c.step)] = why
    for key, marker in found.items():
        if key in refused or marker.valid or marker.problem is None:
            continue
        if marker.problem.startswith(ANOTHER_JOB) or _not_its(marker, by_n, next_incarnation):
            continue
        refused[key] = marker.problem
    newest_first = sorted(refused.items(), key=lambda kv: (kv[0][1], kv[0][0]), reverse=True)
    return [Refused(n, step, why) for (n, step), why in newest_first]
