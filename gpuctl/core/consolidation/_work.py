"""The working state consolidation simulates moves on: a mutable copy of the schedulable part of
a `FleetState`, with the exact cost (`Work.measure`: stranded memory, `WorkloadIndex.stranded_num`,
plus weighted dead holes) of its nodes and of nodes with a job added or taken away.

A job's destinations depend only on its *form* (cards, slice or card size, CPU, host memory, model
and label constraints; and the job itself when job anti-affinity is involved), so searches can
share the cost of adding one form to one node between jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpuctl.core.consolidation.model import JobFacts
from gpuctl.core.placement.constraints import clash, model_ok
from gpuctl.core.placement.fit import NodeFree
from gpuctl.core.placement.fragmentation import (
    DEAD_WEIGHT,
    HOST_WEIGHT,
    WorkloadIndex,
    consolidation_dead_range,
    dead_units,
    host_stranded,
)
from gpuctl.core.placement.model import Allocation, FleetState, LabelRequirement, PlacementNode
from gpuctl.core.timefmt import duration


@dataclasses.dataclass(frozen=True, slots=True)
class Form:
    """What a job asks of a destination node."""

    gpus: int
    per_card: int  # slice units; for whole cards, the card capacity it needs
    whole: bool
    cpu: int
    mem: int
    models: tuple[str, ...]
    affinity: tuple[LabelRequirement, ...]
    anti: tuple[LabelRequirement, ...]
    owner: str | None = None  # set when job anti-affinity involves this job


@dataclasses.dataclass(slots=True)
class WNode:
    name: str
    index: tuple[int, ...]  # card indexes by position
    caps: tuple[int, ...]
    models: tuple[str | None, ...]
    healthy: tuple[bool, ...]
    ghost: tuple[int, ...]
    alloc: list[int]
    cpu_cap: int | None
    cpu_alloc: int
    mem_cap: int | None
    mem_alloc: int
    labels: Mapping[str, str]
    model: str | None
    jobs: dict[str, Allocation]
    version: int = 0
    _free: tuple[int, list[int]] = (-1, [])

    @staticmethod
    def of(n: PlacementNode, allocs: list[Allocation]) -> WNode:
        models = {c.model for c in n.cards}
        return WNode(
            name=n.name,
            index=tuple(c.index for c in n.cards),
            caps=tuple(c.capacity_mib for c in n.cards),
            models=tuple(c.model for c in n.cards),
            healthy=tuple(c.healthy for c in n.cards),
            ghost=tuple(c.ghost_mib for c in n.cards),
            alloc=[c.allocated_mib for c in n.cards],
            cpu_cap=n.cpu_milli,
            cpu_alloc=n.cpu_allocated_milli,
            mem_cap=n.host_mem_mib,
            mem_alloc=n.host_mem_allocated_mib,
            labels=n.labels,
            model=models.pop() if len(models) == 1 else None,
            jobs={a.job: a for a in allocs},
        )

    def free(self) -> list[int]:
        """Free units per card (a fresh list)."""
        return list(self.free_now())

    def free_now(self) -> list[int]:
        """Free units per card, shared until the node changes: never modify it."""
        if self._free[0] != self.version:
            free = [
                max(0, c - a - g) if h else 0
                for c, a, g, h in zip(self.caps, self.alloc, self.ghost, self.healthy, strict=True)
            ]
            self._free = (self.version, free)
        return self._free[1]

    def cpu_free(self) -> int | None:
        return None if self.cpu_cap is None else self.cpu_cap - self.cpu_alloc

    def mem_free(self) -> int | None:
        return None if self.mem_cap is None else self.mem_cap - self.mem_alloc

    def view(self, free: list[int], cpu: int = 0, mem: int = 0) -> NodeFree:
        """The node with `free` per card and `cpu`/`mem` more allocated."""
        c, m = self.cpu_free(), self.mem_free()
        return NodeFree(
            name=self.name,
            free=tuple(free),
            capacity=self.caps,
            cpu_free_milli=None if c is None else c - cpu,
            mem_free_mib=None if m is None else m - mem,
            gpu_model=self.model,
        )

    def positions(self, a: Allocation) -> list[int]:
        return [self.index.index(i) for i in a.cards]

    def used_by(self, a: Allocation, p: int) -> int:
        return self.caps[p] if a.whole else a.mib_per_card

    def release(self, a: Allocation) -> None:
        for p in self.positions(a):
            self.alloc[p] = max(0, self.alloc[p] - self.used_by(a, p))
        self.cpu_alloc -= a.cpu_milli
        self.mem_alloc -= a.host_mem_mib
        del self.jobs[a.job]
        self.version += 1

    def hold(self, a: Allocation) -> None:
        for p in self.positions(a):
            self.alloc[p] += self.used_by(a, p)
        self.cpu_alloc += a.cpu_milli
        self.mem_alloc += a.host_mem_mib
        self.jobs[a.job] = a
        self.version += 1

    def freed(self, a: Allocation) -> tuple[list[int], int, int]:
        """Free per card, CPU and memory deltas with `a` gone (deltas as negative use)."""
        free = self.free()
        for p in self.positions(a):
            if self.healthy[p]:
                free[p] = min(self.caps[p] - self.ghost[p], free[p] + self.used_by(a, p))
                free[p] = max(0, free[p])
        return free, -a.cpu_milli, -a.host_mem_mib


class Work:
    """The mutable copy of the fleet a plan is simulated on."""

    def __init__(self, state: FleetState, index: WorkloadIndex) -> None:
        self.index = index
        self.dead_from, self.dead_below = consolidation_dead_range(index.workload)
        self.dead_num = DEAD_WEIGHT * index.denominator
        by_node: dict[str, list[Allocation]] = {}
        for a in state.allocations:
            by_node.setdefault(a.node, []).append(a)
        self.nodes = {
            n.name: WNode.of(n, by_node.get(n.name, []))
            for n in sorted(state.nodes, key=lambda n: n.name)
            if n.schedulable
        }
        self.unschedulable = {n.name: n.reason for n in state.nodes if not n.schedulable}
        self.allocs = {a.job: a for a in state.allocations}
        self._costs: dict[str, tuple[int, int]] = {}
        self._changed: list[str] = []  # the nodes a move or its undoing changed, in order
        # per form: how far into `_changed` it is up to date, and where it fits (add_cost)
        self._fits: dict[Form, tuple[int, dict[str, tuple[int, tuple[int, ...]]]]] = {}
        self._total: tuple[int, int] | None = None  # (log position, stranded of every node)
        self._seen: dict[str, int] = {}
        avoided_groups = {g for a in state.allocations for g in a.avoid_groups}
        avoided_jobs = {j for a in state.allocations for j in a.avoid_jobs}
        self.involved = {
            a.job
            for a in state.allocations
            if a.avoid_jobs or a.avoid_groups or a.job in avoided_jobs or a.group in avoided_groups
        }

    def measure(self, view: NodeFree) -> int:
        """What a node's free state costs, as an integer over the index's denominator, weighed
        as the default placement weighs it: its stranded memory; `HOST_WEIGHT` per card unit its
        host can no longer feed (`host_stranded`: free cards beyond what its free CPU and memory
        feed at the workload's average, none where a typical whole-card job takes them all);
        and `DEAD_WEIGHT` per unit of dead hole (a hole almost no card-sharing job fits is as
        good as lost)."""
        dead = dead_units(view.free, self.dead_below, self.dead_from)
        host = host_stranded(view, self.index.host_ratio, self.index.fillers)
        return (
            self.index.stranded_num(view)
            + self.dead_num * dead
            + round(HOST_WEIGHT * host * self.index.denominator)
        )

    def cost(self, node: WNode) -> int:
        """`measure` of the node as it is now, kept per node version."""
        hit = self._costs.get(node.name)
        if hit is not None and hit[0] == node.version:
            return hit[1]
        value = self.measure(node.view(node.free()))
        self._costs[node.name] = (node.version, value)
        return value

    def total_cost(self) -> int:
        """The cost of every node, kept up to date through the moves' log."""
        if self._total is None:
            self._seen = {n.name: self.cost(n) for n in self.nodes.values()}
            self._total = (len(self._changed), sum(self._seen.values()))
        at, total = self._total
        for name in set(self._changed[at:]):
            value = self.cost(self.nodes[name])
            total += value - self._seen[name]
            self._seen[name] = value
        self._total = (len(self._changed), total)
        return total

    def form(self, a: Allocation, f: JobFacts, node: WNode) -> Form:
        per = a.mib_per_card
        if a.whole:
            per = max((node.caps[p] for p in node.positions(a)), default=0)
        return Form(
            gpus=len(a.cards),
            per_card=per,
            whole=a.whole,
            cpu=a.cpu_milli,
            mem=a.host_mem_mib,
            models=f.gpu_models,
            affinity=f.node_affinity,
            anti=f.node_anti_affinity,
            owner=a.job if a.job in self.involved else None,
        )

    def add_cost(
        self, node: WNode, form: Form, base: tuple[list[int], int, int] | None = None
    ) -> tuple[int, tuple[int, ...]] | None:
        """The cheapest way to add `form` to `node` (stranded after − before, positions), or None.
        `base`: the node's free per card and CPU/memory deltas to start from (a job gone)."""
        if not all(r.matches(node.labels) for r in form.affinity):
            return None
        if any(r.matches(node.labels) for r in form.anti):
            return None
        if form.owner is not None:
            me = self.allocs[form.owner]
            if any(clash(me, b) for j, b in node.jobs.items() if j != form.owner):
                return None
        free, dcpu, dmem = base if base is not None else (node.free_now(), 0, 0)
        cpu, mem = node.cpu_free(), node.mem_free()
        if cpu is not None and cpu - dcpu < form.cpu:
            return None
        if mem is not None and mem - dmem < form.mem:
            return None
        if form.gpus and not form.whole and max(free, default=0) < form.per_card:
            return None
        chosen: list[int] = []
        if form.gpus:
            usable = [
                p
                for p in range(len(free))
                if node.healthy[p] and model_ok(form.models, node.models[p])
            ]
            if form.whole:
                chosen = [p for p in usable if node.caps[p] == form.per_card == free[p]]
                if len(chosen) < form.gpus:
                    return None
                chosen = chosen[: form.gpus]
            else:
                seen: set[tuple[int, int]] = set()
                for p in usable:  # one card per distinct (free, capacity): they score alike
                    if free[p] >= form.per_card and (free[p], node.caps[p]) not in seen:
                        seen.add((free[p], node.caps[p]))
                        chosen.append(p)
                if not chosen:
                    return None
        before = self.cost(node) if base is None else self.measure(node.view(free, dcpu, dmem))
        dcpu, dmem = dcpu + form.cpu, dmem + form.mem
        if form.gpus == 0:
            return self.measure(node.view(free, dcpu, dmem)) - before, ()
        if form.whole:
            after = list(free)
            for p in chosen:
                after[p] = 0
            return self.measure(node.view(after, dcpu, dmem)) - before, tuple(chosen)
        best: tuple[int, tuple[int, ...]] | None = None
        for p in chosen:
            after = list(free)
            after[p] -= form.per_card
            cost = self.measure(node.view(after, dcpu, dmem)) - before
            if best is None or cost < best[0]:
                best = (cost, (p,))
        return best

    def removal_gain(self, node: WNode, a: Allocation) -> int:
        """The cost (`measure`) of `node` now minus with `a` gone."""
        free, dcpu, dmem = node.freed(a)
        return self.cost(node) - self.measure(node.view(free, dcpu, dmem))

    def in_place(
        self, node: WNode, a: Allocation, form: Form
    ) -> tuple[int, tuple[int, ...]] | None:
        """The best move of a slice to another card of its own node: (gain, positions)."""
        if a.whole or form.gpus != 1:
            return None
        base = node.freed(a)
        here = set(node.positions(a))
        best: tuple[int, tuple[int, ...]] | None = None
        free = base[0]
        for p in range(len(free)):
            if p in here or free[p] < form.per_card or not node.healthy[p]:
                continue
            if not model_ok(form.models, node.models[p]):
                continue
            after = list(free)
            after[p] -= form.per_card
            gain = self.cost(node) - self.measure(node.view(after))
            if best is None or gain > best[0]:
                best = (gain, (p,))
        return best

    def destinations(self, form: Form) -> Mapping[str, tuple[int, tuple[int, ...]]]:
        """Every node `form` can be added to, with `add_cost`'s answer: computed once per form,
        then kept up to date by re-evaluating only the nodes moves changed since. Read only."""
        at, fits = self._fits.get(form, (-1, {}))
        if at < 0:
            need = form.per_card if form.gpus else 0
            for node in self.nodes.values():
                # add_cost's cheapest refusals first, without calling it
                if node.cpu_cap is not None and node.cpu_cap - node.cpu_alloc < form.cpu:
                    continue
                if node.mem_cap is not None and node.mem_cap - node.mem_alloc < form.mem:
                    continue
                if need and max(node.free_now(), default=0) < need:
                    continue
                found = self.add_cost(node, form)
                if found is not None:
                    fits[node.name] = found
        else:
            for name in set(self._changed[at:]):
                found = self.add_cost(self.nodes[name], form)
                if found is None:
                    fits.pop(name, None)
                else:
                    fits[name] = found
        self._fits[form] = (len(self._changed), fits)
        return fits

    def move(self, a: Allocation, src: WNode, dst: WNode, positions: tuple[int, ...]) -> Allocation:
        src.release(a)
        moved = dataclasses.replace(a, node=dst.name, cards=tuple(dst.index[p] for p in positions))
        dst.hold(moved)
        self.allocs[a.job] = moved
        self._changed += (src.name, dst.name)
        return moved

    def put_back(self, job: str, node: str, cards: tuple[int, ...]) -> None:
        """Undo a simulated move: `job` back on `node`'s `cards`."""
        now = self.allocs[job]
        back = dataclasses.replace(now, node=node, cards=cards)
        self.nodes[now.node].release(now)
        self.nodes[node].hold(back)
        self.allocs[job] = back
        self._changed += (now.node, node)


def pin_reason(a: Allocation, facts: JobFacts | None, work: Work, now: float) -> str | None:
    """Why consolidation may not move `a` (None: it may)."""
    if a.node not in work.nodes:
        why = work.unschedulable.get(a.node) or "not in the fleet"
        return f"its node {a.node} is not schedulable ({why})"
    if facts is None:
        return "gpuctl has no facts about this job"
    if facts.hold is not None:
        return facts.hold
    if not facts.disruptible:
        return "disruptible: false"
    if facts.last_moved_at is not None:
        ran = now - facts.last_moved_at
        if ran < facts.min_runtime_between_moves_s:
            return (
                f"started {duration(ran)} ago; at least "
                f"{duration(facts.min_runtime_between_moves_s)} between moves"
            )
    return None
