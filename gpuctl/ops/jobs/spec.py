"""What the control loop makes of a stored job's spec (a typed `gpuctl.core.jobs.spec.JobSpec`,
built once at submit): the placement request, the allocation of a running incarnation, the launch
request, and the secret values (read from the environment or a file at every launch, never
stored).
"""

from __future__ import annotations

import dataclasses
import secrets as _random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from gpuctl.core.jobs.model import Incarnation, Job, LaunchRequest
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import Allocation, JobRequest
from gpuctl.errors import JobSpecError, StateError

MAX_SECRET_BYTES = 64 << 10
ID_MAX = 64


def new_job_id(name: str, token: Callable[[], str] | None = None) -> str:
    """`<name>-<6 hex>`; the name is shortened so the id stays within 64 characters."""
    suffix = (token or (lambda: _random.token_hex(3)))()
    return f"{name[: ID_MAX - len(suffix) - 1]}-{suffix}"


# --- secrets --------------------------------------------------------------------------------


def resolve_secrets(spec: JobSpec | Job, env: Mapping[str, str]) -> dict[str, str]:
    """The secret values a job needs: from `env` (a variable of the same name) or a file.

    Raises `JobSpecError` naming every missing secret (never a value). A file's value loses one
    trailing newline; `~` in a file path is the operator's home (`HOME` in `env`).
    """
    spec = spec.spec if isinstance(spec, Job) else spec
    values: dict[str, str] = {}
    problems: list[str] = []
    for name, file in ((s.name, s.file) for s in spec.secrets):
        if file is None:
            value = env.get(name)
            if value is None:
                problems.append(f"{name} is not set in the environment")
                continue
        else:
            value, problem = _read_secret_file(name, file, env)
            if problem is not None:
                problems.append(problem)
                continue
        if "\0" in value:
            problems.append(f"{name} holds a NUL character, which no environment can carry")
            continue
        values[name] = value
    if problems:
        raise JobSpecError("; ".join(problems), field="secret_env", hint=_secret_hint(spec))
    return values


def _read_secret_file(name: str, file: str, env: Mapping[str, str]) -> tuple[str, str | None]:
    path = Path(file)
    if file.startswith("~/") or file == "~":
        home = env.get("HOME") or str(Path.home())
        path = Path(home) / file[2:]
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        return "", f"{name}: cannot read {path}: {exc.strerror or type(exc).__name__}"
    if len(raw) > MAX_SECRET_BYTES:
        return "", f"{name}: {path} is larger than {MAX_SECRET_BYTES >> 10} KiB"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "", f"{name}: {path} is not UTF-8 text"
    return text.removesuffix("\n").removesuffix("\r"), None


def _secret_hint(spec: JobSpec) -> str:
    from_env = [s.name for s in spec.secrets if s.file is None]
    if from_env:
        return (
            f"export {from_env[0]} in the shell that runs gpuctl (submit checks it; "
            "`gpuctl reconcile` reads it again at every launch)"
        )
    return "check the files named under secret_env"


# --- what the control loop needs ----------------------------------------------------------------


def ids_by_name(jobs: Iterable[Job]) -> dict[str, list[str]]:
    """Active jobs' ids by name, to turn `avoid_jobs` names into the ids placement keys on."""
    out: dict[str, list[str]] = {}
    for j in jobs:
        if not j.state.terminal:
            out.setdefault(j.name, []).append(j.id)
    return out


def _avoid(names: Sequence[str], ids: Mapping[str, Sequence[str]] | None) -> tuple[str, ...]:
    if ids is None:
        return tuple(names)
    return tuple(sorted({i for name in names for i in ids.get(name, ())}))


def job_request(job: Job, ids: Mapping[str, Sequence[str]] | None = None) -> JobRequest:
    """The placement request, named by the job's id (names repeat over time, ids never).
    With `ids` (from `ids_by_name`), `avoid_jobs` names become the ids of those jobs."""
    req = job.spec.request
    if not req.avoid_jobs:
        return dataclasses.replace(req, name=job.id)
    return dataclasses.replace(req, name=job.id, avoid_jobs=_avoid(req.avoid_jobs, ids))


def allocation(
    job: Job, inc: Incarnation, ids: Mapping[str, Sequence[str]] | None = None
) -> Allocation:
    """What an incarnation holding cards means to placement, keyed like `job_request`."""
    req = job_request(job, ids)
    return Allocation(
        job=job.id,
        node=inc.node,
        cards=inc.cards,
        mib_per_card=inc.mib_per_card,
        whole=inc.whole,
        cpu_milli=inc.cpu_milli,
        host_mem_mib=inc.host_mem_mib,
        tier=req.tier,
        group=req.group,
        avoid_jobs=req.avoid_jobs,
        avoid_groups=req.avoid_groups,
    )


def launch_request(
    job: Job,
    incarnation: int,
    cards: Sequence[int],
    gpu_uuids: Sequence[str],
    mib_per_card: int,
    resume_from: str,
    secrets: Mapping[str, str],
    *,
    mps_limit_mib: int | None = None,
) -> LaunchRequest:
    """One incarnation's launch: argv, workdir, env and the checkpoint contract's variables.
    `CUDA_VISIBLE_DEVICES` lists card indexes, in PCI bus order (`CUDA_DEVICE_ORDER`), which is
    nvidia-smi's order; `gpu_uuids` are kept for the record."""
    spec = job.spec
    if not spec.command:
        raise StateError(f"job {job.id} has no command to run", hint="run `gpuctl db check`")
    del gpu_uuids  # the indexes name the cards; the UUIDs are in the incarnation
    return LaunchRequest(
        job_id=job.id,
        incarnation=incarnation,
        argv=spec.command,
        cuda_visible_devices=",".join(str(c) for c in cards),
        mib_per_card=mib_per_card,
        checkpoint_dir=spec.policy.checkpoint.dir_for(job.id),
        resume_from=resume_from,
        workdir=spec.workdir,
        env={**spec.env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        secret_env=dict(secrets),
        mps_limit_mib=mps_limit_mib,
    )
