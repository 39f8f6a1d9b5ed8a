"""The playbook step kinds, each a call into a gpuctl service (`execute`), with a result per node.
A service error (`GpuctlError`) fails the step as a value; anything else is a bug and propagates
(the run is then resumable). What each would do, for the dry run: `gpuctl.ops.playbook_preview`."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuctl.adapters.protocols import Store
from gpuctl.core import playbook as core
from gpuctl.core.jobs import JobState
from gpuctl.core.model import NodeSpec
from gpuctl.core.playbook import NodeResult, Playbook, StepResult, Unit
from gpuctl.core.playbook_expr import Expr
from gpuctl.errors import GpuctlError, TransportError
from gpuctl.ops import nodeops
from gpuctl.ops.playbook_view import Services, View, node_line, numbers_line, observe

MAX_RUN_OUTPUT_BYTES = 64 << 10
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x1f\x7f-\x9f]")  # node output is untrusted


# --- running a step ------------------------------------------------------------------------------


class RunContext:
    """What a run carries from step to step: the journal (targets, health verdicts) and the
    newest view of the fleet (re-read before every step that looks at it)."""

    def __init__(
        self, services: Services, playbook: Playbook, journal: core.Journal, view: View
    ) -> None:
        self.services = services
        self.playbook = playbook
        self.journal = journal
        self.health: dict[str, str] = dict(journal.health)
        self._view: View | None = view

    def view(self) -> View:
        if self._view is None:
            self._view = observe(self.services, self.health, self.journal.targets)
        return self._view

    def changed(self) -> None:
        self._view = None


Executor = Callable[[RunContext, Unit, tuple[str, ...]], StepResult]


def execute(ctx: RunContext, unit: Unit) -> StepResult:
    """Run one unit: its `when`, then its kind. A node step with no node left: skipped."""
    step = unit.step
    ctx.changed()
    try:
        nodes = unit.nodes
        skipped: list[NodeResult] = []
        if step.when is not None:
            view = ctx.view()
            if not step.per_node:
                if not step.when.evaluate(view.env()):
                    why = core.explain_condition(step.when, view.env())
                    return _result(unit, "skipped", f"when: {why}")
            else:
                keep = []
                for n in nodes:
                    if step.when.evaluate(view.env(n)):
                        keep.append(n)
                    else:
                        why = core.explain_condition(step.when, view.env(n))
                        skipped.append(NodeResult(n, "skipped", f"when: {why}"))
                nodes = tuple(keep)
        if step.per_node and not nodes:
            return _nodes(unit, skipped, "no target node")
        result = EXECUTORS[step.kind](ctx, unit, nodes)
        if skipped:
            merged = tuple(
                sorted((*result.nodes, *skipped), key=lambda r: unit.nodes.index(r.node))
            )
            return dataclasses.replace(result, nodes=merged, outcome=core.aggregate(merged))
        return result
    except GpuctlError as exc:
        return _result(unit, "failed", exc.message)
    finally:
        ctx.changed()


def _result(unit: Unit, outcome: str, message: str, **data: Any) -> StepResult:
    return StepResult(
        key=unit.key,
        batch=unit.batch,
        step=unit.step.index,
        kind=unit.step.kind,
        title=unit.step.title,
        outcome=outcome,
        message=message,
        data=data,
    )


def _nodes(unit: Unit, results: Sequence[NodeResult], none: str = "no node") -> StepResult:
    outcome = core.aggregate(results)
    counts = {o: sum(1 for r in results if r.outcome == o) for o in core.OUTCOMES}
    message = ", ".join(f"{n} {o}" for o, n in counts.items() if n) or none
    return dataclasses.replace(_result(unit, outcome, message), nodes=tuple(results))


def _specs(ctx: RunContext, nodes: Sequence[str]) -> list[NodeSpec]:
    by_name = ctx.services.loop.inventory.by_name()
    return [by_name[n] for n in nodes]


# --- the kinds -----------------------------------------------------------------------------------


def _status(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    view = ctx.view()
    n = view.numbers
    lines = [{"node": f.name, "state": f.state, "line": node_line(f)} for f in view.facts.values()]
    return _result(unit, "ok", numbers_line(n), numbers=dict(n), nodes=lines)


def _health(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    from gpuctl.ops.health import check_health

    o = unit.step.options
    s = ctx.services
    verdicts = check_health(
        _specs(ctx, nodes),
        s.gatherer,
        s.history,
        s.rules,
        samples=o["samples"],
        interval_s=o["interval_s"],
        sleep=s.sleep,
    )
    results = []
    for v in verdicts:
        ctx.health[v.name] = v.verdict.value
        why = f": {v.reasons[0].text}" if v.reasons else ""
        outcome = "failed" if v.verdict.value in o["fail_on"] else "ok"
        results.append(NodeResult(v.name, outcome, f"{v.verdict.value}{why}"))
    return _nodes(unit, results)


def _cordon(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    s = ctx.services
    store = s.loop.store
    there = {c.node: c for c in store.cordons()}
    results = []
    for n in nodes:
        if n in there:
            c = there[n]
            results.append(NodeResult(n, "ok", f"cordoned already by {c.operator}: {c.reason}"))
            continue
        nodeops.cordon(
            store, n, reason=unit.step.options["reason"], operator=s.operator, clock=s.loop.clock
        )
        results.append(NodeResult(n, "changed", "cordoned"))
    return _nodes(unit, results)


def _uncordon(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    s = ctx.services
    there = {c.node: c for c in s.loop.store.cordons()}
    results = []
    for n in nodes:
        if n not in there:
            results.append(NodeResult(n, "ok", "not cordoned"))
            continue
        nodeops.uncordon(s.loop.store, n, operator=s.operator, clock=s.loop.clock)
        c = there[n]
        results.append(NodeResult(n, "changed", f"uncordoned (was: {c.reason}, by {c.operator})"))
    return _nodes(unit, results)


def _drain(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    o = unit.step.options
    s = ctx.services
    results = []
    for n in nodes:
        snapshot = s.loop.fleet.gather(s.loop.inventory)
        plan = nodeops.plan_drain(nodeops.tick(s.loop, snapshot), n, reason=o["reason"])
        done = nodeops.drain(
            s.loop,
            plan,
            operator=s.operator,
            grace_s=o["grace_s"],
            checkpoint_wait_s=o["checkpoint_wait_s"],
            timeout_s=o["timeout_s"],
            parallel=o["parallel"],
            snapshot=snapshot,
            sleep=s.sleep,
        )
        moved = sum(1 for r in done.results if r.moved)
        if done.complete:
            results.append(NodeResult(n, "changed", f"cordoned; {moved} job(s) moved off"))
        else:
            stays = "; ".join(f"{r.job_id}: {r.message}" for r in done.results if not r.moved)
            message = f"cordoned; {moved} of {len(done.results)} job(s) moved; stays: {stays}"
            results.append(NodeResult(n, "failed", message))
    return _nodes(unit, results)


def _consolidate(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    from gpuctl.ops import consolidate as service

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
        return _result(unit, "ok", f"nothing to move: {plan.reason}", **figures)
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
    return _result(unit, "changed" if done.complete else "failed", message, moves=moves, **figures)


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
    return _result(unit, "changed" if added else "ok", "; ".join(parts), jobs=[j.id for j in added])


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
        return _result(unit, "ok", "nothing to cancel", jobs=[])
    running = [j for j in done if (found := store.job(j)) and found.state is JobState.RUNNING]
    tail = f" ({len(running)} running: stopped by the control loop)" if running else ""
    return _result(unit, "changed", f"cancelled {', '.join(done)}{tail}", jobs=done)


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
    return _result(unit, outcome, f"{o['passes']} pass(es), {actions} action(s)", actions=actions)


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
                return _nodes(unit, results)
        elif cond.evaluate(view.env()):
            return _result(
                unit, "ok", f"after {waited:.0f}s: {core.explain_condition(cond, view.env())}"
            )
        elif waited >= o["timeout_s"]:
            why = core.explain_condition(cond, view.env())
            return _result(unit, "failed", f"timed out after {waited:.0f}s: {why}")
        s.sleep(o["interval_s"])


def _run(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    from gpuctl.ops.fanout import fanout

    o = unit.step.options
    command = shlex.join(core.sudo_argv(o["argv"], o["sudo"]))
    transport = ctx.services.transport

    def one(spec: NodeSpec) -> NodeResult:
        try:
            done = transport.run(
                spec, command, timeout_s=o["timeout_s"], max_output_bytes=MAX_RUN_OUTPUT_BYTES
            )
        except TransportError as exc:
            return NodeResult(spec.name, "failed", f"{exc.reach}: {exc.message}")
        out = (done.stdout if done.exit_code == 0 else done.stderr or done.stdout).decode(
            "utf-8", "replace"
        )
        last = _CONTROL.sub("", out.strip().splitlines()[-1])[:200] if out.strip() else ""
        tail = f": {last}" if last else ""
        if done.exit_code == 0:
            return NodeResult(spec.name, "changed", f"exit 0{tail}")
        return NodeResult(spec.name, "failed", f"exit {done.exit_code}{tail}")

    specs = _specs(ctx, nodes)
    answers = fanout(specs, one, max_workers=min(16, max(1, len(specs))))
    results = [
        a if isinstance(a, NodeResult) else NodeResult(name, "failed", f"{type(a).__name__}: {a}")
        for name, a in answers.items()
    ]
    return dataclasses.replace(_nodes(unit, results), data={"command": command})


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
        return _nodes(unit, results)
    ok = cond.evaluate(view.env())
    return _result(unit, "ok" if ok else "failed", said + core.explain_condition(cond, view.env()))


EXECUTORS: Mapping[str, Executor] = {
    "status": _status,
    "health": _health,
    "cordon": _cordon,
    "uncordon": _uncordon,
    "drain": _drain,
    "consolidate": _consolidate,
    "submit": _submit,
    "cancel": _cancel,
    "reconcile": _reconcile,
    "wait": _wait,
    "run": _run,
    "assert": _assert,
}
