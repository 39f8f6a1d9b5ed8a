"""What the dashboard's action keys call: a plan first (text the operator reads), then `apply`
only when the operator confirms. The dashboard never builds a plan itself.

`StoreActions` does cordon and uncordon on the state store (the cordon and its audit event in one
transaction, actor = the operator, source "operator"). Drain and consolidation belong to the
services of `gpuctl drain` / `gpuctl consolidate`; until those ship, their plan says so and there
is nothing to apply.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from gpuctl.adapters.protocols import Clock
from gpuctl.core.jobs import Cordon, Event
from gpuctl.errors import GpuctlError
from gpuctl.tui.services import StoreOpener

ACTIONS = ("cordon", "uncordon", "drain", "consolidate")
NOT_AVAILABLE = "not available in this version"


@dataclasses.dataclass(frozen=True, slots=True)
class ActionPlan:
    """What an action would do. `value` is the service's own plan, handed back to `apply`."""

    action: str
    target: str | None  # a node; None for fleet-wide actions (consolidate)
    text: str  # shown in the confirm dialog, as the CLI would print it
    reason: str | None = None
    value: Any = None
    applicable: bool = True  # False: nothing to apply (already so, or not available)


class ActionService(Protocol):
    def needs_reason(self, action: str) -> bool: ...

    def plan(self, action: str, target: str | None, *, reason: str | None = None) -> ActionPlan: ...

    def apply(self, plan: ActionPlan) -> str: ...  # one line: what was done


class ActionRefused(GpuctlError):
    """An action the service cannot plan or apply."""


class StoreActions:
    """Cordon and uncordon through the store; drain and consolidation not yet available."""

    def __init__(self, open_store: StoreOpener, clock: Clock, operator: str) -> None:
        self.open_store = open_store
        self.clock = clock
        self.operator = operator

    def needs_reason(self, action: str) -> bool:
        return action in ("cordon", "drain")

    def plan(self, action: str, target: str | None, *, reason: str | None = None) -> ActionPlan:
        if action not in ACTIONS:
            raise ActionRefused(f"unknown action {action!r}")
        if action in ("drain", "consolidate"):
            what = f"{action} {target}" if target else action
            return ActionPlan(
                action, target, f"{what}: {NOT_AVAILABLE} of gpuctl.", reason, applicable=False
            )
        if not target:
            raise ActionRefused(f"{action} needs a node")
        with self.open_store(False) as store:
            current = {c.node: c for c in store.cordons()}.get(target)
        if action == "cordon":
            why = (reason or "").strip() or f"cordoned from gpuctl dash by {self.operator}"
            lines = [
                f"cordon {target}: no new work is placed on it; running jobs stay.",
                f"  reason:   {why}",
                f"  operator: {self.operator} (source: operator)",
            ]
            if current is not None:
                lines.append(
                    f"  replaces: the cordon by {current.operator} ({current.source}): "
                    f"{current.reason}"
                )
            return ActionPlan(action, target, "\n".join(lines), why)
        if current is None:
            return ActionPlan(
                action,
                target,
                f"uncordon {target}: it is not cordoned; nothing to do.",
                None,
                applicable=False,
            )
        text = (
            f"uncordon {target}: new work may be placed on it again.\n"
            f"  lifts:    the cordon by {current.operator} ({current.source}): {current.reason}"
        )
        return ActionPlan(action, target, text, current.reason, value=current)

    def apply(self, plan: ActionPlan) -> str:
        if not plan.applicable or plan.target is None:
            raise ActionRefused(f"{plan.action}: nothing to apply")
        now = self.clock.now()
        node = plan.target
        if plan.action == "cordon":
            why = plan.reason or ""
            event = Event(
                now,
                self.operator,
                "cordon",
                f"cordoned {node}: {why}",
                node=node,
                outcome="ok",
                data={"reason": why, "source": "operator", "via": "dash"},
            )
            with self.open_store(True) as store:
                store.cordon(Cordon(node, why, self.operator, "operator", now), event)
            return f"cordoned {node}"
        if plan.action == "uncordon":
            event = Event(
                now,
                self.operator,
                "uncordon",
                f"uncordoned {node}",
                node=node,
                outcome="ok",
                data={"source": "operator", "via": "dash"},
            )
            with self.open_store(True) as store:
                store.uncordon(node, event)
            return f"uncordoned {node}"
        raise ActionRefused(f"{plan.action}: {NOT_AVAILABLE}")
