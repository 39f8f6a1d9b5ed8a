"""One refresh of the dashboard, as values: the snapshot, the numbers, each node's placement view,
health verdict and cordon, the jobs (and why each queued one waits), recent events and alerts.

`collect` runs in the dashboard's worker thread (once for `gpuctl dash --once`) and only calls
services: `fleetstatus.fleet_state/numbers`, `ops.jobs.list_jobs`, the placement engine's `plan`
for the queue, `core.health.evaluate_fleet`. Nothing here decides anything of its own; it gathers
what those say into one frozen value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from gpuctl.adapters.protocols import Store
from gpuctl.core.fleet.nodestate import CORDON_EVENT_KINDS, NodeStatus, node_statuses
from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.fleet.scheduler import with_slurm
from gpuctl.core.fleet.view import PlacementMemo
from gpuctl.core.health import HealthRules, NodeVerdict
from gpuctl.core.jobs.model import Cordon, Event, JobState
from gpuctl.core.model import FleetSnapshot, NodeSnapshot, Reach
from gpuctl.core.placement.model import Card, FleetState, PlacementNode, Settings
from gpuctl.errors import GpuctlError, StateError
from gpuctl.ops.dashboard._events import ALL_EVENTS, EventFilter, recent_events
from gpuctl.ops.dashboard._history import DashHistory, HistoryView
from gpuctl.ops.dashboard._sources import Services
from gpuctl.ops.jobs import JobView

EVENT_WINDOW_S = 24 * 3600.0
RECENT_EVENTS = 50
NODE_EVENT_KINDS = CORDON_EVENT_KINDS
NODE_EVENTS = 200
MAX_ALERTS = 100
HEALTH_KEEP = 10  # samples per node kept for the rules that look back (sustained heat)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    status: NodeStatus  # ready, cordoned, draining, down, unknown (`core.fleet.nodestate`)
    snapshot: NodeSnapshot
    placement: PlacementNode | None
    verdict: NodeVerdict | None  # None without health rules
    cordon: Cordon | None
    expected_gpus: int | None
    jobs: tuple[str, ...]  # ids of jobs holding cards on it

    @property
    def reach(self) -> str:
        return self.snapshot.reach.value

    @property
    def state(self) -> str:
        return self.status.state.value


@dataclasses.dataclass(frozen=True, slots=True)
class JobLine:
    view: JobView
    why: str | None  # a queued job: why it waits (the placement plan's reason)


@dataclasses.dataclass(frozen=True, slots=True)
class Alert:
    key: str  # stable across refreshes: rows are updated in place
    severity: str  # warn, critical
    text: str
    node: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DashData:
    now: float
    source: str
    snapshot: FleetSnapshot
    numbers: FleetNumbers
    nodes: tuple[NodeView, ...]
    jobs: tuple[JobLine, ...] = ()
    events: tuple[Event, ...] = ()  # newest first, those `event_filter` keeps
    node_events: tuple[Event, ...] = ()  # cordon / uncordon / drain, newest first
    alerts: tuple[Alert, ...] = ()
    store_error: str | None = None
    reasons: bool = False  # whether `JobLine.why` was worked out (only when a screen shows it)
    event_filter: EventFilter = ALL_EVENTS  # which kinds `events` lists
    history: HistoryView | None = None  # the sparklines' points (`DashHistory`)

    def node(self, name: str) -> NodeView | None:
        return next((n for n in self.nodes if n.name == name), None)

    def job(self, job_id: str) -> JobLine | None:
        return next((j for j in self.jobs if j.view.job.id == job_id), None)


class HealthKeeper:
    """Earlier samples per node in memory, for `core.health.evaluate_fleet` (the dashboard keeps
    its own history; it never writes the CLI's health-history file).

    A sample is kept when it is at least the rules' sample spacing (the sustained-heat window over
    its samples, as `gpuctl health` spreads its polls) after the last one kept: a dashboard that
    polls every second still tells a heat spike from sustained heat, and keeps few samples.
    """

    def __init__(self, keep: int = HEALTH_KEEP) -> None:
        from gpuctl.core.health import VerdictMemo
        from gpuctl.ops.health import SampleHistory

        self.history = SampleHistory(keep=keep)  # in memory
        self.memo = VerdictMemo()  # nodes whose health fields did not move keep their verdict

    def judge(
        self, snapshot: FleetSnapshot, rules: HealthRules, expected: Mapping[str, int | None]
    ) -> dict[str, NodeVerdict]:
        from gpuctl.core.health import evaluate_fleet
        from gpuctl.ops.health import default_interval_s

        t = rules.temperature
        self.history.spacing_s = default_interval_s(rules, max(2, t.sustained_samples))
        self.history.hot_from_c = t.limit_c  # only hot GPUs: all sustained heat reads
        earlier = self.history.record(snapshot.nodes)
        verdicts = evaluate_fleet(
            snapshot, earlier, expected_gpus=expected, rules=rules, memo=self.memo
        )
        return {v.name: v for v in verdicts}


def collect(
    services: Services,
    health: HealthKeeper | None = None,
    *,
    reasons: bool = True,
    placement: PlacementMemo | None = None,
    event_filter: EventFilter = ALL_EVENTS,
    history: DashHistory | None = None,
) -> DashData:
    """One refresh: poll the source, read the store, ask the services. A store that cannot be
    read leaves the fleet view intact (`store_error` says why). `reasons`: also plan the queue to
    say why each queued job waits (the costliest part on a large fleet; the dashboard asks for it
    only while the queue or a job is on screen). `health`, `placement` and `history` (the
    sparklines' points) carry what the app keeps from one poll to the next; `event_filter`:
    which kinds of events to list."""
    from gpuctl.ops import fleetstatus

    snapshot = services.source.poll()
    now = services.clock.now()
    store_error = None
    try:
        with services.open_store(False) as store:
            data = _with_store(
                services, health, snapshot, now, store, reasons, placement, event_filter
            )
            if history is None:
                return data
            return dataclasses.replace(
                data, history=history.update(store, now, data.numbers, snapshot)
            )
    except StateError as exc:
        store_error = exc.message
    state = fleetstatus.fleet_state(snapshot, None, versioned=False, memo=placement)
    numbers = fleetstatus.numbers(snapshot, None, now, state=state)
    data = _assemble(services, health, snapshot, now, state, numbers, store_error=store_error)
    if history is None:
        return data
    return dataclasses.replace(data, history=history.update(None, now, numbers, snapshot))


def _with_store(
    services: Services,
    health: HealthKeeper | None,
    snapshot: FleetSnapshot,
    now: float,
    store: Store,
    reasons: bool,
    placement: PlacementMemo | None,
    event_filter: EventFilter = ALL_EVENTS,
) -> DashData:
    from gpuctl.ops import fleetstatus
    from gpuctl.ops.jobs import list_jobs

    state = fleetstatus.fleet_state(snapshot, store, versioned=False, memo=placement)
    numbers = fleetstatus.numbers(snapshot, store, now, state=state)
    views = list_jobs(store)
    whys = waiting_reasons(state, views, services.settings) if reasons else {}
    jobs = tuple(JobLine(v, whys.get(v.job.id)) for v in views)
    events = recent_events(store, now - EVENT_WINDOW_S, RECENT_EVENTS, event_filter)
    node_events = tuple(reversed(store.events(kinds=NODE_EVENT_KINDS, limit=NODE_EVENTS)))
    holding: dict[str, list[str]] = {}
    for inc in store.incarnations(holding=True):
        holding.setdefault(inc.node, []).append(inc.job_id)
    moving = frozenset(r.job_id for r in store.reservations())
    return _assemble(
        services,
        health,
        snapshot,
        now,
        state,
        numbers,
        cordons={c.node: c for c in store.cordons()},
        holding=holding,
        moving=moving,
        jobs=jobs,
        events=events,
        node_events=node_events,
        reasons=reasons,
        event_filter=event_filter,
    )


def waiting_reasons(
    state: FleetState, views: Sequence[JobView], settings: Settings
) -> dict[str, str]:
    """Why each queued job waits: the placement plan's reason for it on the current state (as
    the control loop's next pass would see it); a job that fits waits for that pass."""
    from gpuctl.core.placement.engine import plan
    from gpuctl.core.placement.plan import Placed
    from gpuctl.ops.jobs import ids_by_name, job_request

    queued = [v.job for v in views if v.job.state is JobState.QUEUED]
    if not queued:
        return {}
    ids = ids_by_name(v.job for v in views)
    whys: dict[str, str] = {}
    requests = []
    for job in queued:
        if job.cancel_requested:
            whys[job.id] = "cancel requested"
            continue
        requests.append(job_request(job, ids))  # the typed spec: nothing left to read wrong
    if requests:
        try:
            result = plan(state, requests, settings)
        except GpuctlError as exc:
            return whys | {r.name: f"cannot plan: {exc.message}" for r in requests}
        for outcome in result.jobs:
            if isinstance(outcome, Placed):
                cards = ",".join(str(c) for c in outcome.cards)
                whys[outcome.job] = (
                    f"fits on {outcome.node} (cards {cards}): waits for the control loop"
                )
            else:
                whys[outcome.job] = outcome.reason
    return whys


def _assemble(
    services: Services,
    health: HealthKeeper | None,
    snapshot: FleetSnapshot,
    now: float,
    state: FleetState,
    numbers: FleetNumbers,
    *,
    cordons: Mapping[str, Cordon] | None = None,
    holding: Mapping[str, Sequence[str]] | None = None,
    moving: frozenset[str] = frozenset(),
    jobs: tuple[JobLine, ...] = (),
    events: tuple[Event, ...] = (),
    node_events: tuple[Event, ...] = (),
    store_error: str | None = None,
    reasons: bool = False,
    event_filter: EventFilter = ALL_EVENTS,
) -> DashData:
    cordons = cordons or {}
    holding = holding or {}
    verdicts: dict[str, NodeVerdict] = {}
    if services.rules is not None:
        keeper = health or HealthKeeper()
        verdicts = keeper.judge(snapshot, services.rules, services.expected_gpus)
    placement = {n.name: n for n in state.nodes}
    statuses = with_slurm(  # Slurm's drains and DOWN nodes, where gpuctl has no cordon
        node_statuses(snapshot.nodes, cordons, node_events, holding, moving), snapshot.scheduler
    )
    nodes = tuple(
        NodeView(
            name=n.name,
            status=statuses[n.name],
            snapshot=n,
            placement=placement.get(n.name),
            verdict=verdicts.get(n.name),
            cordon=cordons.get(n.name),
            expected_gpus=services.expected_gpus.get(n.name),
            jobs=tuple(sorted(set(holding.get(n.name, ())))),
        )
        for n in snapshot.nodes
    )
    return DashData(
        now=now,
        source=services.source.label,
        snapshot=snapshot,
        numbers=numbers,
        nodes=nodes,
        jobs=jobs,
        events=events,
        node_events=node_events,
        alerts=alerts(nodes, jobs, store_error),
        store_error=store_error,
        reasons=reasons,
        event_filter=event_filter,
    )


def alerts(
    nodes: Sequence[NodeView], jobs: Sequence[JobLine], store_error: str | None
) -> tuple[Alert, ...]:
    """What needs an operator now: the store, nodes not answering, health verdicts that are not
    ok, memory in use beyond gpuctl's allocations, held jobs. Worst first, at most MAX_ALERTS
    (warnings past that many are not even worded: a fleet full of ghost memory costs nothing)."""
    critical: list[Alert] = []
    warn: list[Alert] = []
    if store_error:
        critical.append(Alert("store", "critical", f"job figures unavailable: {store_error}"))
    for n in nodes:
        if n.snapshot.reach is not Reach.OK:
            why = n.snapshot.error or "no answer"
            critical.append(
                Alert(f"down:{n.name}", "critical", f"{n.name} {n.reach}: {why}", n.name)
            )
            continue
        v = n.verdict
        if v is not None and v.reasons and v.severity.value != "ok":
            sev = "critical" if v.severity.value in ("critical", "unknown") else "warn"
            if sev == "critical" or len(warn) < MAX_ALERTS:
                more = f" (+{len(v.reasons) - 1} more)" if len(v.reasons) > 1 else ""
                text = f"{n.name} {v.verdict.value}: {v.reasons[0].text}{more}"
                (critical if sev == "critical" else warn).append(
                    Alert(f"health:{n.name}", sev, text, n.name)
                )
        if n.placement is not None and len(warn) < MAX_ALERTS:
            ghost = _ghost_alert(n.name, n.placement.cards)
            if ghost is not None:
                warn.append(ghost)
    for j in jobs:
        if j.view.job.state is JobState.HELD and len(warn) < MAX_ALERTS:
            job = j.view.job
            warn.append(Alert(f"held:{job.id}", "warn", f"job {job.id} held: {job.reason or '-'}"))
    return tuple((critical + warn)[:MAX_ALERTS])


def _ghost_alert(node: str, cards: Sequence[Card]) -> Alert | None:
    """One alert per node for memory in use beyond gpuctl's allocations (ghost memory on a card
    nothing was granted on, or a job over its slice), naming the cards: one row per node keeps
    the list readable (and stable) on a fleet full of work gpuctl did not place."""
    over = [c for c in cards if c.ghost_mib > 0]
    if not over:
        return None
    gib = sum(c.ghost_mib for c in over) / 1024
    granted = {c.allocated_mib > 0 for c in over}
    if len(over) == 1:
        what = "ghost memory" if granted == {False} else "beyond its allocation"
        where = f"GPU {over[0].index}"
    else:
        what = {
            frozenset({False}): "ghost memory",
            frozenset({True}): "beyond their allocations",
        }.get(frozenset(granted), "ghost memory and beyond allocations")
        where = "GPUs " + ",".join(str(c.index) for c in over)
    return Alert(f"ghost:{node}", "warn", f"{node} {where}: {gib:.1f} GiB {what}", node)
