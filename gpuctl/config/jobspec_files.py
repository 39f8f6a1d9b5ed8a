"""Reading job spec files (`config.jobspec` holds the schema) into `LoadedSpec`s or requests.

Every problem is one `JobSpecError` naming the file, the line and the field. `load_specs` validates
each spec (with `workdir`, `checkpoint.dir` and secret files resolved against the spec file's
folder), checks what one field's validator cannot see (names unique across all the files, a command
for `gpuctl submit`, a secret listed twice or also in env, a launch command line too long for a
node to start) and gives the core's typed `JobSpec`s; `load_job_specs` gives placement requests.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuctl.config.document import Document
from gpuctl.config.jobspec import JobListFile, JobSpecModel, to_spec
from gpuctl.config.loader import load_document, validate_data
from gpuctl.core.jobs.spec import JOB_ID_PLACEHOLDER, JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import JobSpecError

KIND = "job spec"
# The launch command (adapters/node/_launch.py) carries the job's command, its plain env, workdir
# and checkpoint dir on the command line of one SSH exec request. sshd hands that line to the
# node's login shell as one argument, which Linux caps at 128 KiB (MAX_ARG_STRLEN); gpuctl's exec
# wrapper (adapters/exec_wrapper.py) quotes the command again and holds it twice, so on a lab node
# (OpenSSH 9.2) the largest launch command that starts is 65,476 bytes, and one of 128 KiB makes
# sshd drop the connection ("Bad packet length"). A spec's share is capped at 48 KiB, counted as
# it travels (`launch_bytes`), which leaves over 12 KiB for the launch script and the checkpoint
# contract's variables (about 4 KiB at most).
MAX_LAUNCH_BYTES = 48 * 1024
_JOB_ID_MAX = 64  # gpuctl's job ids: the name and a suffix, at most 64 characters
_CHECKPOINT_NAME_MAX = 255  # GPUCTL_RESUME_FROM is the checkpoint dir and one folder name


@dataclasses.dataclass(frozen=True, slots=True)
class LoadedSpec:
    """A validated job spec, typed (built once, here), and where it was written (`path:line`)."""

    spec: JobSpec
    source: str


def load_job_specs(paths: Sequence[Path]) -> tuple[JobRequest, ...]:
    """Read job spec files, in order, into placement requests (`gpuctl place`)."""
    return tuple(loaded.spec.request for loaded in load_specs(paths))


def load_specs(paths: Sequence[Path], *, require_command: bool = False) -> tuple[LoadedSpec, ...]:
    """Read job spec files, in order; names must be unique across all of them.

    Relative `workdir`, `checkpoint.dir` and secret files are resolved against the folder of the
    file that names them. `require_command`: every job must have a `command` (`gpuctl submit`).
    """
    if not paths:
        raise JobSpecError("no job spec file given")
    out: list[LoadedSpec] = []
    seen: dict[str, str] = {}
    for path in paths:
        doc = load_document(path, kind=KIND, error=JobSpecError)
        for loc, spec in _specs(doc):
            if spec.name in seen:
                raise doc.error(
                    (*loc, "name"),
                    f"job name {spec.name!r} is used twice (first at {seen[spec.name]})",
                    error=JobSpecError,
                )
            seen[spec.name] = doc.where((*loc, "name"))
            _check(doc, loc, spec, require_command)
            resolved = _resolved(spec, path)
            _check_launch_size(doc, loc, resolved)
            out.append(LoadedSpec(to_spec(resolved), doc.where(loc)))
    return tuple(out)


def launch_bytes(text: str) -> int:
    """The bytes `text` takes on the launch command line: UTF-8, quoted for the node's `sh` and
    quoted again for the login shell sshd starts (a `'` costs 17 bytes), and a separating space."""
    return len(shlex.quote(shlex.quote(text)).encode("utf-8")) + 1


def _launch_parts(spec: JobSpecModel) -> list[tuple[tuple[str | int, ...], int]]:
    """What the spec puts on the launch command line: (field, bytes), in the file's order."""
    parts: list[tuple[tuple[str | int, ...], int]] = [
        (("command", i), launch_bytes(arg)) for i, arg in enumerate(spec.command or ())
    ]
    parts += [(("env", name), launch_bytes(f"{name}={value}")) for name, value in spec.env.items()]
    if spec.workdir is not None:
        parts.append((("workdir",), launch_bytes(spec.workdir)))
    if spec.checkpoint.dir is not None:
        folder = spec.checkpoint.dir.replace(JOB_ID_PLACEHOLDER, "x" * _JOB_ID_MAX)
        # GPUCTL_CHECKPOINT_DIR, and GPUCTL_RESUME_FROM (a checkpoint folder in it)
        size = launch_bytes(folder) + launch_bytes(folder + "/" + "x" * _CHECKPOINT_NAME_MAX)
        parts.append((("checkpoint", "dir"), size))
    return parts


def _check_launch_size(doc: Document, loc: tuple[str | int, ...], spec: JobSpecModel) -> None:
    """A job whose launch command line is too long for sshd and the node's shell never starts:
    refused here, naming the largest part, rather than failing every launch until it is held."""
    parts = _launch_parts(spec)
    total = sum(size for _, size in parts)
    if total <= MAX_LAUNCH_BYTES:
        return
    field, size = max(parts, key=lambda part: part[1])
    raise doc.error(
        (*loc, *field),
        f"too long to launch: command, env, workdir and checkpoint.dir take {total:,} bytes of "
        f"the launch command line (this value {size:,}); the limit is {MAX_LAUNCH_BYTES:,}",
        hint="pass large data in a file the job reads (under workdir), not on its command line",
        error=JobSpecError,
    )


def _check(
    doc: Document, loc: tuple[str | int, ...], spec: JobSpecModel, need_command: bool
) -> None:
    """What one field's validator cannot see: a command for submit, names given twice."""
    if need_command and spec.command is None:
        raise doc.error(
            loc,
            "missing required key 'command' (the argv to run, e.g. [python, train.py])",
            hint="`gpuctl submit` runs the command; only `gpuctl place` works without one",
            error=JobSpecError,
        )
    if "secret_files" in _raw_at(doc.data, loc):
        raise doc.error(
            (*loc, "secret_files"),
            "unknown key 'secret_files'",
            hint="list files under secret_env: - NAME: {file: PATH}",
            error=JobSpecError,
        )
    secrets: dict[str, int] = {}
    for i, name in enumerate(spec.secret_env):
        if name in secrets:
            message = f"secret {name} is listed twice (first at secret_env[{secrets[name]}])"
            raise doc.error((*loc, "secret_env", i), message, error=JobSpecError)
        if name in spec.env:
            message = f"{name} is both in env and in secret_env: keep it in one"
            raise doc.error((*loc, "secret_env", i), message, error=JobSpecError)
        secrets[name] = i


def _raw_at(data: Any, loc: tuple[str | int, ...]) -> Any:
    for part in loc:
        data = data[part]
    return data


def _local(path: str, base: Path) -> str:
    """A path on this machine: `~` kept (expanded where it is used), relative made absolute."""
    if path.startswith("~") or Path(path).is_absolute():
        return path
    return os.path.normpath(base.absolute() / path)


def _resolved(spec: JobSpecModel, path: Path) -> JobSpecModel:
    base = path.parent
    changes: dict[str, Any] = {}
    if spec.workdir is not None:
        changes["workdir"] = _local(spec.workdir, base)
    if spec.checkpoint.dir is not None:
        ckpt = spec.checkpoint.model_copy(update={"dir": _local(spec.checkpoint.dir, base)})
        changes["checkpoint"] = ckpt
    if spec.secret_files:
        changes["secret_files"] = {k: _local(v, base) for k, v in spec.secret_files.items()}
    return spec.model_copy(update=changes) if changes else spec


def _specs(doc: Document) -> list[tuple[tuple[str | int, ...], JobSpecModel]]:
    if "jobs" in doc.data:
        listed = validate_data(
            doc.data, JobListFile, path=doc.path, lines=doc.lines, error=JobSpecError
        )
        return [(("jobs", i), spec) for i, spec in enumerate(listed.jobs)]
    spec = validate_data(doc.data, JobSpecModel, path=doc.path, lines=doc.lines, error=JobSpecError)
    return [((), spec)]
