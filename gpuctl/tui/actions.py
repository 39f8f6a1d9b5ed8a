"""What the dashboard's action keys call: a plan first (text the operator reads), then `apply`
only when the operator confirms. The dashboard never builds a plan itself: these are the services
behind `gpuctl cordon|uncordon|drain|consolidate` (`gpuctl.ops.nodeops`, `gpuctl.ops.consolidate`),
with the operator recorded as the actor and "operator" as the source.

Drain and consolidation plan on a fresh gather of the fleet; applying them moves jobs (checkpoint,
stop, restart elsewhere), which takes a while: the app runs `apply` in a worker and shows each
job's outcome as it comes (`progress`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from gpuctl.adapters.protocols import Clock, JobRunner, Store
from gpuctl.core.model import FleetSnapshot, Inventory
from gpuctl.errors import GpuctlError
from gpuctl.tui import format as fmt
from gpuctl.tui.services import StoreOpener

if TYPE_CHECKING:
    from gpuctl.ops.migrate import MigrationResult
    from gpuctl.ops.nodeops import DrainPlan
    from gpuctl.ops.reconcile import Reconciler

ACTIONS = ("cordon", "uncordon", "drain", "consolidate")
MAX_MOVES = 10  # consolidation moves per plan (`gpuctl consolidate --max-moves` default)

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True, slots=True)
class ActionPlan:
    """What an action would do. `value` is the service's own plan, handed back to `apply`."""

    action: str
    target: str | None  # a node; None for fleet-wide actions (consolidate)
    text: str  # shown in the confirm dialog, as the CLI prints it
    reason: str | None = None
    value: Any = None
    applicable: bool = True  # False: nothing to apply (nothing to do, or not available)


class ActionService(Protocol):
    def needs_reason(self, action: str) -> bool: ...

    def plan(self, action: str, target: str | None, *, reason: str | None = None) -> ActionPlan: ...

    def apply(self, plan: ActionPlan, progress: Progress | None = None) -> str: ...


class ActionRefused(GpuctlError):
    """An action the service cannot plan or apply."""


class FleetSource(Protocol):
    def gather(self, nodes: Inventory) -> FleetSnapshot: ...


class FleetActions:
    """Cordon and uncordon on the store; drain and consolidation through the control loop's
    migration primitive, over the dashboard's own gatherer and job runner."""

    def __init__(
        self,
        *,
        open_store: StoreOpener,
        clock: Clock,
        operator: str,
        inventory: Inventory,
        fleet: FleetSource,
        runner: JobRunner,
        env: Mapping[str, str] | None = None,
        state_dir: str | None = None,
        max_moves: int = MAX_MOVES,
    ) -> None:
        self.open_store = open_store
        self.clock = clock
        self.operator = operator
        self.inventory = inventory
        self.fleet = fleet
        self.runner = runner
        self.env = dict(env or {})
        self.state_dir = state_dir
        self.max_moves = max_moves

    def needs_reason(self, action: str) -> bool:
        return action in ("cordon", "drain")

    # --- plans --------------------------------------------------------------------------------

    def plan(self, action: str, target: str | None, *, reason: str | None = None) -> ActionPlan:
        if action not in ACTIONS:
            raise ActionRefused(f"unknown action {action!r}")
        if action == "consolidate":
            return self._plan_consolidation()
        if not target:
            raise ActionRefused(f"{action} needs a node")
        if target not in self.inventory.by_name():
            raise ActionRefused(f"{target} is not in the inventory")
        why = (reason or "").strip() or f"from gpuctl dash by {self.operator}"
        if action == "drain":
            return self._plan_drain(target, why)
        with self.open_store(False) as store:
            current = {c.node: c for c in store.cordons()}.get(target)
        if action == "cordon":
            lines = [
                f"cordon {target}: no new work lands there; running jobs stay.",
                f"  reason:   {why}",
                f"  operator: {self.operator} (source: operator)",
            ]
            if current is not None:
                lines.append(
                    f"  replaces: the cordon by {current.operator} ({current.source}): "
                    f"{current.reason}"
                )
            return ActionPlan(action, target, fmt.safe("\n".join(lines)), why)
        if current is None:
            text = f"uncordon {target}: it is not cordoned; nothing to do."
            return ActionPlan(action, target, text, None, applicable=False)
        text = (
            f"uncordon {target}: new work may land there again.\n"
            f"  lifts:    the cordon by {current.operator} ({current.source}): {current.reason}"
        )
        return ActionPlan(action, target, fmt.safe(text), current.reason, value=current)

    def _plan_drain(self, node: str, reason: str) -> ActionPlan:
        from gpuctl.ops import nodeops

        snapshot = self.fleet.gather(self.inventory)
        with self.open_store(False) as store:
            loop = self._loop(store, dry_run=True)
            drain = nodeops.plan_drain(nodeops.tick(loop, snapshot), node, reason=reason)
        return ActionPlan("drain", node, drain_text(drain), reason, value=drain)

    def _plan_consolidation(self) -> ActionPlan:
        from gpuctl.core.consolidation import render_consolidation
        from gpuctl.ops import consolidate as service

        snapshot = self.fleet.gather(self.inventory)
        now = self.clock.now()
        with self.open_store(False) as store:
            inputs = service.gather_inputs(snapshot, store, now)
        plan = service.plan(inputs, now=now, max_moves=self.max_moves)
        text = fmt.safe(render_consolidation(plan).rstrip("\n"))
        return ActionPlan("consolidate", None, text, value=plan, applicable=not plan.empty)

    # --- apply -------------------------------------------------------------------------------

    def apply(self, plan: ActionPlan, progress: Progress | None = None) -> str:
        if not plan.applicable:
            raise ActionRefused(f"{plan.action}: nothing to apply")
        from gpuctl.ops import nodeops

        if plan.action == "cordon" and plan.target is not None:
            with self.open_store(True) as store:
                done = nodeops.cordon(
                    store, plan.target, reason=plan.reason or "", operator=self.operator,
                    clock=self.clock,
                )  # fmt: skip
            return f"{plan.target} cordoned by {done.operator}: {done.reason}"
        if plan.action == "uncordon" and plan.target is not None:
            with self.open_store(True) as store:
                nodeops.uncordon(store, plan.target, operator=self.operator, clock=self.clock)
            return f"{plan.target} uncordoned"
        if plan.action == "drain":
            return self._drain(plan.value, progress)
        if plan.action == "consolidate":
            return self._consolidate(plan.value, progress)
        raise ActionRefused(f"{plan.action}: cannot apply")

    def _drain(self, drain: DrainPlan, progress: Progress | None) -> str:
        from gpuctl.ops import nodeops

        with self.open_store(True) as store:
            loop = self._loop(store, dry_run=False)
            result = nodeops.drain(
                loop, drain, operator=self.operator, on_result=_reporter(progress)
            )
        moved = sum(1 for r in result.results if r.moved)
        return f"{drain.node}: {moved} of {len(result.results)} job(s) moved; cordoned"

    def _consolidate(self, plan: Any, progress: Progress | None) -> str:
        from gpuctl.ops import consolidate as service

        with self.open_store(True) as store:
            loop = self._loop(store, dry_run=False)
            fresh = self.fleet.gather(self.inventory)
            migrator = service.loop_migrator(
                loop, operator=self.operator, snapshot=fresh, on_result=_reporter(progress)
            )
            local = time.localtime(self.clock.now())
            result = service.apply(
                plan,
                current_version=service.current_version(fresh, store),
                migrator=migrator,
                minute_of_day=local.tm_hour * 60 + local.tm_min,
            )
        done = sum(1 for r in result.results if r.landed)
        return f"consolidation: {done} of {len(plan.moves)} move(s) done"

    def _loop(self, store: Store, *, dry_run: bool) -> Reconciler:
        from gpuctl.ops.reconcile import Reconciler, ReconcileSettings

        return Reconciler(
            store,
            self.fleet,
            self.runner,
            self.inventory,
            self.clock,
            ReconcileSettings(dry_run=dry_run),
            environ=self.env,
            state_dir=self.state_dir,
        )


def _reporter(progress: Progress | None) -> Callable[[MigrationResult], None] | None:
    if progress is None:
        return None
    say = progress
    return lambda r: say(fmt.safe(f"{r.job_id}: {r.outcome}: {r.message}"))


def drain_text(plan: DrainPlan) -> str:
    """The drain plan as `gpuctl drain` prints it: each job on the node and where it goes."""
    cordon = (
        "not cordoned yet"
        if plan.cordon is None
        else f"cordoned by {plan.cordon.operator} ({plan.cordon.source}): {plan.cordon.reason}"
    )
    head = (
        f"drain {plan.node}: {plan.reason} ({cordon})\n"
        f"cordon it, then move {len(plan.movable)} of {len(plan.moves)} job(s) off it "
        "(checkpoint, stop, restart there from the checkpoint)"
    )
    if not plan.moves:
        return fmt.safe(f"drain {plan.node}: {plan.reason} ({cordon})\nno jobs on the node")
    rows = []
    for m in plan.moves:
        ckpt = "none"
        if m.checkpoint_step is not None:
            age = "" if m.checkpoint_age_s is None else f", {fmt.human_s(m.checkpoint_age_s)} old"
            ckpt = f"step {m.checkpoint_step}{age}"
        to = m.to_node or f"stays: {m.why_not}"
        cards = ",".join(str(c) for c in m.to_cards) or "-"
        rows.append([m.job_id, str(m.incarnation), ",".join(map(str, m.cards)), to, cards, ckpt])
    table = fmt.table_text(["JOB", "INC", "CARDS", "TO", "CARDS", "CHECKPOINT"], rows)
    return fmt.safe(f"{head}\n{table}")
