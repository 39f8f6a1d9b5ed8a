"""Running one playbook step (`execute`): its `when`, then its kind, each kind a call into a gpuctl
service with a result per node; A service
error (`GpuctlError`) fails the step as a value; anything else is a bug and propagates (the run is
then resumable). The kinds: `_node_steps` (those that act on each target node)
and `_fleet_steps` (the others); what each would do, for the dry run:
`_preview`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpuctl.core import playbook as core
from gpuctl.core.playbook import Unit
from gpuctl.core.playbook.run import (
    NodeResult,
    StepResult,
    aggregate,
    node_step_result,
    step_result,
)
from gpuctl.errors import GpuctlError
from gpuctl.ops.playbook._fleet_steps import FLEET_STEPS
from gpuctl.ops.playbook._node_steps import NODE_STEPS
from gpuctl.ops.playbook.model import Executor, RunContext


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
                    return step_result(unit, "skipped", f"when: {why}")
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
            return node_step_result(unit, skipped, "no target node")
        result = EXECUTORS[step.kind](ctx, unit, nodes)
        if skipped:
            merged = tuple(
                sorted((*result.nodes, *skipped), key=lambda r: unit.nodes.index(r.node))
            )
            return dataclasses.replace(result, nodes=merged, outcome=aggregate(merged))
        return result
    except GpuctlError as exc:
        return step_result(unit, "failed", exc.message)
    finally:
        ctx.changed()


EXECUTORS: Mapping[str, Executor] = {**FLEET_STEPS, **NODE_STEPS}
