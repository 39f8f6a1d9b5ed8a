"""What each playbook step would do, as the fleet is now: the dry run's detail. Reads the fleet
and the store through the same services the steps call; changes nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpuctl.config.hostlist import fold
from gpuctl.core import playbook as core
from gpuctl.core.placement.model import JobRequest
from gpuctl.core.playbook import Unit
from gpuctl.core.playbook.expr import Expr
from gpuctl.errors import GpuctlError
from gpuctl.ops.moves import nodeops
from gpuctl.ops.playbook._fleet_steps import cancel_choice
from gpuctl.ops.playbook.model import Services, View, node_line, numbers_line


def preview(services: Services, unit: Unit, view: View) -> tuple[str | None, tuple[str, ...]]:
    """The step's condition and what it would change, as the fleet is now; reads only."""
    step = unit.step
    nodes = unit.nodes
    when: str | None = None
    if step.when is not None:
        if step.per_node:
            lines = [f"{n}: {core.explain_condition(step.when, view.env(n))}" for n in nodes]
            when = "; ".join(lines) or step.when.text
            nodes = tuple(n for n in nodes if step.when.evaluate(view.env(n)))
        else:
            when = core.explain_condition(step.when, view.env())
    try:
        detail = PREVIEWS[step.kind](services, unit, nodes, view)
    except GpuctlError as exc:
        detail = (f"cannot tell now: {exc.message}",)
    if step.per_node and not nodes:
        detail = ("no target node",)
    return when, tuple(detail)


Preview = Callable[[Services, Unit, tuple[str, ...], View], Sequence[str]]


def _p_status(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    return (f"now: {numbers_line(view.numbers)}",)


def _p_health(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    return (f"would poll {fold(nodes)} and judge their health",)


def _p_cordon(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    there = {c.node: c for c in s.loop.store.cordons()}
    return [
        f"{n}: cordoned already by {there[n].operator}: {there[n].reason} (left as it is)"
        if n in there
        else f"{n}: would cordon ({node_line(view.facts[n])})"
        for n in nodes
    ]


def _p_uncordon(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    there = {c.node: c for c in s.loop.store.cordons()}
    return [
        f"{n}: would lift the cordon of {there[n].operator}: {there[n].reason}"
        if n in there
        else f"{n}: not cordoned now (nothing to lift unless an earlier step cordons it)"
        for n in nodes
    ]


def _p_drain(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    out = []
    for n in nodes:
        plan = nodeops.plan_drain(
            nodeops.tick(s.loop, view.snapshot), n, reason=unit.step.options["reason"]
        )
        moves = [
            f"{m.job_id} -> {m.to_node} cards {','.join(map(str, m.to_cards))}"
            if m.to_node is not None
            else f"{m.job_id} stays: {m.why_not}"
            for m in plan.moves
        ]
        moves += [f"{j} left to Slurm (Slurm job {s})" for j, s in plan.left_to_slurm]
        jobs = "; ".join(moves) if moves else "no jobs"
        out.append(f"{n}: would cordon and move {len(plan.movable)} job(s): {jobs}")
    return out


def _p_consolidate(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    from gpuctl.ops.moves import consolidate as service

    now = s.loop.clock.now()
    inputs = service.gather_inputs(view.snapshot, s.loop.store, now)
    plan = service.plan(inputs, now=now, max_moves=unit.step.options["max_moves"])
    if plan.empty:
        return (f"nothing to move: {plan.reason}",)
    before, after = plan.before.fragmentation_pct, plan.after.fragmentation_pct
    out = [
        f"{m.job}: {m.from_node} cards {','.join(map(str, m.from_cards))} -> {m.to_node} cards "
        f"{','.join(map(str, m.to_cards))}"
        for m in plan.moves
    ]
    if before is not None and after is not None:
        out.append(f"fragmentation {before:.1f}% -> {after:.1f}%")
    return out


def _p_submit(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    from gpuctl.config.jobspec_files import load_specs
    from gpuctl.ops import jobs as service

    specs = load_specs([Path(f) for f in unit.step.options["files"]], require_command=True)
    active = {j.name: j for j in s.loop.store.jobs(service.ACTIVE)}
    return [
        f"{x.spec.name}: active already as {active[x.spec.name].id} (left as it is)"
        if x.spec.name in active
        else f"would submit {x.spec.name} ({_tier_priority(x.spec.request)})"
        for x in specs
    ]


def _tier_priority(request: JobRequest) -> str:
    return f"{request.tier.value}, priority {request.priority}"


def _p_cancel(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    chosen = cancel_choice(s.loop.store, unit.step.options, view.numbers)
    return [f"would cancel {j}" for j in chosen] or ["nothing to cancel now"]


def _p_reconcile(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    return (f"would run {unit.step.options['passes']} control-loop pass(es)",)


def _p_wait(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    cond: Expr = unit.step.options.get("until") or unit.step.options["that"]
    if cond.uses_node:
        return [f"{n} now: {core.explain_condition(cond, view.env(n))}" for n in nodes]
    return (f"now: {core.explain_condition(cond, view.env())}",)


def _p_run(s: Services, unit: Unit, nodes: tuple[str, ...], view: View) -> Sequence[str]:
    o = unit.step.options
    command = core.command_text(o["argv"], o["sudo"])
    return [f"{n}: would run {command}" for n in nodes]


PREVIEWS: Mapping[str, Preview] = {
    "status": _p_status,
    "health": _p_health,
    "cordon": _p_cordon,
    "uncordon": _p_uncordon,
    "drain": _p_drain,
    "consolidate": _p_consolidate,
    "submit": _p_submit,
    "cancel": _p_cancel,
    "reconcile": _p_reconcile,
    "wait": _p_wait,
    "run": _p_run,
    "assert": _p_wait,
}
