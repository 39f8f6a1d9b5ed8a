"""The playbook step kinds that act on each target node (`gpuctl.core.playbook.NODE_KINDS`):
health, cordon, uncordon, drain, and `run` (a command on every node through the transport). Each
gives one `NodeResult` per node."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpuctl.core import playbook as core
from gpuctl.core.model import NodeSpec
from gpuctl.core.playbook import Unit
from gpuctl.core.playbook.run import NodeResult, StepResult, node_step_result
from gpuctl.errors import TransportError
from gpuctl.ops.moves import nodeops
from gpuctl.ops.slurm import SlurmDrains

if TYPE_CHECKING:
    from gpuctl.ops.playbook.model import Executor, RunContext

MAX_RUN_OUTPUT_BYTES = 64 << 10
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x1f\x7f-\x9f]")  # node output is untrusted


def _specs(ctx: RunContext, nodes: Sequence[str]) -> list[NodeSpec]:
    by_name = ctx.services.loop.inventory.by_name()
    return [by_name[n] for n in nodes]


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
    return node_step_result(unit, results)


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
            store,
            n,
            reason=unit.step.options["reason"],
            operator=s.operator,
            clock=s.loop.clock,
            slurm=SlurmDrains.of(s.loop.inventory),
        )
        results.append(NodeResult(n, "changed", "cordoned"))
    return node_step_result(unit, results)


def _uncordon(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    s = ctx.services
    there = {c.node: c for c in s.loop.store.cordons()}
    results = []
    for n in nodes:
        if n not in there:
            results.append(NodeResult(n, "ok", "not cordoned"))
            continue
        nodeops.uncordon(
            s.loop.store,
            n,
            operator=s.operator,
            clock=s.loop.clock,
            slurm=SlurmDrains.of(s.loop.inventory),
        )
        c = there[n]
        results.append(NodeResult(n, "changed", f"uncordoned (was: {c.reason}, by {c.operator})"))
    return node_step_result(unit, results)


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
    return node_step_result(unit, results)


def _run(ctx: RunContext, unit: Unit, nodes: tuple[str, ...]) -> StepResult:
    from gpuctl.ops.fanout import fanout

    o = unit.step.options
    command = core.command_text(o["argv"], o["sudo"])
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
    return dataclasses.replace(node_step_result(unit, results), data={"command": command})


NODE_STEPS: Mapping[str, Executor] = {
    "health": _health,
    "cordon": _cordon,
    "uncordon": _uncordon,
    "drain": _drain,
    "run": _run,
}
