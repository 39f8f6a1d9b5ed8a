"""How far the greedy consolidation is from the optimum, on small fleets (an exact CP-SAT model).

An instance: `n_nodes` nodes drawn (seeded) from the openb node list, filled by the replay (the
protocol's arrivals, tuned to `fill` x their GPU capacity) with a policy. On it, with the same
move budget, the greedy planner (`plan_consolidation`) and an exact model solved by OR-Tools
CP-SAT both minimise the planner's cost against the paper's target workload: stranded capacity,
plus `HOST_WEIGHT` times the unfed units (`host_stranded`: free card units beyond what a node's
free CPU and memory feed at the workload's average, none where a typical whole-card job takes
every free card and fits) and `DEAD_WEIGHT` times the dead holes (free units on a card in
`consolidation_dead_range`):

    variables  pod -> node (and -> cards), for every pod; a pod that leaves its cards is a move
    limits     card capacity, node CPU and memory, card models, moves <= the budget
    objective  maximise sum over shapes t (weight p_t) of the free units on cards that can
               host t, on nodes where t fits (enough such cards, enough CPU): the complement of
               stranded, since moves never change the total free capacity; less DEAD_WEIGHT
               times each card's dead hole; less HOST_WEIGHT times each node's unfed units
               (r * unfed >= r * free - spare, for CPU and for memory, r the workload's
               average per card unit rounded down to 1/1000; unless a typical job's
               exemption holds)

Weights are the workload's probabilities rounded to 1/100000; the greedy plan is the solver's
starting hint; both answers are then measured
exactly with `fleet_figures`. OR-Tools is an optional benchmark dependency, never a runtime one:
`available()` says whether it is installed, and the benchmark says so and skips this part.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuctl.bench.consolidation import Cluster, Scores
from gpuctl.bench.openb import MILLI_PER_GPU, OpenbNode, OpenbPod
from gpuctl.bench.protocol import (
    arrival_sequence,
    gpu_capacity_milli,
    node_priority,
    pod_demand,
    target_workload,
)
from gpuctl.bench.replay import fleet_policy
from gpuctl.bench.rng import NumpyRng
from gpuctl.core.consolidation import (
    JobFacts,
    apply_consolidation,
    fleet_figures,
    plan_consolidation,
)
from gpuctl.core.placement.fit import Workload
from gpuctl.core.placement.fragmentation import (
    DEAD_WEIGHT,
    HOST_WEIGHT,
    Fillers,
    consolidation_dead_range,
    dead_units,
    host_ratio,
    typical_fill,
    whole_fillers,
)
from gpuctl.core.placement.model import Allocation, Card, FleetState, PlacementNode
from gpuctl.core.placement.policies import Policy
from gpuctl.errors import UsageError

WEIGHT_SCALE = 100_000
DEAD_SCALE = DEAD_WEIGHT * WEIGHT_SCALE  # the weights sum to WEIGHT_SCALE
HOST_TERM = HOST_WEIGHT * WEIGHT_SCALE
HOST_SCALE = 1_000  # the host term's ratios (per card unit) are kept to 1/1000
MISSING = "OR-Tools is not installed: the exact comparison is skipped (pip install ortools)"


def available() -> bool:
    try:
        importlib.import_module("ortools.sat.python.cp_model")
    except ImportError:
        return False
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class Instance:
    name: str
    state: FleetState
    pods: dict[str, OpenbPod]
    workload: Workload


def small_fleet(
    nodes: Sequence[OpenbNode],
    pods: Sequence[OpenbPod],
    policy: Policy,
    policy_workload: Workload,
    *,
    n_nodes: int,
    seed: int,
    fill: float = 1.0,
) -> Instance:
    """`n_nodes` nodes drawn with `seed`, filled by the replay to `fill` x their capacity."""
    rng = NumpyRng(seed)
    by_name = sorted(nodes, key=lambda n: n.name)
    picked = sorted((by_name[i] for i in rng.perm(len(by_name))[:n_nodes]), key=lambda n: n.name)
    arrivals = arrival_sequence(pods, rng, round(fill * gpu_capacity_milli(picked)))
    prio = node_priority(picked, rng)
    rank = np.array([prio[n.name] for n in picked], dtype=np.int64)
    cluster = Cluster(picked)
    scores = Scores(fleet_policy(policy, picked), policy_workload, len(picked))
    for pod in arrivals:
        chosen = scores.best(cluster, pod_demand(pod), rank)
        if chosen is not None:
            cluster.place(chosen[0], pod, chosen[1])
    return Instance(
        name=f"{n_nodes} nodes, seed {seed}",
        state=cluster.fleet_state(),
        pods={name: pod for name, (_, _, pod) in cluster.where.items()},
        workload=target_workload(pods),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Exact:
    cost: float  # stranded + weighted dead units, measured exactly on the solver's assignment
    lower_bound: float  # no assignment within the budget costs less (up to weight rounding)
    moves: int
    optimal: bool
    seconds: float


def exact(
    inst: Instance,
    max_moves: int,
    *,
    time_limit_s: float = 30.0,
    workers: int = 1,
    hint: Sequence[Allocation] = (),
) -> Exact:
    """The CP-SAT optimum (or the best found in the time limit) for `max_moves` moves, and a
    lower bound on the cost from the solver's bound. `hint`: allocations to start from.
    Raises UsageError when OR-Tools is not installed."""
    try:
        cp = importlib.import_module("ortools.sat.python.cp_model")
    except ImportError:
        raise UsageError(MISSING) from None
    model: Any = cp.CpModel()
    state = inst.state
    nodes = [n for n in state.nodes if n.schedulable]
    allocs = sorted(state.allocations, key=lambda a: a.job)
    cards = [(n.name, c.index) for n in nodes for c in n.cards]
    on_node: dict[tuple[str, str], Any] = {}
    on_card: dict[tuple[str, tuple[str, int]], Any] = {}
    stays = []
    for a in allocs:
        pod = inst.pods[a.job]
        d = pod_demand(pod)
        choices = []
        for n in nodes:
            if d.gpu_models and n.cards and n.cards[0].model not in d.gpu_models:
                continue
            if len(n.cards) < d.gpus:
                continue
            x = model.NewBoolVar("")
            on_node[(a.job, n.name)] = x
            choices.append(x)
            if d.gpus:
                ys = []
                for c in n.cards:
                    y = model.NewBoolVar("")
                    on_card[(a.job, (n.name, c.index))] = y
                    ys.append(y)
                model.Add(sum(ys) == d.gpus * x)
        model.AddExactlyOne(choices)
        here = [on_card[(a.job, (a.node, c))] for c in a.cards]
        stay = model.NewBoolVar("")
        if here:
            for y in here:
                model.AddImplication(stay, y)
        else:
            model.AddImplication(stay, on_node[(a.job, a.node)])
        stays.append((a.job, stay))
    model.Add(len(allocs) - sum(v for _, v in stays) <= max_moves)
    used: dict[tuple[str, int], Any] = {}
    for key in cards:
        terms = [
            (MILLI_PER_GPU if a.whole else a.mib_per_card) * on_card[(a.job, key)]
            for a in allocs
            if (a.job, key) in on_card
        ]
        used[key] = sum(terms) if terms else 0
        model.Add(used[key] <= MILLI_PER_GPU)
    cpu_free: dict[str, Any] = {}
    mem_free: dict[str, Any] = {}
    for n in nodes:
        here = [(a, on_node[(a.job, n.name)]) for a in allocs if (a.job, n.name) in on_node]
        cpu_used = sum(a.cpu_milli * x for a, x in here) if here else 0
        mem_used = sum(a.host_mem_mib * x for a, x in here) if here else 0
        if n.cpu_milli is not None:
            model.Add(cpu_used <= n.cpu_milli)
            cpu_free[n.name] = n.cpu_milli - cpu_used
        if n.host_mem_mib is not None:
            model.Add(mem_used <= n.host_mem_mib)
            mem_free[n.name] = n.host_mem_mib - mem_used
    objective = []
    for demand, p in inst.workload:
        w = round(p * WEIGHT_SCALE)
        if demand.gpus == 0 or w == 0:
            continue
        need = MILLI_PER_GPU if demand.whole or demand.gpus > 1 else demand.mib_per_card
        for n in nodes:
            if demand.gpu_models and (not n.cards or n.cards[0].model not in demand.gpu_models):
                continue
            if len(n.cards) < demand.gpus:
                continue
            fits = model.NewBoolVar("")
            fit_cards = []
            for c in n.cards:
                key = (n.name, c.index)
                f = model.NewBoolVar("")
                model.Add(MILLI_PER_GPU - used[key] >= need).OnlyEnforceIf(f)
                model.Add(MILLI_PER_GPU - used[key] < need).OnlyEnforceIf(f.Not())
                fit_cards.append((key, f))
            model.Add(sum(f for _, f in fit_cards) >= demand.gpus).OnlyEnforceIf(fits)
            if n.name in cpu_free and demand.cpu_milli:
                model.Add(cpu_free[n.name] >= demand.cpu_milli).OnlyEnforceIf(fits)
            for key, f in fit_cards:
                ok = model.NewBoolVar("")
                model.AddImplication(ok, f)
                model.AddImplication(ok, fits)
                usable = model.NewIntVar(0, MILLI_PER_GPU, "")
                model.Add(usable <= MILLI_PER_GPU - used[key])
                model.Add(usable <= MILLI_PER_GPU * ok)
                objective.append(w * usable)
    objective.extend(_unfed_terms(model, inst, nodes, used, cpu_free, mem_free))
    lo, below = consolidation_dead_range(inst.workload)
    lo = max(lo, 1)
    holes: dict[tuple[str, int], tuple[Any, Any, Any, Any]] = {}  # card -> dead, small, live, units
    for key in cards:  # each dead unit costs DEAD_WEIGHT whole units of weight
        free = MILLI_PER_GPU - used[key]
        if isinstance(free, int):  # no pod may use this card: its hole is a constant
            objective.append(-DEAD_SCALE * dead_units((free,), below, lo))
            continue
        if lo >= below:  # no hole is dead
            continue
        dead, small, live = (model.NewBoolVar("") for _ in range(3))
        model.AddExactlyOne((dead, small, live))
        model.Add(free <= lo - 1).OnlyEnforceIf(small)
        model.Add(free >= below).OnlyEnforceIf(live)
        model.Add(free >= lo).OnlyEnforceIf(dead)
        model.Add(free <= below - 1).OnlyEnforceIf(dead)
        units = model.NewIntVar(0, below - 1, "")
        model.Add(units >= free).OnlyEnforceIf(dead)
        objective.append(-DEAD_SCALE * units)
        holes[key] = (dead, small, live, units)
    model.Maximize(sum(objective))
    start = {a.job: a for a in hint} or {a.job: a for a in allocs}
    for (job, node), x in on_node.items():
        model.AddHint(x, int(start[job].node == node))
    for (job, (node, index)), y in on_card.items():
        model.AddHint(y, int(start[job].node == node and index in start[job].cards))
    before = {a.job: a for a in allocs}
    for job, v in stays:
        model.AddHint(
            v, int((start[job].node, start[job].cards) == (before[job].node, before[job].cards))
        )
    started_from = _rebuilt(state, list(start.values()))
    for key, (dead, small, live, units) in holes.items():  # the hint, complete
        f = {c.index: c.free_mib for c in started_from.node(key[0]).cards}[key[1]]
        model.AddHint(dead, int(lo <= f < below))
        model.AddHint(small, int(f < lo))
        model.AddHint(live, int(f >= below))
        model.AddHint(units, f if lo <= f < below else 0)
    if hint:  # the optimum is never worse than the hint (a feasible assignment)
        model.Add(sum(objective) >= _objective(inst, started_from))
    solver: Any = cp.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    started = time.perf_counter()
    status = solver.Solve(model)
    took = time.perf_counter() - started
    if status in (cp.OPTIMAL, cp.FEASIBLE):
        placed = [_solved(a, nodes, state, on_node, on_card, solver) for a in allocs]
    elif hint:  # none found in the time limit: the hint is the best known; the bound holds
        placed = [start[a.job] for a in allocs]
    else:
        raise RuntimeError(f"CP-SAT found no solution ({solver.StatusName(status)})")
    after = _rebuilt(state, placed)
    moves = sum(
        1 for a, b in zip(allocs, placed, strict=True) if (a.node, a.cards) != (b.node, b.cards)
    )
    figures = fleet_figures(after, inst.workload)
    bound = figures.free_mib - solver.BestObjectiveBound() / WEIGHT_SCALE
    return Exact(
        cost=figures.cost_mib,
        lower_bound=max(0.0, min(bound, figures.cost_mib)),
        moves=moves,
        optimal=status == cp.OPTIMAL,
        seconds=took,
    )


def _host_steps(inst: Instance) -> tuple[int, int]:
    """The host term's ratios as integers: CPU and memory per card unit times `HOST_SCALE`,
    rounded down (so the model's unfed memory never exceeds the planner's: its bound holds)."""
    ratio = host_ratio(inst.workload)
    return (
        math.floor(ratio.cpu_milli_per_unit * HOST_SCALE),
        math.floor(ratio.mem_mib_per_unit * HOST_SCALE),
    )


def _unfed_terms(
    model: Any,
    inst: Instance,
    nodes: Sequence[PlacementNode],
    used: dict[tuple[str, int], Any],
    cpu_free: dict[str, Any],
    mem_free: dict[str, Any],
) -> list[Any]:
    """The objective's share of the host term (`host_stranded`, `HOST_WEIGHT` whole units of
    weight per unfed unit): per node, unfed >= free - free CPU / CPU per unit (and the same for
    memory), lifted where every free card is whole and a typical whole-card job takes them all
    and fits the host (the planner's exemption, as `host_stranded` decides it). Any of these
    may be constants (no pod can reach the card or node); Python compares those itself."""
    cpu_step, mem_step = _host_steps(inst)
    fillers = whole_fillers(inst.workload)
    terms: list[Any] = []
    for n in nodes:
        keys = [(n.name, c.index) for c in n.cards]
        limits = [
            (step, spare[n.name])
            for step, spare in ((cpu_step, cpu_free), (mem_step, mem_free))
            if step > 0 and n.name in spare
        ]
        if not keys or not limits:
            continue
        free = len(keys) * MILLI_PER_GPU - sum(used[k] for k in keys)
        empty: list[Any] = []
        partial: list[Any] = []
        for k in keys:
            if isinstance(used[k], int):
                empty.append(int(used[k] == 0))
                partial.append(int(0 < used[k] < MILLI_PER_GPU))
                continue
            e, f, part = (model.NewBoolVar("") for _ in range(3))
            model.AddExactlyOne((e, f, part))
            model.Add(used[k] == 0).OnlyEnforceIf(e)
            model.Add(used[k] == MILLI_PER_GPU).OnlyEnforceIf(f)
            model.Add(used[k] >= 1).OnlyEnforceIf(part)
            model.Add(used[k] <= MILLI_PER_GPU - 1).OnlyEnforceIf(part)
            empty.append(e)
            partial.append(part)
        exempt = []
        for g, shapes in fillers.items():
            for d in shapes:
                if g > len(keys) or (d.gpu_models and n.cards[0].model not in d.gpu_models):
                    continue
                x = model.NewBoolVar("")
                conditions = [sum(empty) == g, sum(partial) == 0]
                if n.name in cpu_free:
                    conditions.append(cpu_free[n.name] >= d.cpu_milli)
                if n.name in mem_free:
                    conditions.append(mem_free[n.name] >= d.mem_mib)
                if any(c is False for c in conditions):
                    continue  # a constant says no
                for c in conditions:
                    if c is not True:
                        model.Add(c).OnlyEnforceIf(x)
                exempt.append(x)
        unfed = model.NewIntVar(0, len(keys) * MILLI_PER_GPU, "")
        lifted = model.NewBoolVar("")  # some typical job takes every free card and fits
        if exempt:
            model.AddBoolOr(exempt).OnlyEnforceIf(lifted)
        else:
            model.Add(lifted == 0)
        for step, spare in limits:
            model.Add(step * unfed >= step * free - HOST_SCALE * spare).OnlyEnforceIf(lifted.Not())
        terms.append(-HOST_TERM * unfed)
    return terms


def _unfed_of(n: PlacementNode, steps: tuple[int, int], fillers: Fillers) -> int:
    """A node's unfed units as the model counts them (the least its variable can be), with the
    model's `_host_steps` and the workload's `whole_fillers`."""
    cpu_step, mem_step = steps
    view = n.totals().free
    total = sum(view.free)
    if typical_fill(view, fillers):
        return 0
    unfed = 0
    for step, spare in ((cpu_step, view.cpu_free_milli), (mem_step, view.mem_free_mib)):
        if spare is not None and step > 0:
            unfed = max(unfed, -((HOST_SCALE * spare - step * total) // step))  # the ceiling
    return unfed


def _solved(
    a: Allocation,
    nodes: Sequence[PlacementNode],
    state: FleetState,
    on_node: dict[tuple[str, str], Any],
    on_card: dict[tuple[str, tuple[str, int]], Any],
    solver: Any,
) -> Allocation:
    """Where the solver put `a`."""
    (node,) = [
        n.name
        for n in nodes
        if (a.job, n.name) in on_node and solver.Value(on_node[(a.job, n.name)])
    ]
    chosen = tuple(
        c.index
        for c in state.node(node).cards
        if (a.job, (node, c.index)) in on_card and solver.Value(on_card[(a.job, (node, c.index))])
    )
    return dataclasses.replace(a, node=node, cards=chosen)


def _objective(inst: Instance, state: FleetState) -> int:
    """The model's objective for an assignment, computed directly."""
    total = 0
    for demand, p in inst.workload:
        w = round(p * WEIGHT_SCALE)
        if demand.gpus == 0 or w == 0:
            continue
        need = MILLI_PER_GPU if demand.whole or demand.gpus > 1 else demand.mib_per_card
        for n in state.nodes:
            if demand.gpu_models and (not n.cards or n.cards[0].model not in demand.gpu_models):
                continue
            fit = [c.free_mib for c in n.cards if c.free_mib >= need]
            cpu = n.cpu_free_milli
            if len(fit) < demand.gpus or (cpu is not None and cpu < demand.cpu_milli):
                continue
            total += w * sum(fit)
    lo, below = consolidation_dead_range(inst.workload)
    steps, fillers = _host_steps(inst), whole_fillers(inst.workload)
    for n in state.nodes:
        total -= DEAD_SCALE * dead_units((c.free_mib for c in n.cards), below, lo)
        if n.cards:
            total -= HOST_TERM * _unfed_of(n, steps, fillers)
    return total


def _rebuilt(state: FleetState, allocs: Sequence[Allocation]) -> FleetState:
    nodes = []
    for n in state.nodes:
        mine = [a for a in allocs if a.node == n.name]
        cards = tuple(
            Card(
                c.index,
                c.capacity_mib,
                model=c.model,
                allocated_mib=sum(
                    (c.capacity_mib if a.whole else a.mib_per_card)
                    for a in mine
                    if c.index in a.cards
                ),
            )
            for c in n.cards
        )
        for c in cards:
            if c.allocated_mib > c.capacity_mib:
                raise RuntimeError(f"the exact solution overfills card {c.index} of {n.name}")
        nodes.append(
            PlacementNode(
                n.name,
                cards,
                cpu_milli=n.cpu_milli,
                cpu_allocated_milli=sum(a.cpu_milli for a in mine),
                host_mem_mib=n.host_mem_mib,
                host_mem_allocated_mib=sum(a.host_mem_mib for a in mine),
            )
        )
    return FleetState(tuple(nodes), tuple(allocs), state.version)


@dataclasses.dataclass(frozen=True, slots=True)
class GapRow:
    instance: str
    pods: int
    max_moves: int
    before: float  # cost units (stranded + weighted dead holes)
    greedy: float
    greedy_moves: int
    optimum: float
    optimum_moves: int
    lower_bound: float
    optimal: bool
    solver_seconds: float

    @property
    def captured_pct(self) -> float | None:
        """The share of the achievable reduction the greedy plan gets (100: the optimum)."""
        best = self.before - self.optimum
        return None if best <= 1e-9 else 100.0 * (self.before - self.greedy) / best


def gap(inst: Instance, max_moves: int, *, time_limit_s: float = 30.0, workers: int = 1) -> GapRow:
    plan = plan_consolidation(
        inst.state, facts_of_state(inst), max_moves=max_moves, workload=inst.workload, now=0.0
    )
    greedy = apply_consolidation(inst.state, plan).allocations
    best = exact(inst, max_moves, time_limit_s=time_limit_s, workers=workers, hint=greedy)
    return GapRow(
        instance=inst.name,
        pods=len(inst.pods),
        max_moves=max_moves,
        before=plan.before.cost_mib,
        greedy=plan.after.cost_mib,
        greedy_moves=len(plan.moves),
        optimum=best.cost,
        optimum_moves=best.moves,
        lower_bound=best.lower_bound,
        optimal=best.optimal,
        solver_seconds=best.seconds,
    )


def facts_of_state(inst: Instance) -> list[JobFacts]:
    return [
        JobFacts(job=name, checkpoint_age_s=0.0, gpu_models=pod_demand(pod).gpu_models)
        for name, pod in sorted(inst.pods.items())
    ]


def render_gaps(rows: Sequence[GapRow]) -> str:
    """A Markdown table of greedy vs exact: the cost (stranded capacity plus the weighted dead
    holes) in GPUs (1000 milli)."""
    lines = [
        "| fleet | pods | max moves | cost before | greedy after (moves) "
        "| CP-SAT after (moves) | optimal | gap | greedy's share of the best reduction |",
        "|" + "---|" * 9,
    ]
    for r in rows:
        best = r.before - r.optimum
        share = "-" if best < 50 or r.captured_pct is None else f"{r.captured_pct:.1f}%"
        lines.append(
            f"| {r.instance} | {r.pods} | {r.max_moves} | {r.before / 1000:.3f} "
            f"| {r.greedy / 1000:.3f} ({r.greedy_moves}) "
            f"| {r.optimum / 1000:.3f} ({r.optimum_moves}) "
            f"| {'proven' if r.optimal else 'best found'} "
            f"| {(r.greedy - r.optimum) / 1000:.3f} | {share} |"
        )
    return "\n".join(lines) + "\n"
