"""A placement plan is a value: printable, JSON-serialisable, diffable, and applicable later.

A `Plan` carries the fleet-state version it was computed from, the settings, one outcome per job
(`Placed` with node, cards, score and runner-up; or `Unplaced` with the constraints that failed
on how many nodes), utilization before and after, and the per-card usage it predicts for every
node it touches. `apply_plan` turns a state into the predicted one, refusing a stale plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from gpuctl.core.placement.model import Allocation, FleetState, Settings, Tier
from gpuctl.errors import PlanError

PLAN_FORMAT = 1


@dataclasses.dataclass(frozen=True, slots=True)
class RunnerUp:
    node: str
    score: float


@dataclasses.dataclass(frozen=True, slots=True)
class Rejection:
    """Nodes that failed one constraint for one job, for one shared reason."""

    constraint: str  # unschedulable, node_affinity, node_anti_affinity, job_anti_affinity,
    # gpu_model, card_size, gpu_count, cpu, host_memory, empty_cards, card_memory, band, policy
    summary: str  # "too few empty cards (needs 2)"
    nodes: tuple[str, ...]  # sorted

    @property
    def count(self) -> int:
        return len(self.nodes)


@dataclasses.dataclass(frozen=True, slots=True)
class Placed:
    job: str
    allocation: Allocation
    card_uuids: tuple[str | None, ...]
    score: float
    runner_up: RunnerUp | None
    feasible_nodes: int
    shape: str  # how the job-shape policy read the request: "1 × 24.0 GiB slice"
    priority: int = 0
    rejections: tuple[Rejection, ...] = ()  # nodes that could not take it, for --explain

    @property
    def node(self) -> str:
        return self.allocation.node

    @property
    def cards(self) -> tuple[int, ...]:
        return self.allocation.cards

    @property
    def tier(self) -> Tier:
        return self.allocation.tier


@dataclasses.dataclass(frozen=True, slots=True)
class Unplaced:
    job: str
    tier: Tier
    priority: int
    shape: str
    reason: str  # one line: what no node offered
    rejections: tuple[Rejection, ...]


Outcome = Placed | Unplaced


@dataclasses.dataclass(frozen=True, slots=True)
class NodeUsage:
    """A node's allocations after the plan: MiB per card (in card order), CPU and host memory."""

    node: str
    allocated_mib: tuple[int, ...]
    cpu_allocated_milli: int
    host_mem_allocated_mib: int


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    version: str  # the fleet-state version it was computed from
    settings: Settings
    jobs: tuple[Outcome, ...]  # placement order: priority desc, standard before spot, name
    utilization_before: float | None
    utilization_after: float | None
    predicted: tuple[NodeUsage, ...]  # nodes the plan changes, by name
    version_after: str
    nodes_total: int = 0
    nodes_schedulable: int = 0

    @property
    def placed(self) -> tuple[Placed, ...]:
        return tuple(j for j in self.jobs if isinstance(j, Placed))

    @property
    def unplaced(self) -> tuple[Unplaced, ...]:
        return tuple(j for j in self.jobs if isinstance(j, Unplaced))

    @property
    def all_placed(self) -> bool:
        return not self.unplaced


def successor_version(version: str, allocations: Iterable[Allocation]) -> str:
    """The version of a state after `allocations` were added to the state at `version`."""
    body = json.dumps(
        [version, [a.to_dict() for a in allocations]], sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(body.encode()).hexdigest()[:16]


# --- applying --------------------------------------------------------------------------------


def apply_plan(state: FleetState, plan: Plan) -> FleetState:
    """The state with the plan's allocations added. Raises PlanError for a stale plan (its
    version differs from the state's) or one the state cannot hold."""
    if plan.version != state.version:
        raise PlanError(
            f"the plan was computed from fleet version {plan.version or '(none)'}, "
            f"the fleet is now at {state.version or '(none)'}",
            hint="compute the plan again",
        )
    nodes = {n.name: n for n in state.nodes}
    known = {a.job for a in state.allocations}
    added: list[Allocation] = []
    for outcome in plan.placed:
        a = outcome.allocation
        node = nodes.get(a.node)
        if node is None or not node.schedulable:
            raise PlanError(f"job {a.job}: node {a.node} is not schedulable in this state")
        if a.job in known:
            raise PlanError(f"job {a.job} already has an allocation")
        known.add(a.job)
        cards = {c.index: c for c in node.cards}
        new_cards = dict(cards)
        for i in a.cards:
            card = cards.get(i)
            if card is None:
                raise PlanError(f"job {a.job}: node {a.node} has no card {i}")
            take = card.capacity_mib if a.whole else a.mib_per_card
            if (a.whole and not card.empty) or card.free_mib < take:
                raise PlanError(f"job {a.job}: card {i} of {a.node} cannot take it")
            new_cards[i] = card._replace(allocated_mib=card.allocated_mib + take)
        if node.cpu_free_milli is not None and node.cpu_free_milli < a.cpu_milli:
            raise PlanError(f"job {a.job}: node {a.node} lacks the CPU")
        if node.host_mem_free_mib is not None and node.host_mem_free_mib < a.host_mem_mib:
            raise PlanError(f"job {a.job}: node {a.node} lacks the host memory")
        nodes[a.node] = dataclasses.replace(
            node,
            cards=tuple(new_cards[c.index] for c in node.cards),
            cpu_allocated_milli=node.cpu_allocated_milli + a.cpu_milli,
            host_mem_allocated_mib=node.host_mem_allocated_mib + a.host_mem_mib,
        )
        added.append(a)
    return FleetState(
        nodes=tuple(nodes[n.name] for n in state.nodes),
        allocations=(*state.allocations, *added),
        version=successor_version(state.version, added),
    )


def usage_of(state: FleetState, names: Iterable[str]) -> tuple[NodeUsage, ...]:
    """The `NodeUsage` of the named nodes in `state`, by name (what a plan predicts)."""
    wanted = set(names)
    return tuple(
        NodeUsage(
            node=n.name,
            allocated_mib=tuple(c.allocated_mib for c in n.cards),
            cpu_allocated_milli=n.cpu_allocated_milli,
            host_mem_allocated_mib=n.host_mem_allocated_mib,
        )
        for n in sorted(state.nodes, key=lambda n: n.name)
        if n.name in wanted
    )


# --- JSON round trip -------------------------------------------------------------------------


def _rejections_to_list(rs: Iterable[Rejection]) -> list[dict[str, Any]]:
    return [
        {"constraint": r.constraint, "summary": r.summary, "count": r.count, "nodes": list(r.nodes)}
        for r in rs
    ]


def _rejections_from_list(items: Iterable[Mapping[str, Any]]) -> tuple[Rejection, ...]:
    return tuple(
        Rejection(
            constraint=str(r["constraint"]),
            summary=str(r["summary"]),
            nodes=tuple(str(n) for n in r["nodes"]),
        )
        for r in items
    )


def _outcome_to_dict(o: Outcome) -> dict[str, Any]:
    if isinstance(o, Placed):
        return {
            "job": o.job,
            "placed": True,
            "node": o.node,
            "cards": list(o.cards),
            "card_uuids": list(o.card_uuids),
            "mib_per_card": o.allocation.mib_per_card,
            "whole": o.allocation.whole,
            "tier": o.tier.value,
            "priority": o.priority,
            "shape": o.shape,
            "score": o.score,
            "runner_up": None
            if o.runner_up is None
            else {"node": o.runner_up.node, "score": o.runner_up.score},
            "feasible_nodes": o.feasible_nodes,
            "allocation": o.allocation.to_dict(),
            "rejections": _rejections_to_list(o.rejections),
        }
    return {
        "job": o.job,
        "placed": False,
        "tier": o.tier.value,
        "priority": o.priority,
        "shape": o.shape,
        "reason": o.reason,
        "rejections": _rejections_to_list(o.rejections),
    }


def _outcome_from_dict(d: Mapping[str, Any]) -> Outcome:
    if d["placed"]:
        ru = d.get("runner_up")
        return Placed(
            job=str(d["job"]),
            allocation=Allocation.from_dict(d["allocation"]),
            card_uuids=tuple(None if u is None else str(u) for u in d["card_uuids"]),
            score=float(d["score"]),
            runner_up=None if ru is None else RunnerUp(str(ru["node"]), float(ru["score"])),
            feasible_nodes=int(d["feasible_nodes"]),
            shape=str(d["shape"]),
            priority=int(d["priority"]),
            rejections=_rejections_from_list(d.get("rejections") or ()),
        )
    return Unplaced(
        job=str(d["job"]),
        tier=Tier(d["tier"]),
        priority=int(d["priority"]),
        shape=str(d["shape"]),
        reason=str(d["reason"]),
        rejections=_rejections_from_list(d.get("rejections") or ()),
    )


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    s = plan.settings
    return {
        "format": PLAN_FORMAT,
        "version": plan.version,
        "version_after": plan.version_after,
        "settings": {
            "policy": s.policy,
            "whole_card_over": s.whole_card_over,
            "band_max": s.band_max,
            "headroom": s.headroom,
            "spot_uses_headroom": s.spot_uses_headroom,
            "standard_limit": s.standard_limit,
            "spot_limit": s.spot_limit,
        },
        "summary": {
            "jobs": len(plan.jobs),
            "placed": len(plan.placed),
            "unplaced": len(plan.unplaced),
            "nodes": plan.nodes_total,
            "schedulable_nodes": plan.nodes_schedulable,
        },
        "utilization_before": plan.utilization_before,
        "utilization_after": plan.utilization_after,
        "jobs": [_outcome_to_dict(o) for o in plan.jobs],
        "predicted": [
            {
                "node": u.node,
                "allocated_mib": list(u.allocated_mib),
                "cpu_allocated_milli": u.cpu_allocated_milli,
                "host_mem_allocated_mib": u.host_mem_allocated_mib,
            }
            for u in plan.predicted
        ],
    }


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    """Inverse of `plan_to_dict`. Raises PlanError on anything that is not such a document."""
    try:
        if data.get("format") != PLAN_FORMAT:
            raise PlanError(f"not a gpuctl plan of format {PLAN_FORMAT}")
        s = data["settings"]
        summary = data.get("summary") or {}
        return Plan(
            version=str(data["version"]),
            version_after=str(data["version_after"]),
            settings=Settings(
                policy=str(s["policy"]),
                whole_card_over=float(s["whole_card_over"]),
                band_max=float(s["band_max"]),
                headroom=float(s["headroom"]),
                spot_uses_headroom=bool(s["spot_uses_headroom"]),
            ),
            jobs=tuple(_outcome_from_dict(o) for o in data["jobs"]),
            utilization_before=_opt_float(data.get("utilization_before")),
            utilization_after=_opt_float(data.get("utilization_after")),
            predicted=tuple(
                NodeUsage(
                    node=str(u["node"]),
                    allocated_mib=tuple(int(x) for x in u["allocated_mib"]),
                    cpu_allocated_milli=int(u["cpu_allocated_milli"]),
                    host_mem_allocated_mib=int(u["host_mem_allocated_mib"]),
                )
                for u in data["predicted"]
            ),
            nodes_total=int(summary.get("nodes", 0)),
            nodes_schedulable=int(summary.get("schedulable_nodes", 0)),
        )
    except PlanError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanError(f"not a valid plan: {type(exc).__name__}: {exc}") from None


def _opt_float(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


# --- diff ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class JobChange:
    job: str
    kind: str  # added, removed, moved, now_placed, now_unplaced, reason_changed
    before: str | None
    after: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class PlanDiff:
    version_before: str
    version_after: str
    utilization_before: float | None  # each plan's utilization after placement
    utilization_after: float | None
    changes: tuple[JobChange, ...]  # by job name

    @property
    def same(self) -> bool:
        return not self.changes and self.version_before == self.version_after


def _where(o: Outcome) -> str:
    if isinstance(o, Placed):
        return f"{o.node} cards {','.join(map(str, o.cards)) or '-'}"
    return f"unplaced: {o.reason}"


def diff_plans(a: Plan, b: Plan) -> PlanDiff:
    """What changed from plan `a` to plan `b`, job by job."""
    before = {o.job: o for o in a.jobs}
    after = {o.job: o for o in b.jobs}
    changes: list[JobChange] = []
    for job in sorted(before.keys() | after.keys()):
        x, y = before.get(job), after.get(job)
        if x is None:
            assert y is not None
            changes.append(JobChange(job, "added", None, _where(y)))
        elif y is None:
            changes.append(JobChange(job, "removed", _where(x), None))
        elif _where(x) == _where(y):
            continue
        elif isinstance(x, Placed) and isinstance(y, Placed):
            changes.append(JobChange(job, "moved", _where(x), _where(y)))
        elif isinstance(y, Placed):
            changes.append(JobChange(job, "now_placed", _where(x), _where(y)))
        elif isinstance(x, Placed):
            changes.append(JobChange(job, "now_unplaced", _where(x), _where(y)))
        else:
            changes.append(JobChange(job, "reason_changed", _where(x), _where(y)))
    return PlanDiff(a.version, b.version, a.utilization_after, b.utilization_after, tuple(changes))


def render_diff(diff: PlanDiff) -> str:
    lines = []
    if diff.version_before != diff.version_after:
        lines.append(f"fleet version {diff.version_before} -> {diff.version_after}")
    for c in diff.changes:
        lines.append(f"{c.job}: {c.kind}: {c.before or '-'} -> {c.after or '-'}")
    if not lines:
        lines.append("no changes")
    return "\n".join(lines) + "\n"
