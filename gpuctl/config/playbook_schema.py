"""The playbook file's schema: the pydantic models a playbook file is validated against
(`PlaybookFile`: target selectors, settings, privileged commands, and a `StepModel` per step with
one options model per step kind) and the short forms a step may be written in. Reading a file
against it: `gpuctl.config.playbook`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from gpuctl.core import playbook as core

COMMON_KEYS = ("name", "when")
STEP_KEYS = (*COMMON_KEYS, *core.STEP_KINDS)
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
GLOB_RE = re.compile(r"^[A-Za-z0-9*?\[][A-Za-z0-9._*?\[\]!-]{0,127}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _listed(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _plain(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters")
    return value


Text = Annotated[str, Field(min_length=1, max_length=500), pydantic.AfterValidator(_plain)]
Name = Annotated[str, Field(pattern=NAME_RE)]
Seconds = Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)]
Listed = pydantic.BeforeValidator(_listed)


class SelectorModel(_M):
    names: Annotated[list[Annotated[str, Field(pattern=GLOB_RE.pattern)]], Listed] = []
    groups: Annotated[list[Name], Listed] = []
    labels: dict[Annotated[str, Field(min_length=1, max_length=63)], Text] = {}
    states: Annotated[
        list[Literal["ready", "cordoned", "draining", "down", "unknown"]], Listed
    ] = []


class SettingsModel(_M):
    serial: int | str | None = None
    max_fail_percentage: Annotated[float, Field(ge=0, le=100)] = 0.0
    window: str | None = None


class OneTarget(_M):
    targets: SelectorModel


class ManyTargets(_M):
    targets: Annotated[list[SelectorModel], Field(min_length=1)]


class StatusOptions(_M):
    pass


class HealthOptions(_M):
    samples: Annotated[int, Field(ge=1, le=100)] = 1
    interval_s: Annotated[float, Field(ge=0, le=3600)] | None = None
    fail_on: Annotated[list[Literal["degraded", "unhealthy", "unknown"]], Listed] = []


class CordonOptions(_M):
    reason: Text


class UncordonOptions(_M):
    pass


class DrainOptions(_M):
    reason: Text
    grace_s: Annotated[float, Field(ge=0, le=3600)] | None = None
    checkpoint_wait_s: Annotated[float, Field(ge=0, le=3600)] | None = None
    timeout_s: Seconds = 600.0
    parallel: Annotated[int, Field(ge=1, le=64)] = 2


class ConsolidateOptions(_M):
    max_moves: Annotated[int, Field(ge=0, le=1000)] = 10
    parallel: Annotated[int, Field(ge=1, le=64)] = 1
    timeout_s: Seconds | None = None


class SubmitOptions(_M):
    files: Annotated[list[Annotated[str, Field(min_length=1, max_length=4096)]], Listed] = Field(
        min_length=1
    )


class CancelOptions(_M):
    jobs: Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]], Listed] = []
    tier: Literal["standard", "spot"] | None = None
    max: Annotated[int, Field(ge=1, le=10000)] | None = None
    target_utilization_pct: Annotated[float, Field(ge=0, le=100)] | None = None
    force: bool = False

    @pydantic.model_validator(mode="after")
    def _something(self) -> CancelOptions:
        if not self.jobs and self.tier is None:
            raise ValueError("name the jobs to cancel (jobs:) or a tier (tier: spot)")
        if self.target_utilization_pct is not None and self.tier is None:
            raise ValueError("target_utilization_pct needs a tier to pick jobs from")
        return self


class ReconcileOptions(_M):
    passes: Annotated[int, Field(ge=1, le=1000)] = 1
    interval_s: Annotated[float, Field(ge=0, le=3600)] = 0.0


class WaitOptions(_M):
    until: Text
    timeout_s: Seconds = 300.0
    interval_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    reconcile: bool = False


class RunOptions(_M):
    argv: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(min_length=1)]
    sudo: bool = False
    timeout_s: Seconds = 60.0


class AssertOptions(_M):
    that: Text
    message: Text | None = None


_SHORTHAND = {"wait": "until", "assert": "that", "run": "argv", "submit": "files", "cancel": "jobs"}


class StepModel(_M):
    name: Text | None = None
    when: Text | None = None
    status: StatusOptions | None = None
    health: HealthOptions | None = None
    cordon: CordonOptions | None = None
    uncordon: UncordonOptions | None = None
    drain: DrainOptions | None = None
    consolidate: ConsolidateOptions | None = None
    submit: SubmitOptions | None = None
    cancel: CancelOptions | None = None
    reconcile: ReconcileOptions | None = None
    wait: WaitOptions | None = None
    run: RunOptions | None = None
    assert_: AssertOptions | None = Field(None, alias="assert")

    @pydantic.model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        """`- status:` means `status: {}`; `wait: COND`, `assert: COND`, `run: [argv]`,
        `submit: FILE`, `cancel: [JOB]` and `reconcile: N` are short for their main option."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for kind in core.STEP_KINDS:
            if kind not in out:
                continue
            value = out[kind]
            if value is None:
                out[kind] = {}
            elif kind in _SHORTHAND and not isinstance(value, dict):
                out[kind] = {_SHORTHAND[kind]: value}
            elif kind == "reconcile" and isinstance(value, int) and not isinstance(value, bool):
                out[kind] = {"passes": value}
        return out

    @property
    def kinds(self) -> list[str]:
        return [k for k in core.STEP_KINDS if getattr(self, step_field(k)) is not None]


def step_field(kind: str) -> str:
    """The `StepModel` field of a step kind (`assert` is a Python keyword)."""
    return "assert_" if kind == "assert" else kind


class PlaybookFile(_M):
    name: Name
    description: Annotated[str, Field(max_length=2000)] = ""
    targets: Any  # `all`, one selector or a list of them: validated by `_selectors`
    settings: SettingsModel = SettingsModel()
    privileged: list[Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]] = []
    steps: Annotated[list[StepModel], Field(min_length=1)]
