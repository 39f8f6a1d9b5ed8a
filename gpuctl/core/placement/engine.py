"""The placement engine: `plan(state, jobs, settings) -> Plan`.

Jobs are placed one at a time in a fixed order (priority, highest first; at equal priority
standard-tier before spot-tier work, which is preemptible; then name); each later
job sees the allocations of the earlier ones. For one job, every node goes through the constraint
filters in a fixed order, and the first one it fails is counted against it (for the explanation):

    unschedulable, node_affinity, node_anti_affinity, job_anti_affinity, gpu_model, card_size,
    gpu_count, cpu, host_memory, empty_cards / card_memory, policy, band

A node that passes is scored by the policy (`gpuctl.core.placement.policies`) over `NodeFree` /
`Demand` (`gpuctl.core.placement.fit`): the best score wins, ties go to the node whose name sorts
first, and the second best is recorded as the runner-up. Cards a job cannot use (unhealthy, another
model, too small) are shown to the policy with no free memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuctl.core.placement.constraints import Reject, clash, fewer, model_ok, usable_cards
from gpuctl.core.placement.fit import Choice, Demand, NodeFree, Workload
from gpuctl.core.placement.model import (
    Allocation,
    FleetState,
    JobRequest,
    JobShape,
    PlacementNode,
    Settings,
    Tier,
)
from gpuctl.core.placement.plan import (
    NodeUsage,
    Outcome,
    Placed,
    Plan,
    Rejection,
    RunnerUp,
    Unplaced,
    successor_version,
)
from gpuctl.core.placement.policies import NodeKind, Policy, for_fleet, get_policy
from gpuctl.core.placement.shape import added_mib, decide_shape, demand_on, limit_mib, request_text
from gpuctl.core.units import format_mib
from gpuctl.errors import PlanError

CONSTRAINT_ORDER = (
    "unschedulable",
    "node_affinity",
    "node_anti_affinity",
    "job_anti_affinity",
    "gpu_model",
    "card_size",
    "gpu_count",
    "cpu",
    "host_memory",
    "empty_cards",
    "card_memory",
    "policy",
    "band",
)


@dataclasses.dataclass(slots=True)
class _NodeWork:
    """Mutable per-node bookkeeping while one plan is computed."""

    node: PlacementNode
    caps: tuple[int, ...]  # capacity per card position
    free: list[int]  # per card position; unhealthy cards 0
    allocated: list[int]  # per card position
    cpu_allocated: int
    mem_allocated: int
    jobs: list[Allocation]
    static_key: tuple[object, ...]
    key: tuple[object, ...] = ()

    def rekey(self, anti_affinity: bool) -> None:
        """Nodes with equal keys answer every constraint and policy alike for a given job."""
        jobs: tuple[object, ...] = ()
        if anti_affinity:
            jobs = (
                frozenset(a.job for a in self.jobs),
                frozenset(a.group for a in self.jobs if a.group is not None),
                frozenset(x for a in self.jobs for x in a.avoid_jobs),
                frozenset(x for a in self.jobs for x in a.avoid_groups),
            )
        dynamic = (tuple(self.free), self.cpu_allocated, self.mem_allocated, jobs)
        self.key = (self.static_key, dynamic)


def _static_key(n: PlacementNode) -> tuple[object, ...]:
    return (
        n.schedulable,
        n.reason,
        frozenset(n.labels.items()),
        tuple((c.capacity_mib, c.model, c.healthy) for c in n.cards),
        n.cpu_milli,
        n.host_mem_mib,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Fit:
    """A node can take the job: the policy's choice and what it adds to the fleet."""

    choice: Choice
    demand: Demand
    cap_ref: int
    added_mib: int


class _Engine:
    def __init__(self, state: FleetState, settings: Settings, workload: Workload | None) -> None:
        self.settings = settings
        try:
            policy = get_policy(settings.policy)
        except KeyError as exc:
            raise PlanError(str(exc.args[0])) from None
        cards_per_model: dict[str, int] = {}
        hosts: dict[NodeKind, int] = {}
        for n in state.nodes:
            for c in n.cards:
                if c.model:
                    cards_per_model[c.model] = cards_per_model.get(c.model, 0) + 1
            if n.schedulable and n.cards:
                on = {c.model for c in n.cards}
                model = on.pop() if len(on) == 1 else None
                top = max(c.capacity_mib for c in n.cards)
                kind = NodeKind(model or None, len(n.cards), top, n.cpu_milli, n.host_mem_mib)
                hosts[kind] = hosts.get(kind, 0) + 1
        self.models = tuple(sorted(cards_per_model))
        self.policy: Policy = for_fleet(policy, cards_per_model, hosts)
        self.workload = workload
        self.work: dict[str, _NodeWork] = {}
        for n in sorted(state.nodes, key=lambda n: n.name):
            self.work[n.name] = _NodeWork(
                node=n,
                caps=tuple(c.capacity_mib for c in n.cards),
                free=[c.free_mib for c in n.cards],
                allocated=[c.allocated_mib for c in n.cards],
                cpu_allocated=n.cpu_allocated_milli,
                mem_allocated=n.host_mem_allocated_mib,
                jobs=[],
                static_key=_static_key(n),
            )
        for a in state.allocations:
            if a.node in self.work:
                self.work[a.node].jobs.append(a)
        self.anti_affinity = any(a.avoid_jobs or a.avoid_groups for a in state.allocations)
        self.known = {a.job: a.node for a in state.allocations}
        self.total_mib = state.capacity_mib()
        self.allocated_mib = state.allocated_mib()
        self.touched: set[str] = set()
        self._workloads: dict[tuple[int, ...], Workload] = {}
        self._demands: dict[tuple[JobShape, int], Demand] = {}
        self.limit_mib = {t: limit_mib(self.total_mib, settings.limit_for(t)) for t in Tier}
        self.jobs: Sequence[JobRequest] = ()

    def start(self, jobs: Sequence[JobRequest]) -> None:
        self.jobs = tuple(jobs)
        self.anti_affinity = self.anti_affinity or any(j.avoid_jobs or j.avoid_groups for j in jobs)
        for w in self.work.values():
            w.rekey(self.anti_affinity)

    # --- one job ---------------------------------------------------------------------------

    def place(self, job: JobRequest) -> Outcome:
        shape = job.shape
        if job.name in self.known:
            return Unplaced(
                job=job.name,
                tier=job.tier,
                priority=job.priority,
                shape=request_text(shape),
                reason=f"a job named {job.name} already has an allocation on "
                f"{self.known[job.name]}",
                rejections=(),
            )
        rejected: dict[tuple[str, str], list[str]] = {}
        candidates: list[tuple[str, _Fit]] = []
        band_need: int | None = None
        seen: dict[tuple[object, ...], _Fit | Reject] = {}
        for name, w in self.work.items():
            result = seen.get(w.key)
            if result is None:
                result = seen[w.key] = self._check(job, w)
            if isinstance(result, _Fit):
                candidates.append((name, result))
                continue
            rejected.setdefault((result.constraint, result.summary), []).append(name)
            if result.constraint == "band":
                need = result.need_mib
                band_need = need if band_need is None else min(band_need, need)
        rejections = _rejections(rejected)
        if not candidates:
            return Unplaced(
                job=job.name,
                tier=job.tier,
                priority=job.priority,
                shape=request_text(shape),
                reason=self._reason(job, rejections, band_need),
                rejections=rejections,
            )
        candidates.sort(key=lambda nc: (-nc[1].choice.score, nc[0]))
        best_node, best = candidates[0]
        runner = candidates[1] if len(candidates) > 1 else None
        allocation = self._commit(job, best_node, best)
        node = self.work[best_node].node
        return Placed(
            job=job.name,
            allocation=allocation,
            card_uuids=tuple(node.cards[p].uuid for p in best.choice.cards),
            score=best.choice.score,
            runner_up=None if runner is None else RunnerUp(runner[0], runner[1].choice.score),
            feasible_nodes=len(candidates),
            shape=decide_shape(shape, best.demand, best.cap_ref, self.settings),
            priority=job.priority,
            rejections=rejections,
        )

    def _check(self, job: JobRequest, w: _NodeWork) -> _Fit | Reject:
        node, shape = w.node, job.shape
        if not node.schedulable:
            return Reject("unschedulable", node.reason or "not schedulable")
        for req in job.node_affinity:
            if not req.matches(node.labels):
                return Reject("node_affinity", f"lacks label {req.text()}")
        for req in job.node_anti_affinity:
            if req.matches(node.labels):
                return Reject("node_anti_affinity", f"has label {req.text()}")
        for a in w.jobs:
            why = clash(job, a)
            if why:
                return Reject("job_anti_affinity", why)
        usable = usable_cards(job, node)
        if isinstance(usable, Reject):
            return usable
        cpu_free = None if node.cpu_milli is None else node.cpu_milli - w.cpu_allocated
        if cpu_free is not None and cpu_free < shape.cpu_milli:
            return Reject("cpu", f"less than {shape.cpu_milli / 1000:g} CPU cores free")
        mem_free = None if node.host_mem_mib is None else node.host_mem_mib - w.mem_allocated
        if mem_free is not None and mem_free < shape.host_mem_mib:
            return Reject(
                "host_memory", f"less than {format_mib(shape.host_mem_mib)} host memory free"
            )
        caps = w.caps
        ok = set(usable)
        free = tuple(f if i in ok else 0 for i, f in enumerate(w.free))
        cap_ref = max((caps[i] for i in usable), default=0)
        demand = self._demand(shape, cap_ref)
        if demand.gpus and (demand.whole or demand.gpus > 1):
            if sum(1 for i in usable if free[i] == caps[i]) < demand.gpus:
                return Reject("empty_cards", fewer(demand.gpus, "empty usable card"))
        elif demand.gpus and not any(free[i] >= demand.mib_per_card for i in usable):
            return Reject("card_memory", f"no card with {format_mib(demand.mib_per_card)} free")
        # The node's card model as the policy sees it: the one its cards share, or for a job
        # asking for models, one of those its usable cards have (all of them allowed).
        on = [node.cards[i].model for i in usable] or [c.model for c in node.cards]
        models = sorted({m for m in on if m})
        pinned = bool(shape.gpus and shape.gpu_models)
        model = models[0] if models and (pinned or len(set(on)) == 1) else None
        nf = NodeFree(
            node.name,
            free,
            caps,
            cpu_free_milli=cpu_free,
            mem_free_mib=mem_free,
            gpu_model=model,
            cpu_milli=node.cpu_milli,
            mem_mib=node.host_mem_mib,
        )
        choice = self.policy.choose(nf, demand, self._workload_for(caps))
        if choice is None:
            return Reject("policy", f"{self.policy.name} found no cards")
        added = added_mib(demand, caps, choice.cards)
        if added and self.allocated_mib + added > self.limit_mib[job.tier]:
            limit = self.settings.limit_for(job.tier)
            return Reject("band", f"would take fleet utilization over {_pct(limit)}", added)
        return _Fit(choice, demand, cap_ref, added)

    def _reason(
        self, job: JobRequest, rejections: tuple[Rejection, ...], band_need: int | None
    ) -> str:
        if not rejections:
            return "the fleet has no nodes"
        parts = "; ".join(
            f"{_nodes(r.count)}: {r.summary}" for r in rejections if r.constraint != "band"
        )
        if band_need is None:
            return f"no node can take {request_text(job.shape)}: {parts}"
        limit = self.settings.limit_for(job.tier)
        now = self.allocated_mib / self.total_mib if self.total_mib else 0.0
        after = (self.allocated_mib + band_need) / self.total_mib if self.total_mib else 0.0
        tail = (
            " (the failover headroom)"
            if job.tier is Tier.STANDARD
            else " (spot may not use the headroom)"
        )
        band = (
            f"{job.tier.value}-tier admission stops at {_pct(limit)} of fleet GPU memory"
            f"{tail}: utilization is {_pct(now)}, this job would take it to {_pct(after)}"
        )
        return f"{band}; other nodes: {parts}" if parts else band

    def _commit(self, job: JobRequest, name: str, c: _Fit) -> Allocation:
        w = self.work[name]
        caps = w.caps
        whole = c.demand.gpus > 0 and (c.demand.whole or c.demand.gpus > 1)
        for p in c.choice.cards:
            used = caps[p] if whole else c.demand.mib_per_card
            w.free[p] -= used
            w.allocated[p] += used
        w.cpu_allocated += job.shape.cpu_milli
        w.mem_allocated += job.shape.host_mem_mib
        self.allocated_mib += c.added_mib
        mib_per_card = 0
        if c.choice.cards:
            mib_per_card = max(caps[p] for p in c.choice.cards) if whole else c.demand.mib_per_card
        allocation = Allocation(
            job=job.name,
            node=name,
            cards=tuple(w.node.cards[p].index for p in c.choice.cards),
            mib_per_card=mib_per_card,
            whole=whole,
            cpu_milli=job.shape.cpu_milli,
            host_mem_mib=job.shape.host_mem_mib,
            tier=job.tier,
            group=job.group,
            avoid_jobs=job.avoid_jobs,
            avoid_groups=job.avoid_groups,
        )
        w.jobs.append(allocation)
        w.rekey(self.anti_affinity)
        self.known[job.name] = name
        self.touched.add(name)
        return allocation

    def _demand(self, shape: JobShape, cap_ref: int) -> Demand:
        key = (shape, cap_ref)
        found = self._demands.get(key)
        if found is None:
            found = demand_on(shape, cap_ref, self.settings)
            if shape.gpus and shape.gpu_models:  # the fleet's card models it may use
                models = tuple(m for m in self.models if model_ok(shape.gpu_models, m))
                found = dataclasses.replace(found, gpu_models=models)
            self._demands[key] = found
        return found

    def _workload_for(self, caps: tuple[int, ...]) -> Workload:
        """The target workload for FGD-like policies: the shapes of this request, by frequency,
        as they would ask of a node with these cards."""
        if self.workload is not None:
            return self.workload
        found = self._workloads.get(caps)
        if found is None:
            counts: dict[Demand, int] = {}
            cap_ref = max(caps, default=0)
            for j in self.jobs:
                if j.shape.gpus and cap_ref:
                    d = self._demand(j.shape, cap_ref)
                    counts[d] = counts.get(d, 0) + 1
            total = sum(counts.values())
            ordered = sorted(counts.items(), key=lambda dc: (-dc[1], _demand_key(dc[0])))
            found = tuple((d, n / total) for d, n in ordered)
            self._workloads[caps] = found
        return found


def plan(
    state: FleetState,
    jobs: Sequence[JobRequest],
    settings: Settings | None = None,
    *,
    workload: Workload | None = None,
) -> Plan:
    """Where `jobs` would go on `state`. Pure and deterministic; changes nothing.

    `workload` (shapes in MiB with probabilities) overrides the target workload that FGD-like
    policies measure fragmentation against; by default it is the request's own shapes.
    Raises PlanError for an unknown policy or two jobs with the same name.
    """
    settings = settings or Settings()
    names = [j.name for j in jobs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PlanError(f"job names must be unique; repeated: {', '.join(dupes)}")
    engine = _Engine(state, settings, workload)
    engine.start(jobs)
    before = state.utilization()
    outcomes = tuple(engine.place(j) for j in sorted(jobs, key=placement_order))
    predicted = tuple(
        NodeUsage(
            node=name,
            allocated_mib=tuple(w.allocated),
            cpu_allocated_milli=w.cpu_allocated,
            host_mem_allocated_mib=w.mem_allocated,
        )
        for name, w in engine.work.items()
        if name in engine.touched
    )
    added = [o.allocation for o in outcomes if isinstance(o, Placed)]
    total = engine.total_mib
    return Plan(
        version=state.version,
        settings=settings,
        jobs=outcomes,
        utilization_before=before,
        utilization_after=None if total == 0 else engine.allocated_mib / total,
        predicted=predicted,
        version_after=successor_version(state.version, added),
        nodes_total=len(state.nodes),
        nodes_schedulable=sum(1 for n in state.nodes if n.schedulable),
    )


def placement_order(job: JobRequest) -> tuple[int, int, str]:
    """Priority (highest first), then standard before spot, then name."""
    return (-job.priority, job.tier is Tier.SPOT, job.name)


# --- helpers ---------------------------------------------------------------------------------


def _demand_key(d: Demand) -> tuple[int, int, bool, int, int]:
    return (d.gpus, d.mib_per_card, d.whole, d.cpu_milli, d.mem_mib)


def _rejections(rejected: dict[tuple[str, str], list[str]]) -> tuple[Rejection, ...]:
    order = {c: i for i, c in enumerate(CONSTRAINT_ORDER)}
    items = [Rejection(c, s, tuple(sorted(nodes))) for (c, s), nodes in rejected.items()]
    items.sort(key=lambda r: (-r.count, order.get(r.constraint, len(order)), r.summary))
    return tuple(items)


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"
