"""The playbook step kinds that act on the fleet once: status, consolidate, submit, cancel (the
jobs it picks: `cancel_choice`, which the dry run shares), reconcile; and the conditions, wait and
assert, which judge each target node when they read `node.*`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuctl.adapters.protocols import Store
from gpuctl.core import playbook as core
from gpuctl.core.jobs.model import JobState
from gpuctl.core.playbook import Unit
from gpuctl.core.playbook.expr import Expr
from gpuctl.core.playbook.run import NodeResult, StepResult, node_step_result, step_result
from gpuctl.core.timefmt import duration
from gpuctl.ops.playbook.model import node_line, numbers_line

if TYPE_CHECKING:
    from gpuctl.ops.playbook.model import Executor, RunContext


def _status(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    view = ctx.view()
    n = view.numbers
    lines = [{"node": f.name, "state": f.state, "line": node_line(f)} for f in view.facts.values()]
    return step_result(unit, "ok", numbers_line(n), numbers=dict(n), nodes=lines)


def _consolidate(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    from gpuctl.ops.moves import consolidate as service

    o = unit.step.options
    s = ctx.services
    loop = s.loop
    snapshot = loop.fleet.gather(loop.inventory)
    now = loop.clock.now()
    plan = service.plan(
        service.gather_inputs(snapshot, loop.store, now), now=now, max_moves=o["max_moves"]
    )
    before, after = plan.before.fragmentation_pct, plan.after.fragmentation_pct
    figures = {"fragmentation_before_pct": before, "fragmentation_after_pct": after}
    if plan.empty:
        return step_result(unit, "ok", f"nothing to move: {plan.reason}", **figures)
    migrator = service.loop_migrator(
        loop, operator=s.operator, snapshot=snapshot, timeout_s=o["timeout_s"], sleep=s.sleep
    )
    done = service.apply(
        plan,
        current_version=service.current_version(snapshot, loop.store),
        migrator=migrator,
        parallel=o["parallel"],
    )
    moved = sum(1 for r in done.results if r.outcome in ("moved", "elsewhere"))
    message = f"{moved} of {len(plan.moves)} move(s) done"
    if before is not None and after is not None:
        message += f"; fragmentation {before:.1f}% -> {after:.1f}% planned"
    moves = [{"job": r.job, "outcome": r.outcome, "to_node": r.to_node} for r in done.results]
    return step_result(
        unit, "changed" if done.complete else "failed", message, moves=moves, **figures
    )


def _submit(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    from gpuctl.config.jobspec_files import load_specs
    from gpuctl.ops import jobs as service

    s = ctx.services
    store = s.loop.store
    specs = load_specs([Path(f) for f in unit.step.options["files"]], require_command=True)
    active = {j.name: j for j in store.jobs(service.ACTIVE)}
    new = [x for x in specs if x.spec.name not in active]
    kept = [
        f"{x.spec.name} ({active[x.spec.name].id}, {active[x.spec.name].state})"
        for x in specs
        if x.spec.name in active
    ]
    added = (
        service.submit(store, new, actor=s.operator, clock=s.loop.clock, env=s.env) if new else []
    )
    parts = []
    if added:
        parts.append("submitted " + ", ".join(j.id for j in added))
    if kept:
        parts.append("active already: " + ", ".join(kept))
    return step_result(
        unit, "changed" if added else "ok", "; ".join(parts), jobs=[j.id for j in added]
    )


def _cancel(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    from gpuctl.ops import jobs as service

    o = unit.step.options
    s = ctx.services
    store = s.loop.store
    chosen = cancel_choice(store, o, ctx.view().numbers)
    why = f"cancelled by playbook {ctx.playbook.name} ({s.operator})"
    done = []
    for job_id in chosen:
        job = service.find_job(store, job_id)
        if job.state.terminal:
            continue
        service.cancel(
            store, job_id, actor=s.operator, clock=s.loop.clock, force=o["force"], why=why
        )
        done.append(job_id)
    if not done:
        return step_result(unit, "ok", "nothing to cancel", jobs=[])
    running = [j for j in done if (found := store.job(j)) and found.state is JobState.RUNNING]
    tail = f" ({len(running)} running: stopped by the control loop)" if running else ""
    return step_result(unit, "changed", f"cancelled {', '.join(done)}{tail}", jobs=done)


def cancel_choice(store: Store, o: Mapping[str, Any], n: Mapping[str, Any]) -> list[str]:
    """The jobs a cancel step names, then (with a tier) those `choose_cancellations` picks."""
    from gpuctl.ops import jobs as service

    chosen: list[str] = []
    for ref in o["jobs"]:
        job = service.find_job(store, ref)
        if not job.state.terminal:
            chosen.append(job.id)
    if o["tier"] is not None:
        holding: dict[str, int] = {}
        for inc in store.incarnations(holding=True):
            holding[inc.job_id] = holding.get(inc.job_id, 0) + inc.mib_per_card * len(inc.cards)
        candidates = [
            core.CancelCandidate(j.id, j.priority, j.submitted_at, holding.get(j.id, 0))
            for j in store.jobs(service.ACTIVE)
            if j.tier == o["tier"] and not j.cancel_requested and j.id not in chosen
        ]
        chosen += core.choose_cancellations(
            candidates,
            allocated_mib=int(n.get("allocated_mib") or 0),
            capacity_mib=int(n.get("capacity_mib") or 0),
            target_utilization_pct=o["target_utilization_pct"],
            limit=None if o["max"] is None else max(0, o["max"] - len(chosen)),
        )
    return chosen


def _reconcile(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    o = unit.step.options
    s = ctx.services
    actions = 0
    for i in range(o["passes"]):
        if i and o["interval_s"]:
            s.sleep(o["interval_s"])
        actions += len(s.loop.run_once().actions)
    outcome = "changed" if actions else "ok"
    return step_result(
        unit, outcome, f"{o['passes']} pass(es), {actions} action(s)", actions=actions
    )


def _wait(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    o = unit.step.options
    s = ctx.services
    cond: Expr = o["until"]
    clock = s.loop.clock
    start = clock.monotonic()
    while True:
        if o["reconcile"]:
            s.loop.run_once()
        ctx.changed()
        view = ctx.view()
        waited = clock.monotonic() - start
        if cond.uses_node:
            holds = {n: cond.evaluate(view.env(n)) for n in nodes}
            if all(holds.values()) or waited >= o["timeout_s"]:
                results = [
                    NodeResult(
                        n, "ok" if ok else "failed", core.explain_condition(cond, view.env(n))
                    )
                    for n, ok in holds.items()
                ]
                return node_step_result(unit, results)
        elif cond.evaluate(view.env()):
            return step_result(
                unit, "ok", f"after {duration(waited)}: {core.explain_condition(cond, view.env())}"
            )
        elif waited >= o["timeout_s"]:
            why = core.explain_condition(cond, view.env())
            return step_result(unit, "failed", f"timed out after {duration(waited)}: {why}")
        s.sleep(o["interval_s"])


def _assert(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    o = unit.step.options
    cond: Expr = o["that"]
    view = ctx.view()
    said = f"{o['message']}: " if o["message"] else ""
    if cond.uses_node:
        results = [
            NodeResult(
                n,
                "ok" if cond.evaluate(view.env(n)) else "failed",
                said + core.explain_condition(cond, view.env(n)),
            )
            for n in nodes
        ]
        return node_step_result(unit, results)
    ok = cond.evaluate(view.env())
    return step_result(
        unit, "ok" if ok else "failed", said + core.explain_condition(cond, view.env())
    )


FLEET_STEPS: Mapping[str, Executor] = {
    "status": _status,
    "consolidate": _consolidate,
    "submit": _submit,
    "cancel": _cancel,
    "reconcile": _reconcile,
    "wait": _wait,
    "assert": _assert,
}
