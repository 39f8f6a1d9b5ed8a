"""The fleet as playbook steps see it, and what they call: `Services` (the control loop, a
gatherer, the transport, the health history and rules, who is acting), `View` (one gather, the
store's cordons and allocations: every node's facts and the fleet numbers of conditions), what a
run carries from step to step (`RunContext`) and the shape of a step's executor (`Executor`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gpuctl.adapters.protocols import Transport
from gpuctl.core.health import HealthRules
from gpuctl.core.model import FleetSnapshot, NodeSpec
from gpuctl.core.playbook import Playbook, TargetFacts, Unit
from gpuctl.core.playbook.run import Journal, StepResult
from gpuctl.ops.health import HistoryKeeper

if TYPE_CHECKING:
    from gpuctl.ops.loop import Reconciler


class FleetGatherer(Protocol):
    def gather(self, nodes: Sequence[NodeSpec]) -> FleetSnapshot: ...


@dataclasses.dataclass
class Services:
    """What the steps call: the control loop (store, fleet, job runner, inventory, clock), a
    gatherer, the transport for `run` steps, the health history and rules, who is acting."""

    loop: Reconciler
    gatherer: FleetGatherer
    transport: Transport
    history: HistoryKeeper
    rules: HealthRules
    operator: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    sleep: Callable[[float], None] = time.sleep
    minute_of_day: Callable[[], int] = lambda: _minute_now()


def _minute_now() -> int:
    t = time.localtime()
    return t.tm_hour * 60 + t.tm_min


# --- the fleet as the steps see it ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    snapshot: FleetSnapshot
    facts: Mapping[str, TargetFacts]  # every inventory node, in inventory order
    numbers: Mapping[str, Any]  # the fleet names of conditions

    def env(self, node: str | None = None) -> dict[str, Any]:
        out = dict(self.numbers)
        if node is not None:
            out.update(self.facts[node].env())
        return out


def observe(services: Services, health: Mapping[str, str], targets: int | None = None) -> View:
    """One gather, the store's cordons and allocations: every node's facts (its state as
    `gpuctl status` shows it: `fleetstatus.node_states`) and the numbers."""
    from gpuctl.core.fleet.nodestate import node_status
    from gpuctl.ops.fleetstatus import node_states, numbers

    loop = services.loop
    store, now = loop.store, loop.clock.now()
    snapshot = services.gatherer.gather(loop.inventory.nodes)
    statuses = node_states(snapshot, store)
    holding = store.incarnations(holding=True)
    seen = {n.name: n for n in snapshot.nodes}
    facts: dict[str, TargetFacts] = {}
    for spec in loop.inventory.nodes:
        snap = seen.get(spec.name)
        here = [i for i in holding if i.node == spec.name]
        gpus = snap.gpus if snap is not None else ()
        status = statuses.get(spec.name) or node_status(None)  # not polled: down
        facts[spec.name] = TargetFacts(
            name=spec.name,
            state=status.state.value,
            reach="error" if snap is None else snap.reach.value,
            groups=spec.groups,
            labels=dict(spec.labels),
            health=health.get(spec.name),
            gpus=len(gpus) if snap is not None and snap.observation is not None else None,
            jobs=len({i.job_id for i in here}),
            mem_used_mib=_sum(g.mem_used_mib for g in gpus),
            mem_total_mib=_sum(g.mem_total_mib for g in gpus),
            allocated_mib=sum(i.mib_per_card * len(i.cards) for i in here),
            util_pct=_mean([g.util_pct for g in gpus]),
            temp_c=max((g.temp_c for g in gpus if g.temp_c is not None), default=None),
        )
    figures = numbers(snapshot, store, now).to_dict()  # the names conditions use, as status
    states = [f.state for f in facts.values()]
    figures.update(
        nodes=len(states),
        nodes_ready=states.count("ready"),
        nodes_cordoned=states.count("cordoned") + states.count("draining"),
        nodes_down=states.count("down"),
        nodes_unhealthy=(sum(1 for v in health.values() if v == "unhealthy") if health else None),
        targets=targets,
    )
    return View(snapshot, facts, figures)


def _sum(values: Any) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _mean(values: Sequence[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 1) if known else None


def numbers_line(n: Mapping[str, Any]) -> str:
    def pct(key: str) -> str:
        return "N/A" if n.get(key) is None else f"{n[key]:.1f}%"

    return (
        f"utilization {pct('utilization_pct')} ({n.get('band') or 'N/A'}), fragmentation "
        f"{pct('fragmentation_pct')}, {n.get('nodes_ready')} of {n.get('nodes')} node(s) ready, "
        f"{n.get('nodes_cordoned')} cordoned, {n.get('nodes_down')} down, "
        f"{n.get('queue_waiting')} job(s) waiting, failover success {pct('failover_success_pct')}"
    )


def node_line(f: TargetFacts) -> str:
    mem = "N/A" if f.mem_total_mib is None else f"{f.mem_used_mib or 0}/{f.mem_total_mib} MiB"
    gpus = "N/A" if f.gpus is None else str(f.gpus)
    return f"{f.state}, {gpus} GPU(s), {mem} used, {f.jobs} job(s)"


# --- what a run carries from step to step ----------------------------------------------------


class RunContext:
    """What a run carries from step to step: the journal (targets, health verdicts) and the
    newest view of the fleet (re-read before every step that looks at it)."""

    def __init__(
        self, services: Services, playbook: Playbook, journal: Journal, view: View
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
