"""The greedy search over moves that strictly reduce the cost (`Work.measure`: stranded memory
plus weighted dead holes).

The cost of adding each form to each node is computed once and kept in a heap per form; every
job's best move is kept in one heap; a move re-evaluates only the two nodes it touched, the jobs
on them, and the jobs whose form's best destinations changed. Stranded amounts are exact
integers, so "strictly reduces" is exact and equal states give equal plans.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping

from gpuctl.core.consolidation._work import Form, WNode, Work, pin_reason
from gpuctl.core.consolidation.model import JobFacts, Migration, Pinned
from gpuctl.core.placement.fragmentation import WorkloadIndex
from gpuctl.core.placement.model import Allocation, FleetState

CHECKPOINT_STALE_S = 3600.0  # a checkpoint this old (or none) costs a move the most


def move_penalty(facts: JobFacts, alloc: Allocation, card_mib: int) -> float:
    """How dear a move is, beyond the one move itself: up to 1 for a checkpoint an hour old or
    none, and a quarter per whole card's worth of memory moved."""
    age = facts.checkpoint_age_s
    stale = 1.0 if age is None else min(max(age, 0.0), CHECKPOINT_STALE_S) / CHECKPOINT_STALE_S
    moved = alloc.mib_per_card * len(alloc.cards)
    return stale + 0.25 * (moved / card_mib if card_mib > 0 else 0.0)


@dataclasses.dataclass(slots=True)
class _Candidate:
    alloc: Allocation
    facts: JobFacts
    form: int  # index into the search's forms
    weight: float  # 1 / (1 + move penalty)
    stamp: int = 0  # bumped at every re-evaluation; heap entries with another stamp are stale
    active: bool = True
    removal: tuple[int, int] = (-1, 0)  # (src version, cost freed by leaving it)
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
    """Greedy: repeatedly take the move with the best weighted cost reduction (> 0).

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
        reason = "no further move reduces stranded, unfed and dead-hole memory"
    else:
        reason = "no move reduces stranded, unfed and dead-hole memory"
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
