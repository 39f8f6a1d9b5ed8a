"""`FleetActions`: cordon, uncordon, drain and consolidate, each planned then carried out (see
the package's front), and the drain plan's text."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuctl.adapters.protocols import Clock, JobRunner, Store
from gpuctl.core.jobs.migration import DEFAULT_TIMEOUT_S
from gpuctl.core.jobs.model import JobState
from gpuctl.core.model import Inventory
from gpuctl.ops.action_plans import ACTIONS, ActionPlan, ActionRefused, Applied, Progress
from gpuctl.ops.actions._jobs import JOB_ACTIONS, CancelOrder, carry_out_cancel, plan_cancel
from gpuctl.ops.loop import control_loop
from gpuctl.ops.parts import FleetReader, minute_of_day, sleep_of
from gpuctl.ops.stores import SessionStore

if TYPE_CHECKING:
    from gpuctl.core.consolidation import ConsolidationPlan
    from gpuctl.core.placement.model import JobRequest
    from gpuctl.ops.loop import Reconciler
    from gpuctl.ops.moves.consolidate import Window
    from gpuctl.ops.moves.migrate import MigrationResult

MAX_MOVES = 10  # consolidation moves per plan (`gpuctl consolidate --max-moves` default)


@dataclasses.dataclass(frozen=True, slots=True)
class ConsolidationOrder:
    """A consolidation plan and how to carry it out: only inside `window`, `parallel` at once."""

    plan: ConsolidationPlan
    window: Window | None = None
    parallel: int = 1
    job_versions: Mapping[str, int] = dataclasses.field(default_factory=dict)  # as planned on


class FleetActions:
    """Cordon and uncordon on the store; drain and consolidation through the control loop's
    migration primitive, over the caller's fleet reader and job runner (the dashboard's own, or
    the command's; without them only cordon and uncordon can be planned: they never reach the
    nodes). Waits pass on `clock` (`parts.sleep_of`)."""

    def __init__(
        self,
        *,
        open_store: SessionStore,
        clock: Clock,
        operator: str,
        inventory: Inventory,
        fleet: FleetReader | None = None,
        runner: JobRunner | None = None,
        env: Mapping[str, str] | None = None,
        state_dir: Path | str | None = None,
        max_moves: int = MAX_MOVES,
    ) -> None:
        self.open_store = open_store
        self.clock = clock
        self.operator = operator
        self.inventory = inventory
        self.fleet = fleet
        self.runner = runner
        self.env = dict(env or {})
        self.state_dir = None if state_dir is None else Path(state_dir)
        self.max_moves = max_moves

    def minute_of_day(self) -> int:
        """The local time now on the service's clock (maintenance windows read it)."""
        return minute_of_day(self.clock)

    # --- the dashboard's keys -------------------------------------------------------------------

    def needs_reason(self, action: str) -> bool:
        return action in ("cordon", "drain")

    def plan(self, action: str, target: str | None, *, reason: str | None = None) -> ActionPlan:
        """The plan for a dashboard key; a cordon or drain without a reason says it came from
        the dashboard. `cancel` and `kill` take a job (`gpuctl cancel`, `--force`)."""
        if action not in ACTIONS:
            raise ActionRefused(f"unknown action {action!r}")
        if action == "consolidate":
            return self.plan_consolidation()
        if action in JOB_ACTIONS:
            return plan_cancel(self, target or "", force=action == "kill")
        if not target:
            raise ActionRefused(f"{action} needs a node")
        why = (reason or "").strip() or f"from gpuctl dash by {self.operator}"
        return self.plan_nodes(action, [target], None if action == "uncordon" else why)

    def apply(self, plan: ActionPlan, progress: Progress | None = None) -> str:
        """Carry out a dashboard key's plan: what it did, or an error where it failed on the
        node (another operator's change since the plan: the same outcome `gpuctl cordon` reports
        for that node)."""
        from gpuctl.ops.actions._batch import NodeBatch

        done = self.carry_out(plan, progress)
        if isinstance(plan.value, NodeBatch) and any(o.outcome == "failed" for o in done.value):
            raise ActionRefused(done.message)
        return done.message

    # --- plans --------------------------------------------------------------------------------

    def plan_consolidation(
        self,
        *,
        max_moves: int | None = None,
        target: JobRequest | None = None,
        window: Window | None = None,
        parallel: int = 1,
    ) -> ActionPlan:
        """Moves that free whole cards and nodes (or make room for `target`), on a fresh gather
        (`value`: a `ConsolidationOrder`)."""
        from gpuctl.core.consolidation import render_consolidation
        from gpuctl.ops.moves import consolidate as service

        snapshot = self.fleet_reader().gather(self.inventory)
        now = self.clock.now()
        with self.open_store(False) as store:
            inputs = service.gather_inputs(snapshot, store, now)
            seen = {j.id: j.version for j in store.jobs([JobState.RUNNING])}
        moves = self.max_moves if max_moves is None else max_moves
        plan = service.plan(inputs, now=now, max_moves=moves, target=target)
        versions = {m.job: seen[m.job] for m in plan.moves if m.job in seen}
        return ActionPlan(
            "consolidate",
            None,
            render_consolidation(plan).rstrip("\n"),
            value=ConsolidationOrder(plan, window, parallel, versions),
            applicable=not plan.empty,
        )

    def plan_nodes(
        self,
        action: str,
        nodes: Sequence[str],
        reason: str | None = None,
        *,
        grace_s: float | None = None,
        checkpoint_wait_s: float | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        parallel: int = 2,
    ) -> ActionPlan:
        """One plan to cordon, uncordon or drain every node of `nodes` (`value`: a `NodeBatch`;
        carrying it out gives each node's `NodeOutcome`)."""
        from gpuctl.ops.actions._batch import plan_batch

        return plan_batch(
            self, action, nodes, reason, grace_s=grace_s, checkpoint_wait_s=checkpoint_wait_s,
            timeout_s=timeout_s, parallel=parallel,
        )  # fmt: skip

    # --- carrying a plan out -------------------------------------------------------------------

    def carry_out(self, plan: ActionPlan, progress: Progress | None = None) -> Applied:
        if not plan.applicable:
            raise ActionRefused(f"{plan.action}: nothing to apply")
        from gpuctl.ops.actions._batch import NodeBatch, carry_out_batch

        if isinstance(plan.value, NodeBatch):
            return carry_out_batch(self, plan, progress)
        if isinstance(plan.value, CancelOrder):
            return carry_out_cancel(self, plan.value)

        if plan.action == "consolidate":
            return self._consolidate(plan.value, progress)
        raise ActionRefused(f"{plan.action}: cannot apply")

    def _consolidate(self, order: ConsolidationOrder, progress: Progress | None) -> Applied:
        from gpuctl.ops.moves import consolidate as service

        with self.open_store(True) as store:
            loop = self.loop(store, dry_run=False)
            fresh = self.fleet_reader().gather(self.inventory)
            migrator = service.loop_migrator(
                loop,
                operator=self.operator,
                snapshot=fresh,
                on_result=reporter(progress),
                sleep=sleep_of(self.clock),
                versions=order.job_versions,
            )
            result = service.apply(
                order.plan,
                current_version=service.current_version(fresh, store),
                migrator=migrator,
                window=order.window,
                minute_of_day=self.minute_of_day(),
                parallel=order.parallel,
            )
        done = sum(1 for r in result.results if r.landed)
        said = f"consolidation: {done} of {len(order.plan.moves)} move(s) done"
        return Applied(said, result, result.complete)

    # --- parts ---------------------------------------------------------------------------------

    def known(self, node: str) -> None:
        if node not in self.inventory.by_name():
            raise ActionRefused(f"{node} is not in the inventory")

    def fleet_reader(self) -> FleetReader:
        if self.fleet is None:
            raise ActionRefused("drain and consolidation need the fleet: none was given")
        return self.fleet

    def loop(self, store: Store, *, dry_run: bool) -> Reconciler:
        from gpuctl.ops.loop import ReconcileSettings

        if self.runner is None:
            raise ActionRefused("drain and consolidation need a job runner: none was given")
        return control_loop(
            store,
            self.fleet_reader(),
            self.runner,
            self.inventory,
            self.clock,
            settings=ReconcileSettings(dry_run=dry_run),
            env=self.env,
            state_dir=self.state_dir,
        )


def reporter(progress: Progress | None) -> Callable[[MigrationResult], None] | None:
    if progress is None:
        return None
    say = progress
    return lambda r: say(f"{r.job_id}: {r.outcome}: {r.message}")
