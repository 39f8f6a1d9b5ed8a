"""The working state consolidation simulates moves on, and the greedy search over moves.

A `Work` is a mutable copy of the schedulable part of a `FleetState`. A job's destinations depend
only on its *form* (cards, slice or card size, CPU, host memory, model and label constraints; and
the job itself when job anti-affinity is involved), so the cost of adding each form to each node
is computed once and kept in a heap per form; a move re-evaluates only the two nodes it touched.
Stranded amounts are exact integers (`WorkloadIndex.stranded_num`), so "strictly reduces" is
exact and equal states give equal plans.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping

from gpuctl.core.consolidate import JobFacts, Migration, Pinned, move_penalty
from gpuctl.core.consolidate_doc import age_text
from gpuctl.core.fit import NodeFree
from gpuctl.core.fragmentation import WorkloadIndex
from gpuctl.core.placement.model import (
    Allocation,
    FleetState,
    LabelRequirement,
    PlacementNode,
    model_matches,
)


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


def clash(a: Allocation, b: Allocation) -> bool:
    """May `a` and `b` not share a node (job anti-affinity is symmetric)?"""
    if a.job in b.avoid_jobs or b.job in a.avoid_jobs:
        return True
    if b.group is not None and b.group in a.avoid_groups:
        return True
    return a.group is not None and a.group in b.avoid_groups


def model_ok(models: tuple[str, ...], card_model: str | None) -> bool:
    return not models or any(model_matches(m, card_model) for m in models)


class Work:
    """The mutable copy of the fleet a plan is simulated on."""

    def __init__(self, state: FleetState, index: WorkloadIndex) -> None:
        self.index = index
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
        self._stranded: dict[str, tuple[int, int]] = {}
        avoided_groups = {g for a in state.allocations for g in a.avoid_groups}
        avoided_jobs = {j for a in state.allocations for j in a.avoid_jobs}
        self.involved = {
            a.job
            for a in state.allocations
            if a.avoid_jobs or a.avoid_groups or a.job in avoided_jobs or a.group in avoided_groups
        }

    def stranded(self, node: WNode) -> int:
        hit = self._stranded.get(node.name)
        if hit is not None and hit[0] == node.version:
            return hit[1]
        value = self.index.stranded_num(node.view(node.free()))
        self._stranded[node.name] = (node.version, value)
        return value

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
        if base is None:
            before = self.stranded(node)
        else:
            before = self.index.stranded_num(node.view(free, dcpu, dmem))
        dcpu, dmem = dcpu + form.cpu, dmem + form.mem
        if form.gpus == 0:
            return self.index.stranded_num(node.view(free, dcpu, dmem)) - before, ()
        if form.whole:
            after = list(free)
            for p in chosen:
                after[p] = 0
            return self.index.stranded_num(node.view(after, dcpu, dmem)) - before, tuple(chosen)
        best: tuple[int, tuple[int, ...]] | None = None
        for p in chosen:
            after = list(free)
            after[p] -= form.per_card
            cost = self.index.stranded_num(node.view(after, dcpu, dmem)) - before
            if best is None or cost < best[0]:
                best = (cost, (p,))
        return best

    def removal_gain(self, node: WNode, a: Allocation) -> int:
        """Stranded memory of `node` now minus with `a` gone."""
        free, dcpu, dmem = node.freed(a)
        return self.stranded(node) - self.index.stranded_num(node.view(free, dcpu, dmem))

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
            gain = self.stranded(node) - self.index.stranded_num(node.view(after))
            if best is None or gain > best[0]:
                best = (gain, (p,))
        return best

    def move(self, a: Allocation, src: WNode, dst: WNode, positions: tuple[int, ...]) -> Allocation:
        src.release(a)
        moved = dataclasses.replace(a, node=dst.name, cards=tuple(dst.index[p] for p in positions))
        dst.hold(moved)
        self.allocs[a.job] = moved
        return moved


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
                f"started {age_text(ran)} ago; at least "
                f"{age_text(facts.min_runtime_between_moves_s)} between moves"
            )
    return None


@dataclasses.dataclass(slots=True)
class _Candidate:
    alloc: Allocation
    facts: JobFacts
    form: int  # index into the search's forms
    weight: float  # 1 / (1 + move penalty)
    stamp: int = 0  # bumped at every re-evaluation; heap entries with another stamp are stale
    active: bool = True
    removal: tuple[int, int] = (-1, 0)  # (src version, stranded freed by leaving it)
    local: tuple[int, tuple[int, tuple[int, ...]] | None] = (-1, None)  # (src version, in place)


class _Dests:
    """Per form, the destinations by add cost (a heap, lazily invalidated by node versions), and
    the best two, recomputed after each move; `changed` says which forms' best two moved."""

    def __init__(self, work: Work, forms: list[Form]) -> None:
        self.work = work
        self.forms = forms
        self.heaps: list[list[tuple[int, str, int, tuple[int, ...]]]] = []
        for form in forms:
            heap = []
            for node in work.nodes.values():
                found = work.add_cost(node, form)
                if found is not None:
                    heap.append((found[0], node.name, node.version, found[1]))
            heapq.heapify(heap)
            self.heaps.append(heap)
        self.top = [self._top(i) for i in range(len(forms))]

    def _top(self, i: int) -> list[tuple[int, str, tuple[int, ...]]]:
        heap = self.heaps[i]
        valid: list[tuple[int, str, int, tuple[int, ...]]] = []
        while heap and len(valid) < 2:
            item = heapq.heappop(heap)
            if self.work.nodes[item[1]].version == item[2]:
                valid.append(item)
        for item in valid:
            heapq.heappush(heap, item)
        return [(c, n, p) for c, n, _, p in valid]

    def touched(self, nodes: list[WNode]) -> list[int]:
        """Re-evaluate `nodes` for every form; the forms whose best two changed."""
        changed = []
        names = {n.name for n in nodes}
        for i, form in enumerate(self.forms):
            heap = self.heaps[i]
            for node in nodes:
                found = self.work.add_cost(node, form)
                if found is not None:
                    heapq.heappush(heap, (found[0], node.name, node.version, found[1]))
            top = self._top(i)
            if top != self.top[i] or any(n in names for _, n, _ in top):
                changed.append(i)
            self.top[i] = top
        return changed


def search(
    state: FleetState,
    facts: Mapping[str, JobFacts],
    index: WorkloadIndex,
    *,
    max_moves: int,
    now: float,
) -> tuple[list[Migration], list[Pinned], str]:
    """Greedy: repeatedly take the move with the best weighted stranded reduction (> 0).

    Every candidate's best move is kept in one heap; after a move only the candidates on the two
    nodes it touched, and those whose form's best destinations changed, are re-evaluated."""
    work = Work(state, index)
    pinned: list[Pinned] = []
    cands: list[_Candidate] = []
    form_ids: dict[Form, int] = {}
    for a in sorted(state.allocations, key=lambda a: a.job):
        f = facts.get(a.job)
        why = pin_reason(a, f, work, now)
        if why is not None:
            pinned.append(Pinned(a.job, a.node, why))
            continue
        assert f is not None
        node = work.nodes[a.node]
        card = max((node.caps[p] for p in node.positions(a)), default=max(node.caps, default=0))
        fid = form_ids.setdefault(work.form(a, f, node), len(form_ids))
        cands.append(_Candidate(a, f, fid, 1.0 / (1.0 + move_penalty(f, a, card))))
    if max_moves == 0:
        return [], pinned, "max moves is 0: nothing planned"
    if not cands:
        return [], pinned, "no job may move"
    dests = _Dests(work, list(form_ids))
    by_form: dict[int, list[_Candidate]] = {}
    by_node: dict[str, list[_Candidate]] = {}
    for c in cands:
        by_form.setdefault(c.form, []).append(c)
        by_node.setdefault(c.alloc.node, []).append(c)
    heap: list[tuple[float, str, str, int, int, tuple[int, ...]]] = []
    for c in cands:
        _evaluate(work, dests, c, heap)
    moves: list[Migration] = []
    named = {x.alloc.job: x for x in cands}
    while len(moves) < max_moves:
        picked, gain, dst, positions = _pop_best(heap, named, work)
        if picked is None or dst is None:
            break
        c = picked
        src = work.nodes[c.alloc.node]
        moved = work.move(c.alloc, src, dst, positions)
        moves.append(
            Migration(
                job=c.alloc.job,
                tier=c.alloc.tier,
                from_node=c.alloc.node,
                from_cards=c.alloc.cards,
                to_node=moved.node,
                to_cards=moved.cards,
                mib_per_card=c.alloc.mib_per_card,
                whole=c.alloc.whole,
                checkpoint_age_s=c.facts.checkpoint_age_s,
                stranded_freed_mib=gain / index.denominator,
                cpu_milli=c.alloc.cpu_milli,
                host_mem_mib=c.alloc.host_mem_mib,
            )
        )
        c.active = False
        touched = [src] if src is dst else [src, dst]
        again = {x.alloc.job: x for n in touched for x in by_node.get(n.name, ()) if x.active}
        for fid in dests.touched(touched):
            again.update((x.alloc.job, x) for x in by_form[fid] if x.active)
        for job in sorted(again):
            _evaluate(work, dests, again[job], heap)
    if len(moves) == max_moves:
        reason = f"stopped at the maximum of {max_moves} move(s)"
    elif moves:
        reason = "no further move reduces stranded memory"
    else:
        reason = "no move reduces stranded memory"
    return moves, pinned, reason


def _evaluate(
    work: Work,
    dests: _Dests,
    c: _Candidate,
    heap: list[tuple[float, str, str, int, int, tuple[int, ...]]],
) -> None:
    """Push `c`'s best move (if it frees anything) with a fresh stamp."""
    c.stamp += 1
    src = work.nodes[c.alloc.node]
    if c.removal[0] != src.version:
        c.removal = (src.version, work.removal_gain(src, c.alloc))
        c.local = (src.version, work.in_place(src, c.alloc, dests.forms[c.form]))
    removal = c.removal[1]
    best: tuple[int, str, tuple[int, ...]] | None = None
    for cost, name, positions in dests.top[c.form]:
        if name != src.name:
            best = (removal - cost, name, positions)
            break
    local = c.local[1]
    if local is not None and (best is None or (-local[0], src.name) < (-best[0], best[1])):
        best = (local[0], src.name, local[1])
    if best is None or best[0] <= 0:
        return
    gain, name, positions = best
    heapq.heappush(heap, (-gain * c.weight, c.alloc.job, name, gain, c.stamp, positions))


def _pop_best(
    heap: list[tuple[float, str, str, int, int, tuple[int, ...]]],
    cands: Mapping[str, _Candidate],
    work: Work,
) -> tuple[_Candidate | None, int, WNode | None, tuple[int, ...]]:
    while heap:
        _, job, name, gain, stamp, positions = heapq.heappop(heap)
        c = cands[job]
        if c.active and c.stamp == stamp:
            return c, gain, work.nodes[name], positions
    return None, 0, None, ()
