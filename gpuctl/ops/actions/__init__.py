"""The operator's actions on the fleet, planned first and applied only once confirmed: cordon,
uncordon, drain and consolidate, behind both `gpuctl cordon|uncordon|drain|consolidate` and the
dashboard's action keys, and the dashboard's cancel of a job (`_jobs`: the cancel of `gpuctl
cancel`, `kill` its `--force`). A plan is text the operator reads (the same in a terminal and in the
dashboard's confirm dialog) and the service's own plan, handed back to `carry_out`.

Cordon and uncordon write the store (`gpuctl.ops.moves.nodeops`). Drain and consolidation plan on a
fresh gather of the fleet and a dry-run control loop over the store read-only; carrying them out
opens the store for writing, gathers again and moves jobs through the control loop's migration
primitive (checkpoint, stop, restart elsewhere), saying each job's outcome as it comes
(`progress`), which takes a while. The operator is recorded as the actor, "operator" as the source.

This front re-exports the package's public names: the values in `model` (which the dashboard's
services import without the rest), `FleetActions` with the drain plan's text (`_fleet`) and
the plans over one node or several at once (`_batch`: the dashboard's keys and the commands plan
the same way).
"""

from __future__ import annotations

from gpuctl.ops.action_plans import (
    ACTIONS,
    ActionPlan,
    ActionRefused,
    ActionService,
    Applied,
    Progress,
)
from gpuctl.ops.actions._batch import DrainOrder, NodeBatch, NodeOutcome, drain_text
from gpuctl.ops.actions._fleet import MAX_MOVES, ConsolidationOrder, FleetActions
from gpuctl.ops.actions._jobs import CancelOrder

__all__ = [
    "ACTIONS",
    "MAX_MOVES",
    "ActionPlan",
    "ActionRefused",
    "ActionService",
    "Applied",
    "CancelOrder",
    "ConsolidationOrder",
    "DrainOrder",
    "FleetActions",
    "NodeBatch",
    "NodeOutcome",
    "Progress",
    "drain_text",
]
