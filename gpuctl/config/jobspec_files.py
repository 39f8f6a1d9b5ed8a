"""Reading job spec files (`config.jobspec` holds the schema) into `LoadedSpec`s or requests.

Every problem is one `JobSpecError` naming the file, the line and the field. `load_specs` keeps
the validated `JobSpec`s (with `workdir`, `checkpoint.dir` and secret files resolved against the
spec file's folder), checks what one field's validator cannot see (names unique across all the
files, a command for `gpuctl submit`, a secret listed twice or also in env); `load_job_specs`
gives the placement requests.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuctl.config.document import Document
from gpuctl.config.jobspec import JobListFile, JobSpec, to_request
from gpuctl.config.loader import load_document, validate_data
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import JobSpecError

KIND = "job spec"


@dataclasses.dataclass(frozen=True, slots=True)
class LoadedSpec:
    """A validated job spec and where it was written (`path:line`)."""

    spec: JobSpec
    source: str


def load_job_specs(paths: Sequence[Path]) -> tuple[JobRequest, ...]:
    """Read job spec files, in order, into placement requests (`gpuctl place`)."""
    return tuple(to_request(loaded.spec) for loaded in load_specs(paths))


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
            out.append(LoadedSpec(_resolved(spec, path), doc.where(loc)))
    return tuple(out)


def _check(doc: Document, loc: tuple[str | int, ...], spec: JobSpec, need_command: bool) -> None:
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


def _resolved(spec: JobSpec, path: Path) -> JobSpec:
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


def _specs(doc: Document) -> list[tuple[tuple[str | int, ...], JobSpec]]:
    if "jobs" in doc.data:
        listed = validate_data(
            doc.data, JobListFile, path=doc.path, lines=doc.lines, error=JobSpecError
        )
        return [(("jobs", i), spec) for i, spec in enumerate(listed.jobs)]
    spec = validate_data(doc.data, JobSpec, path=doc.path, lines=doc.lines, error=JobSpecError)
    return [((), spec)]
