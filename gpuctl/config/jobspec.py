"""The job spec schema: one job per YAML file, or several under `jobs:`, and its `JobRequest`.

```yaml
name: train-llama            # ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$, unique across the files given
command: [python, train.py]  # argv (optional for `gpuctl place`)
resources:
  gpus: 4                    # cards on one node; 0 = CPU only
  mem_per_gpu: whole         # 24GiB | 80GB | 0.5 (of a card) | whole
  gpu_models: [H100]         # any of these models (words of the NVML name)
  cpu: 16                    # cores: 16, 0.5 or 500m
  host_mem: 128GiB
tier: standard               # standard | spot
priority: 10                 # -1000..1000, higher is placed first
group: llama                 # for other jobs' avoid_groups
labels: {team: nlp}
affinity:
  nodes: {zone: eu-1, pool: [train, mixed]}   # the node must carry each label (one of the values)
  avoid_nodes: {maintenance: "*"}             # the node must carry none of these ("*": any value)
  avoid_jobs: [eval-llama]                    # never on a node with these jobs (symmetric)
  avoid_groups: [serving]                     # ... nor with jobs of these groups
workdir: .                   # on the node; relative: against this file's folder (shared storage)
env: {EPOCHS: 3}             # plain values, put in the job's environment
secret_env:                  # values never stored, logged or put on a command line
  - WANDB_API_KEY            # from the operator's environment variable of that name
  - HF_TOKEN: {file: ~/.hf_token}   # from a file on the operator's machine
checkpoint: {dir: "/shared/ckpt/{job_id}", sync: shared}   # sync: shared | pull (default pull)
restart_budget: 3            # restarts after the job's own failures before it is held
grace_s: 30                  # SIGTERM -> SIGKILL grace
slice_enforcement: observe   # observe | stop: what happens when the job uses more than its slice
disruptible: true            # false: consolidation never moves it
min_runtime_between_moves: 30m   # consolidation leaves it alone this long after a (re)start
```

The models here check each field (a bad value is one `JobSpecError` naming its field, once read
through `config.jobspec_files`, which also does the checks across fields and files and resolves
paths); `to_spec` turns a validated `JobSpecModel` into the core's typed `JobSpec`, once, at submit
(`spec_document` writes it back with a spec file's keys, for `gpuctl jobs show -o json`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from gpuctl.core.jobs.spec import (
    DEFAULT_GRACE_S,
    DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S,
    DEFAULT_RESTART_BUDGET,
    CheckpointPolicy,
    CheckpointSync,
    JobPolicy,
    JobSpec,
    SecretRef,
    SliceEnforcement,
)
from gpuctl.core.placement.model import JobRequest, JobShape, LabelRequirement, Tier
from gpuctl.core.units import (
    MemPerCard,
    UnitError,
    parse_cpu_milli,
    parse_mem_mib,
    parse_mem_per_card,
)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# Set by gpuctl at launch (the checkpoint contract); a spec may not set them itself.
RESERVED_ENV_PREFIX = "GPUCTL_"
RESERVED_ENV = frozenset(
    {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"}
)
MAX_MIN_RUNTIME_BETWEEN_MOVES_S = 7 * 86400.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")
_DURATION_UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
LABEL_KEY_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$"
ANY_VALUE = "*"

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
LabelKey = Annotated[str, Field(pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, Field(min_length=1, max_length=128)]


def _unit_check(
    parse: Callable[[Any], object], shape: str, *, optional: bool
) -> Callable[[Any], Any]:
    """A validator that keeps the value as written once `parse` (from `core.units`) accepts it;
    its error message, or `shape` for a value of the wrong type, becomes the field's error."""

    def check(value: Any) -> Any:
        if value is None and optional:
            return value
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(shape)
        try:
            parse(value)
        except UnitError as exc:
            raise ValueError(str(exc)) from None
        return value

    return check


_mem_request = _unit_check(
    parse_mem_per_card,
    "must be a size (24GiB), a fraction of a card (0.5) or whole",
    optional=False,
)
_mem_size = _unit_check(parse_mem_mib, "must be a memory size such as 64GiB", optional=True)
_cpu = _unit_check(
    parse_cpu_milli, "must be a number of cores (4, 0.5) or milli-cores (500m)", optional=True
)


def _duration_s(value: Any) -> Any:
    """A duration: seconds (`90`), or a number with s, m (min), h or d (`30m`, `1.5h`)."""
    shape = "must be a duration: seconds (1800) or a number with s, m, h or d (30m)"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(shape)
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        m = _DURATION.match(value)
        if m is None:
            raise ValueError(f"{shape} (got {value!r})")
        seconds = float(m.group(1)) * _DURATION_UNIT_S[m.group(2) or "s"]
    if not 0 <= seconds <= MAX_MIN_RUNTIME_BETWEEN_MOVES_S:
        raise ValueError(f"must be from 0 to 7 days (got {value!r})")
    return seconds


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _check_env_name(name: str) -> None:
    if not re.match(ENV_NAME_PATTERN, name):
        raise ValueError(f"{name!r} is not an environment variable name ({ENV_NAME_PATTERN})")
    if name.startswith(RESERVED_ENV_PREFIX) or name in RESERVED_ENV:
        raise ValueError(f"{name} is set by gpuctl at launch; a job spec cannot set it")


def _env_name(value: Any) -> Any:
    if isinstance(value, str):
        _check_env_name(value)
    return value


def _env_value(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("true/false is ambiguous in an environment: quote it ('true' or '1')")
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str) and "\0" in value:
        raise ValueError("an environment value cannot hold a NUL character")
    return value


def _secret_item(value: Any) -> Any:
    """A secret's name. `NAME: {file: PATH}` items were split off into `secret_files` before
    this runs (`JobSpecModel._split_secret_files`); one still here is malformed: say how."""
    shape = "must be a NAME, or NAME: {file: PATH}"
    if isinstance(value, str):
        _check_env_name(value)
        return value
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError(shape)
    ((name, source),) = value.items()
    _check_env_name(str(name))
    if not isinstance(source, dict):
        raise ValueError(f"{name}: {shape}")
    if set(source) != {"file"}:
        got = ", ".join(sorted(map(str, source))) or "none"
        raise ValueError(f"{name}: a secret's source is {{file: PATH}} (got keys: {got})")
    raise ValueError(f"{name}: file must be a path")


def _file_source(item: Any) -> tuple[str, str] | None:
    """`NAME: {file: PATH}`, well formed: (NAME, PATH); anything else: None."""
    if not isinstance(item, dict) or len(item) != 1:
        return None
    ((name, source),) = item.items()
    if not isinstance(name, str) or not isinstance(source, dict) or set(source) != {"file"}:
        return None
    try:
        _check_env_name(name)
    except ValueError:
        return None
    path = source["file"]
    if not isinstance(path, str) or not path or "\0" in path or "\n" in path:
        return None
    return name, path


def _command_arg(value: Any) -> Any:
    if isinstance(value, str) and "\0" in value:
        raise ValueError("an argument cannot hold a NUL character (a command line ends at one)")
    return value


def _node_path(value: Any) -> Any:
    if isinstance(value, str) and ("\0" in value or "\n" in value):
        raise ValueError("a path cannot hold a NUL or newline character")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)


class Resources(_Strict):
    gpus: int = Field(1, ge=0, le=64)
    mem_per_gpu: Annotated[str | int | float, pydantic.BeforeValidator(_mem_request)] = "whole"
    gpu_models: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]],
        pydantic.BeforeValidator(_one_or_many),
    ] = []
    cpu: Annotated[str | int | float | None, pydantic.BeforeValidator(_cpu)] = None
    host_mem: Annotated[str | None, pydantic.BeforeValidator(_mem_size)] = None

    @pydantic.field_validator("mem_per_gpu", "gpu_models")
    @classmethod
    def _gpu_fields_need_gpus(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        if info.data.get("gpus") == 0:
            raise ValueError("needs gpus of 1 or more (gpus is 0: CPU only)")
        return value


LabelMatch = dict[LabelKey, Annotated[LabelValue | list[LabelValue], Field()]]


class Affinity(_Strict):
    nodes: LabelMatch = {}
    avoid_nodes: LabelMatch = {}
    avoid_jobs: list[Name] = []
    avoid_groups: list[Name] = []

    @pydantic.field_validator("nodes", "avoid_nodes")
    @classmethod
    def _no_empty_lists(cls, value: dict[str, str | list[str]]) -> dict[str, str | list[str]]:
        for key, v in value.items():
            if isinstance(v, list) and not v:
                raise ValueError(f"label {key!r}: give at least one value, or {ANY_VALUE!r}")
        return value


NodePath = Annotated[
    str, Field(min_length=1, max_length=4096), pydantic.BeforeValidator(_node_path)
]
CommandArg = Annotated[str, pydantic.BeforeValidator(_command_arg)]
EnvName = Annotated[str, pydantic.BeforeValidator(_env_name)]
EnvValue = Annotated[str, Field(max_length=32768), pydantic.BeforeValidator(_env_value)]
SecretName = Annotated[str, pydantic.BeforeValidator(_secret_item)]


class CheckpointSpec(_Strict):
    """Where the job writes checkpoints on its node, and how they survive the node."""

    dir: NodePath | None = None  # default: ~/.gpuctl/checkpoints/{job_id} on the node
    sync: Literal["shared", "pull"] = "pull"


class JobSpecModel(_Strict):
    name: Name
    command: Annotated[list[CommandArg], Field(min_length=1)] | None = None
    resources: Resources
    tier: Literal["standard", "spot"] = "standard"
    priority: int = Field(0, ge=-1000, le=1000)
    group: Name | None = None
    labels: dict[LabelKey, LabelValue] = {}
    affinity: Affinity = Affinity()
    workdir: NodePath | None = None
    env: dict[EnvName, EnvValue] = {}
    secret_env: list[SecretName] = []
    # Filled from the `NAME: {file: PATH}` items of secret_env, which keeps the names only: the
    # form the store keeps (its secret_env is names, never values). Not written in spec files.
    secret_files: dict[EnvName, NodePath] = {}
    checkpoint: CheckpointSpec = CheckpointSpec()
    restart_budget: int = Field(DEFAULT_RESTART_BUDGET, ge=0, le=100)
    grace_s: float = Field(DEFAULT_GRACE_S, gt=0, le=3600)
    slice_enforcement: Literal["observe", "stop"] = "observe"
    # Consolidation: never move a job that is not disruptible, nor one (re)started less than
    # this many seconds ago (spec files may write 30m, 2h, ...).
    disruptible: bool = True
    min_runtime_between_moves: Annotated[float, pydantic.BeforeValidator(_duration_s)] = (
        DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _split_secret_files(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("secret_env"), list):
            return data
        files = data.get("secret_files", {})
        if not isinstance(files, dict):
            return data
        files = dict(files)
        names: list[Any] = []
        for item in data["secret_env"]:
            found = _file_source(item)
            if found is None:
                names.append(item)
            else:
                names.append(found[0])
                files[found[0]] = found[1]
        return {**data, "secret_env": names, "secret_files": files}

    @pydantic.model_validator(mode="after")
    def _files_are_of_listed_secrets(self) -> JobSpecModel:
        unlisted = sorted(set(self.secret_files) - set(self.secret_env))
        if unlisted:
            raise ValueError(f"secret_files names secrets not in secret_env: {unlisted}")
        return self

    def secret_sources(self) -> dict[str, str | None]:
        """Secret name -> the file its value comes from (None: the environment variable)."""
        return {name: self.secret_files.get(name) for name in self.secret_env}


class JobListFile(_Strict):
    jobs: Annotated[list[JobSpecModel], Field(min_length=1)]


def _requirements(match: dict[str, str | list[str]]) -> tuple[LabelRequirement, ...]:
    out = []
    for key in sorted(match):
        v = match[key]
        values = [v] if isinstance(v, str) else list(v)
        any_value = ANY_VALUE in values
        out.append(LabelRequirement(key, () if any_value else tuple(values)))
    return tuple(out)


def to_spec(model: JobSpecModel) -> JobSpec:
    """The core's typed spec of a validated spec file: what gpuctl submits and stores."""
    r = model.resources
    request = JobRequest(
        name=model.name,
        shape=JobShape(
            gpus=r.gpus,
            mem_per_card=parse_mem_per_card(r.mem_per_gpu),
            gpu_models=tuple(r.gpu_models),
            cpu_milli=0 if r.cpu is None else parse_cpu_milli(r.cpu),
            host_mem_mib=0 if r.host_mem is None else parse_mem_mib(r.host_mem),
        ),
        tier=Tier(model.tier),
        priority=model.priority,
        labels=dict(model.labels),
        node_affinity=_requirements(model.affinity.nodes),
        node_anti_affinity=_requirements(model.affinity.avoid_nodes),
        group=model.group,
        avoid_jobs=tuple(model.affinity.avoid_jobs),
        avoid_groups=tuple(model.affinity.avoid_groups),
    )
    policy = JobPolicy(
        grace_s=model.grace_s,
        restart_budget=model.restart_budget,
        checkpoint=CheckpointPolicy(model.checkpoint.dir, CheckpointSync(model.checkpoint.sync)),
        slice_enforcement=SliceEnforcement(model.slice_enforcement),
        disruptible=model.disruptible,
        min_runtime_between_moves_s=model.min_runtime_between_moves,
    )
    return JobSpec(
        request=request,
        policy=policy,
        command=tuple(model.command or ()),
        workdir=model.workdir,
        env=dict(model.env),
        secrets=tuple(SecretRef(n, model.secret_files.get(n)) for n in model.secret_env),
    )


def spec_from_data(data: Mapping[str, Any]) -> JobSpec:
    """A spec written as plain data (a spec file's keys), validated: for tests and benchmarks,
    which build specs in code. A bad value raises pydantic's ValidationError."""
    return to_spec(JobSpecModel.model_validate(dict(data)))


def spec_document(spec: JobSpec) -> dict[str, Any]:
    """The spec with a spec file's keys, every one (`gpuctl jobs show -o json` always showed the
    stored spec so), sizes in GiB or MiB and CPU in cores or milli-cores as the typed spec holds
    them. `spec_from_data` reads it back (a CPU-only spec without its card keys)."""
    req, policy = spec.request, spec.policy
    shape = req.shape
    resources: dict[str, Any] = {
        "gpus": shape.gpus,
        "cpu": _cpu_text(shape.cpu_milli) if shape.cpu_milli else None,
        "host_mem": _mib_text(shape.host_mem_mib) if shape.host_mem_mib else None,
    }
    if shape.gpus:  # CPU only: a spec file says nothing of cards
        resources["mem_per_gpu"] = _mem_text(shape.mem_per_card)
        resources["gpu_models"] = list(shape.gpu_models)
    data: dict[str, Any] = {
        "name": spec.name,
        "command": list(spec.command) or None,
        "resources": resources,
        "tier": req.tier.value,
        "priority": req.priority,
        "group": req.group,
        "labels": dict(req.labels),
        "affinity": {
            "nodes": _match(req.node_affinity),
            "avoid_nodes": _match(req.node_anti_affinity),
            "avoid_jobs": list(req.avoid_jobs),
            "avoid_groups": list(req.avoid_groups),
        },
        "workdir": spec.workdir,
        "env": dict(spec.env),
        "secret_env": [s.name for s in spec.secrets],
        "secret_files": {s.name: s.file for s in spec.secrets if s.file is not None},
        "checkpoint": {"dir": policy.checkpoint.dir, "sync": policy.checkpoint.sync.value},
        "restart_budget": policy.restart_budget,
        "grace_s": policy.grace_s,
        "slice_enforcement": policy.slice_enforcement.value,
        "disruptible": policy.disruptible,
        "min_runtime_between_moves": policy.min_runtime_between_moves_s,
    }
    return JobSpecModel.model_validate(data).model_dump(mode="json")


def _mib_text(mib: int) -> str:
    return f"{mib // 1024}GiB" if mib % 1024 == 0 else f"{mib}MiB"


def _mem_text(mem: MemPerCard) -> str | float:
    if mem.whole:
        return "whole"
    if mem.fraction is not None:
        return mem.fraction
    assert mem.mib is not None
    return _mib_text(mem.mib)


def _cpu_text(milli: int) -> str | int:
    return milli // 1000 if milli % 1000 == 0 else f"{milli}m"


def _match(reqs: tuple[LabelRequirement, ...]) -> dict[str, str | list[str]]:
    return {r.key: list(r.values) if r.values else ANY_VALUE for r in reqs}
