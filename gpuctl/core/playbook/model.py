"""Playbooks, pure: the validated playbook as values, the fleet as a playbook sees it, and a
unit of a run.

A *unit* is one step of one batch: with `serial: 2` over five targets the steps run for the first
two nodes, then the next two, then the last one, and every step (node steps and fleet steps alike)
is one unit per batch. What a run makes of its units (the results, the journal a crashed run
resumes from, when the run must stop) is in `gpuctl.core.playbook.run`. No I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from typing import Any

from gpuctl.core.playbook.expr.model import Expr

STEP_KINDS = (
    "status",
    "health",
    "cordon",
    "uncordon",
    "drain",
    "consolidate",
    "submit",
    "cancel",
    "reconcile",
    "wait",
    "run",
    "assert",
)
NODE_KINDS = frozenset({"health", "cordon", "uncordon", "drain", "run"})  # act on each target


# --- the playbook as values ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Selector:
    """Nodes matching every given part: a name (or glob) of `names`, a group of `groups`, all
    of `labels`, a state of `states`. An empty selector matches every node."""

    names: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    states: tuple[str, ...] = ()

    def matches(self, node: TargetFacts) -> bool:
        if self.names and not any(fnmatch.fnmatchcase(node.name, p) for p in self.names):
            return False
        if self.groups and not set(self.groups) & set(node.groups):
            return False
        if any(node.labels.get(k) != v for k, v in self.labels.items()):
            return False
        return not self.states or node.state in self.states


@dataclasses.dataclass(frozen=True, slots=True)
class TimeWindow:
    """`HH:MM-HH:MM` local time, start included, end excluded, may wrap past midnight."""

    start_min: int
    end_min: int

    def contains(self, minute_of_day: int) -> bool:
        if self.start_min < self.end_min:
            return self.start_min <= minute_of_day < self.end_min
        return minute_of_day >= self.start_min or minute_of_day < self.end_min

    @property
    def text(self) -> str:
        return f"{_hhmm(self.start_min)}-{_hhmm(self.end_min)}"


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    serial: int | None = None  # nodes per batch; None: all targets in one batch
    serial_pct: float | None = None  # or a share of the targets per batch
    max_fail_percentage: float = 0.0  # stop once more than this share of the targets failed
    window: TimeWindow | None = None  # None: any time


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    index: int  # 0-based position in `steps`
    kind: str
    options: Mapping[str, Any]  # the kind's options, validated, defaults filled in
    name: str | None = None
    when: Expr | None = None
    source: str | None = None  # "file:line"

    @property
    def title(self) -> str:
        return self.name or self.kind

    @property
    def per_node(self) -> bool:
        """Acts on (or judges) each target node, rather than on the fleet once."""
        if self.kind in NODE_KINDS:
            return True
        cond = self.options.get("that") or self.options.get("until")
        uses = [c.uses_node for c in (cond, self.when) if isinstance(c, Expr)]
        return any(uses)


@dataclasses.dataclass(frozen=True, slots=True)
class Playbook:
    name: str
    targets: tuple[Selector, ...]
    steps: tuple[Step, ...]
    description: str = ""
    settings: Settings = Settings()
    privileged: tuple[tuple[str, ...], ...] = ()
    source: str = ""  # the file
    digest: str = ""  # sha256 of the file's bytes: a resumed run must run the same playbook


# --- the fleet as a playbook sees it -------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class TargetFacts:
    """One inventory node's facts for selectors and `node.*` conditions (None: unknown)."""

    name: str
    state: str  # ready, cordoned, draining, down, unknown
    reach: str = "ok"
    groups: tuple[str, ...] = ()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    health: str | None = None  # from this run's health step
    gpus: int | None = None
    jobs: int = 0
    mem_used_mib: int | None = None
    mem_total_mib: int | None = None
    allocated_mib: int | None = None
    util_pct: float | None = None
    temp_c: int | None = None

    def env(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "node.name": self.name,
            "node.state": self.state,
            "node.reach": self.reach,
            "node.health": self.health,
            "node.cordoned": self.state in ("cordoned", "draining"),
            "node.gpus": self.gpus,
            "node.jobs": self.jobs,
            "node.mem_used_mib": self.mem_used_mib,
            "node.mem_total_mib": self.mem_total_mib,
            "node.allocated_mib": self.allocated_mib,
            "node.util_pct": self.util_pct,
            "node.temp_c": self.temp_c,
            "node.groups": list(self.groups),
        }
        out.update({f"node.labels.{k}": v for k, v in self.labels.items()})
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class Unit:
    batch: int
    step: Step
    nodes: tuple[str, ...]  # the batch's nodes still in play

    @property
    def key(self) -> str:
        return unit_key(self.batch, self.step.index)


def unit_key(batch: int, step: int) -> str:
    """`b1.s3`: the third step of the first batch (both counted from 1, as printed)."""
    return f"b{batch + 1}.s{step + 1}"


@dataclasses.dataclass(frozen=True, slots=True)
class CancelCandidate:
    job_id: str
    priority: int
    submitted_at: float
    held_mib: int  # GPU memory its incarnations hold now (0: waiting)
