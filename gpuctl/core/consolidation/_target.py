"""Drain-and-refill: make room for one target job with the fewest moves.

For every schedulable node the target may use, the cheapest way to make it fit is found: for whole
cards, the set of `gpus` usable cards whose jobs are fewest to move (every such job must be
movable; a card with ghost usage cannot be freed); for a slice, the card where moving the fewest
(largest first) slices leaves enough free; then more jobs if the node lacks CPU or host memory
(largest first; as a second way, those holding no GPU first: they fit wherever the cores are),
and every job the target may not share a node with. The moved jobs are re-placed one by one
(largest first) where they add the least cost (`Work.measure`), never on the target's node. The
node needing the fewest moves wins; ties go to the lower cost after, then to the node whose name
sorts first.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

from gpuctl.core.consolidation._work import WNode, Work, pin_reason
from gpuctl.core.consolidation.model import JobFacts, Migration, Pinned, TargetOutcome
from gpuctl.core.placement.constraints import clash, model_ok
from gpuctl.core.placement.fit import Demand
from gpuctl.core.placement.fragmentation import WorkloadIndex
from gpuctl.core.placement.model import Allocation, FleetState, JobRequest, Settings
from gpuctl.core.placement.shape import demand_on, limit_mib, request_text

MAX_SUBSETS = 256


def make_room(
    state: FleetState,
    facts: Mapping[str, JobFacts],
    index: WorkloadIndex,
    request: JobRequest,
    settings: Settings,
    *,
    max_moves: int,
    now: float,
) -> tuple[list[Migration], list[Pinned], TargetOutcome]:
    work = Work(state, index)
    pinned: list[Pinned] = []
    movable: set[str] = set()
    for a in sorted(state.allocations, key=lambda a: a.job):
        why = pin_reason(a, facts.get(a.job), work, now)
        if why is None:
            movable.add(a.job)
        else:
            pinned.append(Pinned(a.job, a.node, why))
    shape_text = request_text(request.shape)
    me = Allocation(
        request.name,
        "",
        (),
        0,
        group=request.group,
        avoid_jobs=request.avoid_jobs,
        avoid_groups=request.avoid_groups,
    )
    failures: dict[str, list[str]] = {}
    best: tuple[tuple[int, int, str], list[Migration], WNode, tuple[int, ...]] | None = None
    demands: dict[int, Demand] = {}
    # A node needs at least `_least_moves` moves: visit them fewest first and stop once no node
    # left can match the best plan, or needs more than `max_moves`. Only when no node makes room
    # are the rest visited, for the reasons why.
    bounds = sorted(
        (_least_moves(work, node, request, settings, me, demands), node.name)
        for node in work.nodes.values()
    )
    left = []
    for at, (least, name) in enumerate(bounds):
        if least > min(max_moves, best[0][0] if best is not None else max_moves):
            left = bounds[at:]
            break
        found = _try(work, work.nodes[name], request, settings, me, movable, facts, max_moves)
        if isinstance(found, str):
            failures.setdefault(found, []).append(name)
        elif best is None or found[0] < best[0]:
            best = (found[0], found[1], work.nodes[name], found[2])
    if best is None:
        for _, name in left:
            found = _try(work, work.nodes[name], request, settings, me, movable, facts, max_moves)
            assert isinstance(found, str), "a node the bound skipped made room"
            failures.setdefault(found, []).append(name)
        for nodes in failures.values():
            nodes.sort()
    if best is None:
        parts = "; ".join(
            f"{len(nodes)} node(s): {why}"
            for why, nodes in sorted(failures.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        )
        reason = f"no node can make room for {shape_text}: {parts or 'no schedulable node'}"
        return [], pinned, TargetOutcome(shape_text, False, None, (), reason)
    _, moves, node, positions = best
    cards = tuple(node.index[p] for p in positions)
    where = f"{node.name} cards {','.join(map(str, cards)) or '-'}"
    if moves:
        reason = f"{shape_text} fits on {where} after {len(moves)} move(s)"
    else:
        reason = f"{shape_text} fits now on {where}, without moving anything"
    band = _band_note(state, node, positions, request, settings)
    if band:
        reason = f"{reason}; {band}"
    return moves, pinned, TargetOutcome(shape_text, True, node.name, cards, reason)


def _try(
    work: Work,
    node: WNode,
    request: JobRequest,
    settings: Settings,
    me: Allocation,
    movable: set[str],
    facts: Mapping[str, JobFacts],
    max_moves: int,
) -> tuple[tuple[int, int, str], list[Migration], tuple[int, ...]] | str:
    """Make room on `node` with the fewest moves: ((moves, stranded after, name), the moves, the
    target's card positions), or why it cannot. Leaves `work` as it found it."""
    options = _options(work, node, request, settings, me, movable)
    if isinstance(options, str):
        return options
    for evict, positions in options:
        if len(evict) > max_moves:
            return f"needs {len(evict)} moves, more than the maximum of {max_moves}"
        moves = _relocate(work, node, evict, facts)
        if moves is not None:
            found = ((len(moves), work.total_cost(), node.name), moves, positions)
            _undo(work, moves)
            return found
    return "the jobs to move fit nowhere else"


def _least_moves(
    work: Work,
    node: WNode,
    request: JobRequest,
    settings: Settings,
    me: Allocation,
    demands: dict[int, Demand],
) -> float:
    """A lower bound on the jobs `_options` moves off `node` for the target, cheaply: the fewest
    jobs that free enough cards (whole cards: the cards with the fewest jobs; a slice: the
    largest slices of a card), CPU and host memory, and the jobs it may not share a node with;
    infinite where `_options` finds no way."""
    shape = request.shape
    usable = _usable(node, request)
    if isinstance(usable, str):
        return math.inf
    least = 0
    if shape.gpus:
        cap_ref = max((node.caps[p] for p in usable), default=0)
        demand = demands.get(cap_ref)
        if demand is None:
            demand = demands[cap_ref] = demand_on(shape, cap_ref, settings)
        on: dict[int, list[int]] = {p: [] for p in usable}
        for a in node.jobs.values():
            for p in node.positions(a):
                if p in on:
                    on[p].append(_units(node, a, p))
        if demand.whole:
            counts = sorted(len(on[p]) for p in usable if not node.ghost[p])
            if len(counts) < demand.gpus:
                return math.inf
            least = counts[demand.gpus - 1]
        else:
            free = node.free_now()
            fewest = math.inf
            for p in usable:
                if node.caps[p] - node.ghost[p] < demand.mib_per_card:
                    continue
                need = demand.mib_per_card - free[p]
                n = 0
                for units in sorted(on[p], reverse=True):
                    if need <= 0:
                        break
                    n += 1
                    need -= units
                if need <= 0:
                    fewest = min(fewest, n)
            if fewest == math.inf:
                return math.inf
            least = int(fewest)
    jobs = node.jobs.values()
    for free_now, short, key in (
        (node.cpu_free(), shape.cpu_milli, lambda a: a.cpu_milli),
        (node.mem_free(), shape.host_mem_mib, lambda a: a.host_mem_mib),
    ):
        if free_now is None or free_now >= short:
            continue
        need, n = short - free_now, 0
        for size in sorted(map(key, jobs), reverse=True):
            if need <= 0:
                break
            n += 1
            need -= size
        if need > 0:
            return math.inf
        least = max(least, n)
    return max(least, sum(1 for a in jobs if clash(me, a)))


def _options(
    work: Work,
    node: WNode,
    request: JobRequest,
    settings: Settings,
    me: Allocation,
    movable: set[str],
) -> list[tuple[list[Allocation], tuple[int, ...]]] | str:
    """Ways to make room on `node` (jobs to move, the target's card positions), fewest first;
    or why the node cannot take the target at all."""
    shape = request.shape
    usable = _usable(node, request)
    if isinstance(usable, str):
        return usable
    must = [a for a in node.jobs.values() if clash(me, a)]
    cap_ref = max((node.caps[p] for p in usable), default=0)
    demand = demand_on(shape, cap_ref, settings)
    sets: list[tuple[list[Allocation], tuple[int, ...]]] = []
    if demand.gpus == 0:
        sets.append(([], ()))
    elif demand.whole:
        for combo in _combos(node, usable, demand.gpus):
            on = _jobs_on(node, combo)
            if any(node.ghost[p] for p in combo):
                continue
            sets.append((on, combo))
    else:
        free = node.free()
        for p in usable:
            if node.caps[p] - node.ghost[p] < demand.mib_per_card:
                continue
            need = demand.mib_per_card - free[p]
            on = sorted(_jobs_on(node, (p,)), key=lambda a: (-_units(node, a, p), a.job))
            chosen: list[Allocation] = []
            for a in on:
                if need <= 0:
                    break
                chosen.append(a)
                need -= _units(node, a, p)
            if need <= 0:
                sets.append((chosen, (p,)))
    out = []
    seen: set[tuple[tuple[str, ...], tuple[int, ...]]] = set()
    for (evict, positions), gpu_free_first in itertools.product(sets, (False, True)):
        full = _with_host(
            node,
            {a.job: a for a in (*evict, *must)},
            shape.cpu_milli,
            shape.host_mem_mib,
            movable,
            gpu_free_first=gpu_free_first,
        )
        if full is None or not all(a.job in movable for a in full):
            continue
        key = (tuple(a.job for a in full), positions)
        if key not in seen:
            seen.add(key)
            out.append((full, positions))
    if not out:
        return "a job there may not move" if sets else "no card can be freed for it"
    out.sort(key=lambda ep: (len(ep[0]), sum(a.mib_per_card * len(a.cards) for a in ep[0]), ep[1]))
    return out


def _usable(node: WNode, request: JobRequest) -> list[int] | str:
    """The card positions of `node` that could hold one share of the target, or why the node
    cannot take it even empty (labels, host CPU or memory, too few such cards)."""
    shape = request.shape
    for r in request.node_affinity:
        if not r.matches(node.labels):
            return f"lacks label {r.text()}"
    for r in request.node_anti_affinity:
        if r.matches(node.labels):
            return f"has label {r.text()}"
    if node.cpu_cap is not None and node.cpu_cap < shape.cpu_milli:
        return "too few CPU cores"
    if node.mem_cap is not None and node.mem_cap < shape.host_mem_mib:
        return "too little host memory"
    mib = shape.mem_per_card.mib
    usable = [
        p
        for p in range(len(node.caps))
        if node.healthy[p]
        and model_ok(shape.gpu_models, node.models[p])
        and (mib is None or node.caps[p] >= mib)
    ]
    return "too few usable cards" if len(usable) < shape.gpus else usable


def _combos(node: WNode, usable: list[int], k: int) -> list[tuple[int, ...]]:
    n = len(usable)
    total = 1
    for i in range(k):
        total = total * (n - i) // (i + 1)
    if total <= MAX_SUBSETS:
        return list(itertools.combinations(usable, k))
    by_jobs = sorted(usable, key=lambda p: (len(_jobs_on(node, (p,))), p))
    return [tuple(sorted(by_jobs[:k]))]


def _jobs_on(node: WNode, positions: tuple[int, ...]) -> list[Allocation]:
    cards = {node.index[p] for p in positions}
    return sorted((a for a in node.jobs.values() if cards & set(a.cards)), key=lambda a: a.job)


def _units(node: WNode, a: Allocation, p: int) -> int:
    return node.caps[p] if a.whole else a.mib_per_card


def _with_host(
    node: WNode,
    evict: dict[str, Allocation],
    cpu: int,
    mem: int,
    movable: set[str],
    *,
    gpu_free_first: bool = False,
) -> list[Allocation] | None:
    """`evict`, plus the largest movable jobs until the node has `cpu` and `mem` free; with
    `gpu_free_first`, the jobs holding no GPU before the others (they fit any node with the
    cores and memory, where a GPU job needs room on a card too)."""
    cpu_free = node.cpu_free()
    mem_free = node.mem_free()

    def short() -> bool:
        c = cpu_free is not None and cpu_free + sum(a.cpu_milli for a in evict.values()) < cpu
        m = mem_free is not None and mem_free + sum(a.host_mem_mib for a in evict.values()) < mem
        return c or m

    rest = sorted(
        (a for a in node.jobs.values() if a.job not in evict and a.job in movable),
        key=lambda a: (
            gpu_free_first and bool(a.cards),
            -a.cpu_milli,
            -a.host_mem_mib,
            a.job,
        ),
    )
    for a in rest:
        if not short():
            break
        evict[a.job] = a
    return None if short() else sorted(evict.values(), key=lambda a: a.job)


def _relocate(
    work: Work, node: WNode, evict: list[Allocation], facts: Mapping[str, JobFacts]
) -> list[Migration] | None:
    """Move `evict` off `node` (largest first), each where it adds the least stranded memory.
    Leaves the moves applied to `work` when it succeeds; undoes them and returns None if not."""
    order = sorted(evict, key=lambda a: (-a.mib_per_card * len(a.cards), -a.cpu_milli, a.job))
    moves: list[Migration] = []
    for a in order:
        f = facts[a.job]
        form = work.form(a, f, node)
        best: tuple[int, str, tuple[int, ...]] | None = None
        for name, found in work.destinations(form).items():
            if name != node.name and (best is None or (found[0], name) < best[:2]):
                best = (found[0], name, found[1])
        if best is None:
            _undo(work, moves)
            return None
        before = work.cost(node) + work.cost(work.nodes[best[1]])
        moved = work.move(a, node, work.nodes[best[1]], best[2])
        after = work.cost(node) + work.cost(work.nodes[best[1]])
        moves.append(
            Migration(
                job=a.job,
                tier=a.tier,
                from_node=a.node,
                from_cards=a.cards,
                to_node=moved.node,
                to_cards=moved.cards,
                mib_per_card=a.mib_per_card,
                whole=a.whole,
                checkpoint_age_s=f.checkpoint_age_s,
                stranded_freed_mib=(before - after) / work.index.denominator,
                cpu_milli=a.cpu_milli,
                host_mem_mib=a.host_mem_mib,
            )
        )
    return moves


def _undo(work: Work, moves: list[Migration]) -> None:
    for m in reversed(moves):
        work.put_back(m.job, m.from_node, m.from_cards)


def _band_note(
    state: FleetState, node: WNode, positions: tuple[int, ...], request: JobRequest, s: Settings
) -> str | None:
    demand = demand_on(request.shape, max((node.caps[p] for p in positions), default=0), s)
    added = (
        sum(node.caps[p] for p in positions)
        if demand.whole
        else demand.mib_per_card * len(positions)
    )
    limit = s.limit_for(request.tier)
    if added and state.allocated_mib() + added > limit_mib(state.capacity_mib(), limit):
        return (
            f"but {request.tier.value}-tier admission stops at {100 * limit:.1f}% of fleet GPU "
            "memory: placement will refuse it until utilization drops"
        )
    return None
