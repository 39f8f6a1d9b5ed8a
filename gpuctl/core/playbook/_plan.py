"""What a playbook does before it runs, pure: its targets resolved against the fleet, its steps in
batches (`serial`) and units, what each step would do (the dry run), and which jobs a cancel step
picks to bring utilization down to a target."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuctl.core.playbook.expr.model import Expr, show_value
from gpuctl.core.playbook.model import (
    CancelCandidate,
    Playbook,
    Selector,
    Settings,
    Step,
    TargetFacts,
    Unit,
)


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
