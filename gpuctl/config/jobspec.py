"""Job spec files: one job per YAML file, or several under `jobs:`, converted to `JobRequest`s.

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
```

Every problem is one `JobSpecError` naming the file, the line and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from gpuctl.config.loader import Document, load_document, validate_data
from gpuctl.core.placement.model import JobRequest, JobShape, LabelRequirement, Tier
from gpuctl.core.units import UnitError, parse_card_mem, parse_cpu_milli, parse_mem_mib
from gpuctl.errors import JobSpecError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
LABEL_KEY_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?$"
ANY_VALUE = "*"
KIND = "job spec"

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
LabelKey = Annotated[str, Field(pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, Field(min_length=1, max_length=128)]


def _mem_request(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("must be a size (24GiB), a fraction of a card (0.5) or whole")
    try:
        parse_card_mem(value)
    except UnitError as exc:
        raise ValueError(str(exc)) from None
    return value


def _mem_size(value: Any) -> Any:
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("must be a memory size such as 64GiB")
    try:
        parse_mem_mib(value)
    except UnitError as exc:
        raise ValueError(str(exc)) from None
    return value


def _cpu(value: Any) -> Any:
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("must be a number of cores (4, 0.5) or milli-cores (500m)")
    try:
        parse_cpu_milli(value)
    except UnitError as exc:
        raise ValueError(str(exc)) from None
    return value


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


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


class JobSpec(_Strict):
    name: Name
    command: Annotated[list[str], Field(min_length=1)] | None = None
    resources: Resources
    tier: Literal["standard", "spot"] = "standard"
    priority: int = Field(0, ge=-1000, le=1000)
    group: Name | None = None
    labels: dict[LabelKey, LabelValue] = {}
    affinity: Affinity = Affinity()


class JobListFile(_Strict):
    jobs: Annotated[list[JobSpec], Field(min_length=1)]


def _requirements(match: dict[str, str | list[str]]) -> tuple[LabelRequirement, ...]:
    out = []
    for key in sorted(match):
        v = match[key]
        values = [v] if isinstance(v, str) else list(v)
        any_value = ANY_VALUE in values
        out.append(LabelRequirement(key, () if any_value else tuple(values)))
    return tuple(out)


def to_request(spec: JobSpec) -> JobRequest:
    r = spec.resources
    return JobRequest(
        name=spec.name,
        shape=JobShape(
            gpus=r.gpus,
            mem_per_gpu=parse_card_mem(r.mem_per_gpu),
            gpu_models=tuple(r.gpu_models),
            cpu_milli=0 if r.cpu is None else parse_cpu_milli(r.cpu),
            host_mem_mib=0 if r.host_mem is None else parse_mem_mib(r.host_mem),
        ),
        tier=Tier(spec.tier),
        priority=spec.priority,
        labels=dict(spec.labels),
        node_affinity=_requirements(spec.affinity.nodes),
        node_anti_affinity=_requirements(spec.affinity.avoid_nodes),
        group=spec.group,
        avoid_jobs=tuple(spec.affinity.avoid_jobs),
        avoid_groups=tuple(spec.affinity.avoid_groups),
        command=tuple(spec.command or ()),
    )


def load_job_specs(paths: Sequence[Path]) -> tuple[JobRequest, ...]:
    """Read job spec files, in order; names must be unique across all of them."""
    if not paths:
        raise JobSpecError("no job spec file given")
    requests: list[JobRequest] = []
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
            requests.append(to_request(spec))
    return tuple(requests)


def _specs(doc: Document) -> list[tuple[tuple[str | int, ...], JobSpec]]:
    if "jobs" in doc.data:
        listed = validate_data(
            doc.data, JobListFile, path=doc.path, lines=doc.lines, error=JobSpecError
        )
        return [(("jobs", i), spec) for i, spec in enumerate(listed.jobs)]
    spec = validate_data(doc.data, JobSpec, path=doc.path, lines=doc.lines, error=JobSpecError)
    return [((), spec)]
