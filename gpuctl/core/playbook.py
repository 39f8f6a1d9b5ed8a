"""Playbooks, pure: the validated playbook as values, its targets resolved against the fleet, its
steps in batches (`serial`), what each step would do (the dry run), and which jobs a cancel step
picks to bring utilization down to a target.

A *unit* is one step of one batch: with `serial: 2` over five targets the steps run for the first
two nodes, then the next two, then the last one, and every step (node steps and fleet steps alike)
is one unit per batch. What a run makes of its units (the results, the journal a crashed run
resumes from, when the run must stop) is in `gpuctl.core.playbook_run`. No I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuctl.core.playbook_expr import Expr, show_value

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


def resolve_targets(selectors: Sequence[Selector], nodes: Sequence[TargetFacts]) -> tuple[str, ...]:
    """The nodes any selector matches, in inventory order."""
    return tuple(n.name for n in nodes if any(s.matches(n) for s in selectors))


def batch_size(settings: Settings, targets: int) -> int:
    if targets == 0:
        return 1
    if settings.serial is not None:
        return max(1, settings.serial)
    if settings.serial_pct is not None:
        return max(1, math.floor(targets * settings.serial_pct / 100))
    return targets


def batches(targets: Sequence[str], settings: Settings) -> tuple[tuple[str, ...], ...]:
    """The targets split by `serial`; one empty batch when there are none (fleet steps run)."""
    if not targets:
        return ((),)
    size = batch_size(settings, len(targets))
    return tuple(tuple(targets[i : i + size]) for i in range(0, len(targets), size))


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


def units(playbook: Playbook, plan: Sequence[Sequence[str]]) -> tuple[Unit, ...]:
    return tuple(
        Unit(b, step, tuple(nodes)) for b, nodes in enumerate(plan) for step in playbook.steps
    )


# --- what a step would do (the dry run) ----------------------------------------------------------


def sudo_argv(argv: Sequence[str], sudo: bool) -> tuple[str, ...]:
    return ("sudo", "-n", *argv) if sudo else tuple(argv)


def describe(step: Step) -> str:
    """One line: what the step does, from its options alone."""
    o = step.options
    k = step.kind
    if k == "status":
        return "gather the fleet and show the numbers"
    if k == "health":
        fail = ", ".join(o["fail_on"]) or "never"
        return f"check health ({o['samples']} sample(s)); fails a node on: {fail}"
    if k == "cordon":
        return f"cordon (reason: {o['reason']})"
    if k == "uncordon":
        return "lift the cordon"
    if k == "drain":
        return f"cordon and move every job off (reason: {o['reason']}, timeout {o['timeout_s']:g}s)"
    if k == "consolidate":
        return f"consolidate: at most {o['max_moves']} move(s)"
    if k == "submit":
        return f"submit {', '.join(o['files'])} (a job whose name is active is left as it is)"
    if k == "cancel":
        return "cancel " + _cancel_text(o)
    if k == "reconcile":
        return f"{o['passes']} control-loop pass(es)"
    if k == "wait":
        loop = ", running the control loop" if o["reconcile"] else ""
        every = f"every {o['interval_s']:g}s, at most {o['timeout_s']:g}s"
        return f"wait until {o['until']} ({every}{loop})"
    if k == "run":
        return f"run {command_text(o['argv'], o['sudo'])} (timeout {o['timeout_s']:g}s)"
    if k == "assert":
        return f"assert {o['that']}"
    return k  # pragma: no cover - every kind is listed above


def command_text(argv: Sequence[str], sudo: bool) -> str:
    import shlex

    return shlex.join(sudo_argv(argv, sudo))


def _cancel_text(o: Mapping[str, Any]) -> str:
    parts = []
    if o["jobs"]:
        parts.append(", ".join(o["jobs"]))
    if o["tier"]:
        what = f"{o['tier']} jobs (lowest priority, newest first)"
        if o["target_utilization_pct"] is not None:
            what += f" until utilization <= {o['target_utilization_pct']:g}%"
        parts.append(what)
    limit = f", at most {o['max']}" if o["max"] is not None else ""
    return " and ".join(parts) + limit


def explain_condition(expr: Expr, env: Mapping[str, Any]) -> str:
    """`fragmentation_pct > 20` -> `fragmentation_pct > 20 (fragmentation_pct = 31.5): true`."""
    values = ", ".join(f"{n} = {show_value(env.get(n))}" for n in expr.names())
    verdict = "true" if expr.evaluate(env) else "false"
    return f"{expr.text} ({values}): {verdict}" if values else f"{expr.text}: {verdict}"


# --- cancelling to a utilization target ----------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class CancelCandidate:
    job_id: str
    priority: int
    submitted_at: float
    held_mib: int  # GPU memory its incarnations hold now (0: waiting)


def choose_cancellations(
    candidates: Sequence[CancelCandidate],
    *,
    allocated_mib: int,
    capacity_mib: int,
    target_utilization_pct: float | None,
    limit: int | None,
) -> tuple[str, ...]:
    """Lowest priority first, newest first among equals; with a target, only as many jobs as it
    takes to bring allocated / capacity down to it (and only jobs that hold memory)."""
    order = sorted(candidates, key=lambda c: (c.priority, -c.submitted_at, c.job_id))
    chosen: list[str] = []
    allocated = allocated_mib
    for c in order:
        if limit is not None and len(chosen) >= limit:
            break
        if target_utilization_pct is not None:
            if capacity_mib <= 0 or 100.0 * allocated / capacity_mib <= target_utilization_pct:
                break
            if c.held_mib <= 0:
                continue
        chosen.append(c.job_id)
        allocated -= c.held_mib
    return tuple(chosen)
