"""The operator actions' values: a plan (`ActionPlan`), what carrying one out did (`Applied`), and
what the dashboard's action keys call (`ActionService`). Apart from `gpuctl.ops.actions` (the
service that plans and applies them over the control loop), so that the dashboard, which only
calls an action service, does not depend on how the actions are carried out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from gpuctl.errors import GpuctlError

ACTIONS = ("cordon", "uncordon", "drain", "consolidate", "cancel", "kill")

Progress = Callable[[str], None]  # one line per job's outcome, as it comes


@dataclasses.dataclass(frozen=True, slots=True)
class ActionPlan:
    """What an action would do. `value` is the service's own plan, handed back to `carry_out`."""

    action: str
    target: str | None  # a node, a job (cancel, kill); None for fleet-wide actions (consolidate)
    text: str  # the plan as the operator reads it (node and store text: shells strip escapes)
    reason: str | None = None
    value: Any = None
    applicable: bool = True  # False: nothing to apply (nothing to do, or not available)


@dataclasses.dataclass(frozen=True, slots=True)
class Applied:
    """What carrying out a plan did: one line (the dashboard's notification, the CLI's last
    line) and the service's result (`DrainResult`, `consolidate.ApplyResult`, the `Cordon`
    written or lifted)."""

    message: str
    value: Any = None
    complete: bool = True


class ActionService(Protocol):
    """What the dashboard's action keys call."""

    def needs_reason(self, action: str) -> bool: ...

    def plan(self, action: str, target: str | None, *, reason: str | None = None) -> ActionPlan: ...

    def apply(self, plan: ActionPlan, progress: Progress | None = None) -> str: ...


class ActionRefused(GpuctlError):
    """An action the service cannot plan or apply."""
