"""gpuctl's checkpoint contract, the job author's side: atomic save with a marker, load the latest.

Standard library only: a job imports this on a node where gpuctl's dependencies are not installed
(put the directory holding the `gpuctl` package on `sys.path`, or copy this one file).

    from gpuctl.checkpoint import Checkpointer

    ckpt = Checkpointer()            # GPUCTL_CHECKPOINT_DIR, GPUCTL_JOB_ID, GPUCTL_INCARNATION
    ckpt.install_signal_handlers()   # SIGUSR1: checkpoint now; SIGTERM: checkpoint and exit
    loaded = ckpt.latest()           # GPUCTL_RESUME_FROM when gpuctl chose one, else a scan
    step, state = (loaded.step, decode(loaded.read("state.bin"))) if loaded else (0, fresh())
    while step < total and not ckpt.stop_requested:
        step += 1
        state = train_one_step(state)
        if ckpt.should_checkpoint(step, every=100):
            ckpt.save(step, {"state.bin": encode(state)})
    ckpt.save(step, {"state.bin": encode(state)})  # done or SIGTERM: a no-op if already saved

Layout: `<dir>/step-00000123/` holds the files; `<dir>/step-00000123/COMMITTED`, written last and
atomically, holds `{"format": 1, "job_id", "incarnation", "step", "committed_at", "files":
{name: sha256}}`. A folder without a valid marker, or whose files do not match it, is never
loaded. See docs/checkpoints.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType

__all__ = [
    "MARKER_NAME",
    "CheckpointError",
    "Checkpointer",
    "Loaded",
    "StaleIncarnationError",
    "step_dir_name",
]

MARKER_NAME = "COMMITTED"
MARKER_FORMAT = 1
DEFAULT_KEEP = 3
_STEP_DIR = re.compile(r"^step-([0-9]{8,})$")
_TEMP_DIR = re.compile(r"^\.tmp-step-[0-9]+-(x|[0-9]+)-[0-9]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20

Writer = Callable[[Path], None]


class CheckpointError(Exception):
    """A checkpoint could not be saved as asked (a bad file name, a writer that wrote nothing)."""


class StaleIncarnationError(CheckpointError):
    """A newer incarnation of this job has committed checkpoints here: this copy is stale (gpuctl
    restarted the job elsewhere) and must stop instead of overwriting the newer copy's work."""


def step_dir_name(step: int) -> str:
    """`step-00000123`."""
    return f"step-{step:08d}"


def _step_of(name: str) -> int | None:
    found = _STEP_DIR.match(name)
    return int(found.group(1)) if found else None


def _warn(message: str) -> None:
    print(f"gpuctl.checkpoint: {message}", file=sys.stderr, flush=True)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        _warn(f"ignoring {name}={raw!r}: not a whole number")
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# Its own fsync and atomic-write code, not gpuctl.adapters.files: this module must stay
# self-contained (standard library only, copied alone onto job hosts).
def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_name(name: str) -> None:
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or any(part in ("", ".", "..") for part in parts)
        or any(ord(ch) < 32 or ch in "\\\x7f" for ch in name)
        or name == MARKER_NAME
    ):
        raise CheckpointError(
            f"bad checkpoint file name {name!r}: use a relative path inside the checkpoint "
            f"(no '..', no control characters, not {MARKER_NAME})"
        )


@dataclasses.dataclass(frozen=True)
class Marker:
    """A parsed `COMMITTED` marker."""

    job_id: str | None
    incarnation: int | None
    step: int
    committed_at: float
    files: Mapping[str, str]  # name -> sha256 hex


def read_marker(folder: Path) -> tuple[Marker | None, str | None]:
    """The marker of a checkpoint folder, or (None, why not)."""
    try:
        raw = (folder / MARKER_NAME).read_bytes()
    except FileNotFoundError:
        return None, "no marker (an interrupted save)"
    except OSError as exc:
        return None, f"unreadable marker ({exc.strerror})"
    try:
        data = json.loads(raw)
    except ValueError:
        return None, "unreadable marker: not JSON"
    if not isinstance(data, dict):
        return None, "unreadable marker: not a JSON object"
    step, inc, at, files = (data.get(k) for k in ("step", "incarnation", "committed_at", "files"))
    job_id = data.get("job_id")
    job_id = None if job_id == "" else job_id  # a shell writer without GPUCTL_JOB_ID
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None, "unreadable marker: no step"
    if inc is not None and (not isinstance(inc, int) or isinstance(inc, bool)):
        return None, "unreadable marker: incarnation is not a number"
    if not isinstance(at, int | float) or isinstance(at, bool):
        return None, "unreadable marker: no committed_at"
    if job_id is not None and not isinstance(job_id, str):
        return None, "unreadable marker: job_id is not a string"
    if not isinstance(files, dict) or not files:
        return None, "unreadable marker: no files"
    for name, digest in files.items():
        try:
            _check_name(name)
        except CheckpointError:
            return None, f"unreadable marker: bad file name {name!r}"
        if not isinstance(digest, str) or not _SHA256.match(digest):
            return None, f"unreadable marker: bad sha256 for {name!r}"
    return Marker(job_id, inc, step, float(at), dict(files)), None


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A committed, verified checkpoint."""

    path: Path
    step: int
    incarnation: int | None
    job_id: str | None
    committed_at: float
    files: Mapping[str, str]  # name -> sha256 hex

    def file(self, name: str) -> Path:
        """The path of one of its files (to hand to a framework's own loader)."""
        if name not in self.files:
            raise KeyError(f"{self.path.name} has no file {name!r} (it has {sorted(self.files)})")
        return self.path / name

    def read(self, name: str) -> bytes:
        """The bytes of one of its files."""
        return self.file(name).read_bytes()


class Checkpointer:
    """Saves and loads checkpoints under `dir` (default `$GPUCTL_CHECKPOINT_DIR`).

    `job_id` and `incarnation` default to `$GPUCTL_JOB_ID` and `$GPUCTL_INCARNATION` and are
    written into each marker; `resume_from` defaults to `$GPUCTL_RESUME_FROM` (the checkpoint
    gpuctl chose; empty means gpuctl chose a fresh start; unset means "scan `dir`"). `keep` is how
    many committed checkpoints of this job to keep.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,
        *,
        job_id: str | None = None,
        incarnation: int | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        keep: int = DEFAULT_KEEP,
        every: int | None = None,
    ) -> None:
        raw_dir = dir if dir is not None else os.environ.get("GPUCTL_CHECKPOINT_DIR", "")
        if not str(raw_dir):
            raise CheckpointError(
                "no checkpoint directory: pass dir= or set GPUCTL_CHECKPOINT_DIR "
                "(gpuctl sets it from the job spec's checkpoint.dir)"
            )
        if keep < 1:
            raise CheckpointError(f"keep must be 1 or more, not {keep}")
        self.dir = Path(raw_dir)
        self.job_id = job_id if job_id is not None else (os.environ.get("GPUCTL_JOB_ID") or None)
        self.incarnation = (
            incarnation if incarnation is not None else _env_int("GPUCTL_INCARNATION")
        )
        self.resume_from: Path | None
        self.fresh_start = False  # gpuctl said so: GPUCTL_RESUME_FROM set and empty
        if resume_from is not None:
            self.resume_from = Path(resume_from) if str(resume_from) else None
            self.fresh_start = not str(resume_from)
        elif "GPUCTL_RESUME_FROM" in os.environ:
            raw = os.environ["GPUCTL_RESUME_FROM"].strip()
            self.resume_from = Path(raw) if raw else None
            self.fresh_start = not raw
        else:
            self.resume_from = None
        self.keep = keep
        self.every = every
        self.checkpoint_requested = False  # SIGUSR1
        self.stop_requested = False  # SIGTERM
        self._protected: Path | None = None  # the checkpoint resumed from: kept until a newer one

    # --- signals ---------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGUSR1 sets `checkpoint_requested`; SIGTERM sets `stop_requested` (checkpoint, then
        exit 0 before the grace period ends, when gpuctl kills the process group). Call it from
        the main thread."""

        def on_usr1(signum: int, frame: FrameType | None) -> None:
            self.checkpoint_requested = True

        def on_term(signum: int, frame: FrameType | None) -> None:
            self.stop_requested = True

        signal.signal(signal.SIGUSR1, on_usr1)
        signal.signal(signal.SIGTERM, on_term)

    def should_checkpoint(self, step: int, every: int | None = None) -> bool:
        """True when a checkpoint is due at `step`: every `every` steps (default: the
        constructor's `every`), when SIGUSR1 asked for one, or when SIGTERM asked to stop."""
        every = every if every is not None else self.every
        periodic = every is not None and every > 0 and step % every == 0
        return periodic or self.checkpoint_requested or self.stop_requested

    # --- save ------------------------------------------------------------------------------------

    def save(self, step: int, files: Mapping[str, bytes] | Writer) -> Path:
        """Commit the checkpoint of `step` and return its folder.

        `files` maps names (relative paths) to bytes, or is a callback that writes the files into
        the folder it is given. The files go into a temporary folder, are fsynced, the folder is
        renamed into place as `step-<step:08d>`, and the marker is written last, atomically (temp,
        fsync, rename, fsync the folder). Then only the newest `keep` checkpoints are kept (never
        the one this run resumed from before a newer one is committed). Raises
        `StaleIncarnationError` when a newer incarnation of this job has committed here, and
        `CheckpointError` rather than overwrite another job's committed checkpoint.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"a checkpoint step is a whole number, 0 or more, not {step!r}")
        self.dir.mkdir(parents=True, exist_ok=True)
        markers = dict(self._markers())
        self._refuse_if_stale(markers)
        final = self.dir / step_dir_name(step)
        existing = markers.get(final.name)
        ours = existing is not None and (self._is_ours(existing) or final == self._protected)
        if existing is not None and ours and self._files_match(final, existing):
            # Already committed by this lineage at this step (e.g. SIGTERM right after a
            # periodic save): the state at a step is the state; keep the committed copy.
            self.checkpoint_requested = False
            return final
        if existing is not None and not self._same_job(existing):
            raise CheckpointError(
                f"{final} is a committed checkpoint of another job ({existing.job_id}): give "
                "each job its own checkpoint dir (checkpoint.dir: /path/{job_id} in the job spec)"
            )
        inc_tag = "x" if self.incarnation is None else str(self.incarnation)
        temp = self.dir / f".tmp-step-{step}-{inc_tag}-{os.getpid()}"
        if temp.exists():
            shutil.rmtree(temp)
        temp.mkdir()
        try:
            manifest = self._write_files(temp, files)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        _fsync_dir(temp)
        if final.exists():
            # An uncommitted leftover, a corrupt copy, or another incarnation's: set it aside.
            aside = self.dir / f".old-{final.name}-{os.getpid()}"
            if aside.exists():
                shutil.rmtree(aside)
            final.rename(aside)
            temp.rename(final)
            _fsync_dir(self.dir)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            temp.rename(final)
            _fsync_dir(self.dir)
        self._write_marker(final, step, manifest)
        self.checkpoint_requested = False
        self._prune(step)
        return final

    def _write_files(self, temp: Path, files: Mapping[str, bytes] | Writer) -> dict[str, str]:
        if callable(files):
            files(temp)
            manifest: dict[str, str] = {}
            for path in sorted(temp.rglob("*")):
                name = path.relative_to(temp).as_posix()
                if path.is_symlink():
                    raise CheckpointError(f"checkpoint file {name!r} is a symlink: write the data")
                if path.is_dir():
                    _fsync_dir(path)
                    continue
                _check_name(name)
                _fsync_file(path)
                manifest[name] = _sha256(path)
            if not manifest:
                raise CheckpointError("the checkpoint writer wrote no files")
            return manifest
        if not files:
            raise CheckpointError("a checkpoint needs at least one file")
        manifest = {}
        for name, data in files.items():
            _check_name(name)
            target = temp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            manifest[name] = hashlib.sha256(data).hexdigest()
        for sub in sorted({(temp / n).parent for n in files}, reverse=True):
            if sub != temp:
                _fsync_dir(sub)
        return manifest

    def _write_marker(self, final: Path, step: int, manifest: Mapping[str, str]) -> None:
        body = {
            "format": MARKER_FORMAT,
            "job_id": self.job_id,
            "incarnation": self.incarnation,
            "step": step,
            "committed_at": time.time(),
            "files": dict(sorted(manifest.items())),
        }
        temp = final / f".{MARKER_NAME}.tmp"
        with open(temp, "w", encoding="utf-8") as fh:
            json.dump(body, fh, indent=1)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        temp.rename(final / MARKER_NAME)
        _fsync_dir(final)

    # --- load ------------------------------------------------------------------------------------

    def latest(self) -> Loaded | None:
        """The checkpoint to resume from: the one gpuctl chose (`GPUCTL_RESUME_FROM`) when it
        verifies, else the newest committed, verified one. A folder without a valid marker or with
        a file that does not match its checksum is skipped, with a line on stderr naming it.

        When gpuctl chose a fresh start (`GPUCTL_RESUME_FROM` set and empty), returns None.
        """
        if self.fresh_start:
            others = sum(1 for _, m in self._markers() if self._same_job(m))
            if others:
                _warn(
                    f"GPUCTL_RESUME_FROM is empty: gpuctl chose a fresh start; not resuming from "
                    f"the {others} committed checkpoint(s) in {self.dir}"
                )
            return None
        if self.resume_from is not None:
            chosen = self.resume_from
            loaded, problem = self._verify(chosen)
            if loaded is not None:
                self._protected = loaded.path
                return loaded
            _warn(
                f"refusing GPUCTL_RESUME_FROM={chosen}: {problem}; "
                "falling back to the newest valid older checkpoint"
            )
            below = _step_of(chosen.name)
            found = self._scan(below)
        else:
            found = self._scan(None)
        if found is not None:
            self._protected = found.path
        return found

    def _scan(self, below: int | None) -> Loaded | None:
        """The newest verified checkpoint under `dir` (with a step under `below`, when given)."""
        candidates = []
        if self.dir.is_dir():
            for entry in self.dir.iterdir():
                step = _step_of(entry.name)
                if step is not None and entry.is_dir() and (below is None or step < below):
                    candidates.append((step, entry))
        for _, folder in sorted(candidates, reverse=True):
            loaded, problem = self._verify(folder)
            if loaded is not None:
                return loaded
            if problem is not None:
                _warn(f"skipping {folder}: {problem}")
        return None

    def _verify(self, folder: Path) -> tuple[Loaded | None, str | None]:
        """(the checkpoint, None) when `folder` is committed and intact, else (None, why not).
        Another job's checkpoint is not an error but is skipped: (None, None)."""
        if not folder.is_dir():
            return None, "no such checkpoint folder"
        marker, problem = read_marker(folder)
        if marker is None:
            return None, problem
        folder_step = _step_of(folder.name)
        if folder_step is not None and folder_step != marker.step:
            return None, f"its marker names step {marker.step}, the folder step {folder_step}"
        if self.job_id is not None and marker.job_id is not None and marker.job_id != self.job_id:
            if self.resume_from is not None and folder == self.resume_from:
                return None, f"a checkpoint of another job ({marker.job_id})"
            return None, None
        if (
            self.incarnation is not None
            and marker.incarnation is not None
            and marker.incarnation > self.incarnation
        ):
            return None, (
                f"written by a newer incarnation ({marker.incarnation}) than this one "
                f"({self.incarnation})"
            )
        for name, digest in sorted(marker.files.items()):
            path = folder / name
            try:
                actual = _sha256(path)
            except FileNotFoundError:
                return None, f"missing file: {name}"
            except OSError as exc:
                return None, f"unreadable file: {name} ({exc.strerror})"
            if actual != digest:
                return None, f"checksum mismatch: {name}"
        loaded = Loaded(
            path=folder,
            step=marker.step,
            incarnation=marker.incarnation,
            job_id=marker.job_id,
            committed_at=marker.committed_at,
            files=marker.files,
        )
        return loaded, None

    # --- housekeeping ----------------------------------------------------------------------------

    def _markers(self) -> Iterator[tuple[str, Marker]]:
        """(folder name, marker) of every committed-looking folder (markers read, not verified)."""
        if not self.dir.is_dir():
            return
        for entry in self.dir.iterdir():
            if _step_of(entry.name) is None or not entry.is_dir():
                continue
            marker, _ = read_marker(entry)
            if marker is not None:
                yield entry.name, marker

    def _same_job(self, marker: Marker) -> bool:
        return self.job_id is None or marker.job_id is None or marker.job_id == self.job_id

    def _is_ours(self, marker: Marker) -> bool:
        """Committed by this incarnation of this job."""
        return self._same_job(marker) and marker.incarnation == self.incarnation

    def _files_match(self, folder: Path, marker: Marker) -> bool:
        try:
            return all(_sha256(folder / n) == d for n, d in marker.files.items())
        except OSError:
            return False

    def _refuse_if_stale(self, markers: Mapping[str, Marker]) -> None:
        if self.incarnation is None:
            return
        newer = sorted(
            (m.incarnation, name)
            for name, m in markers.items()
            if self._same_job(m) and m.incarnation is not None and m.incarnation > self.incarnation
        )
        if newer:
            inc, name = newer[-1]
            raise StaleIncarnationError(
                f"incarnation {inc} of this job committed {self.dir / name}: this copy "
                f"(incarnation {self.incarnation}) is stale and must stop"
            )

    def _prune(self, committed_step: int) -> None:
        """Keep the newest `keep` checkpoints of this job; drop uncommitted leftovers and older
        incarnations' checkpoints past the step just committed (an abandoned timeline)."""
        ours: list[tuple[int, str]] = []
        drop: list[str] = []
        for name, marker in self._markers():
            if not self._same_job(marker):
                continue
            newer_inc = (
                self.incarnation is not None
                and marker.incarnation is not None
                and marker.incarnation > self.incarnation
            )
            if newer_inc:
                continue
            older_inc = (
                self.incarnation is not None
                and marker.incarnation is not None
                and marker.incarnation < self.incarnation
            )
            if older_inc and marker.step > committed_step:
                drop.append(name)
            else:
                ours.append((marker.step, name))
        ours.sort(reverse=True)
        drop.extend(name for _, name in ours[self.keep :])
        for entry in self.dir.iterdir():
            step = _step_of(entry.name)
            if step is not None and step < committed_step and not (entry / MARKER_NAME).exists():
                drop.append(entry.name)  # an interrupted save, superseded
            if entry.name.startswith(".old-step-"):
                drop.append(entry.name)  # set aside by a save that was then interrupted
            temp = _TEMP_DIR.match(entry.name)
            inc = temp.group(1) if temp else "x"
            if self.incarnation is not None and inc != "x" and int(inc) < self.incarnation:
                drop.append(entry.name)  # an older incarnation's interrupted save
        protected = self._protected
        protected_step = _step_of(protected.name) if protected is not None else None
        if protected_step is not None and protected_step >= committed_step:
            drop = [n for n in drop if self.dir / n != protected]
        for name in sorted(set(drop)):
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self.dir / name)
