"""What consolidation buys on the openb traces: the replay with a consolidation pass every K
arrivals.

The protocol is the placement benchmark's (arrival order, tune, seeded node priority, the policy's
per-node scores with ties to the lowest priority rank). Every `every` arrivals, the pure planner
(`gpuctl.core.consolidation.plan_consolidation`) runs on the cluster, in the benchmark's milli-GPU
units, against the workload the policy sees; its moves are applied, then the replay continues. The
moves of the whole run are capped at `max_moves_pct` % of the pods placed so far, so at the end
at most that share of the placed pods was ever moved. `every=0` is the same replay without
consolidation (the baseline beside it). The matrix over policies and seeds, its table and
document: `gpuctl.bench.consolidation_report`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Collection, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from gpuctl.bench import bound
from gpuctl.bench.openb import MILLI_PER_GPU, OpenbNode, OpenbPod
from gpuctl.bench.protocol import (
    arrival_sequence,
    gpu_capacity_milli,
    node_priority,
    pod_demand,
    target_workload,
)
from gpuctl.bench.replay import allocation_curve, fleet_policy
from gpuctl.bench.rng import Rng
from gpuctl.core.consolidation import JobFacts, plan_consolidation
from gpuctl.core.placement.fit import Choice, Demand, NodeFree, Workload
from gpuctl.core.placement.model import (
    WHOLE,
    Allocation,
    Card,
    FleetState,
    JobRequest,
    JobShape,
    PlacementNode,
    Settings,
)
from gpuctl.core.placement.policies import Policy
from gpuctl.core.units import MemPerCard

IntArray = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True, slots=True)
class ConsolidationRun:
    policy: str
    seed: int
    every: int  # arrivals between passes; 0: never
    max_moves_pct: float
    alloc_100: float | None  # None: no arrival fell in that column (tiny traces)
    alloc_130: float | None
    moves: int
    passes: int
    placed: int
    pods: int
    seconds: float
    planner_seconds: float
    ceiling_pct: float  # no placement reaches more with the pods this run placed (see `ceiling`)
    # The two below rest on an assumption (see `bound.packing_ceiling`): the lowest of the three
    # is the run's ceiling (`lowest_ceiling`).
    # no run placing the pods that arrived before this run's first failure reaches more
    # (`bound.packing_ceiling`); None without scipy
    packing_ceiling_pct: float | None = None
    # the same, from the node-type LP with those pods placed (`bound.forced_ceiling`): nodes,
    # CPU, memory, card models and multi-GPU pods counted; None without scipy
    forced_ceiling_pct: float | None = None
    # no run placing every pod this one placed by column 130 reaches more (`kept_ceiling`), for
    # a run without consolidation; for a consolidating one, `paired` sets it (None until then):
    # over every pod both it and the same seed without consolidation placed, so it bounds both.
    # No assumption.
    kept_ceiling_pct: float | None = None
    # pods the same seed without consolidation placed by column 130 that this run did not
    # (`paired`; None outside a matrix or without consolidation)
    dropped: int | None = None
    before_failure: int | None = None  # arrivals before the first pod that found no room
    curve: tuple[float | None, ...] = ()  # allocation per column x = 0..130
    room_moves: int = 0  # drain-and-refill for each pod that finds no room, within this; 0: off
    room_plans: int = 0  # drain-and-refill plans made
    # the arrivals up to column 130 and the names of the pods placed, for `paired` (in process
    # only: not in the report's document)
    prefix: tuple[OpenbPod, ...] = dataclasses.field(default=(), repr=False, compare=False)
    placed_names: frozenset[str] = dataclasses.field(default=frozenset(), repr=False, compare=False)

    @property
    def moved_pct(self) -> float:
        return 0.0 if self.placed == 0 else 100.0 * self.moves / self.placed

    @property
    def lowest_ceiling_pct(self) -> float:
        """The lowest of the run's ceilings (those known)."""
        known = (self.packing_ceiling_pct, self.forced_ceiling_pct, self.kept_ceiling_pct)
        return min([self.ceiling_pct, *(c for c in known if c is not None)])


class Cluster:
    """The replay's mutable state: per-node free milli per card, CPU and memory, the pods on it."""

    def __init__(self, nodes: Sequence[OpenbNode]) -> None:
        self.nodes = list(nodes)
        self.free: list[list[int]] = [[MILLI_PER_GPU] * n.gpus for n in nodes]
        self.cpu: IntArray = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem: IntArray = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.max_free: IntArray = np.array(
            [MILLI_PER_GPU if n.gpus else 0 for n in nodes], dtype=np.int64
        )
        self.full: IntArray = np.array([n.gpus for n in nodes], dtype=np.int64)
        self.models = np.array([n.model for n in nodes])
        self.version: IntArray = np.zeros(len(nodes), dtype=np.int64)
        self.where: dict[str, tuple[int, tuple[int, ...], OpenbPod]] = {}  # pod -> node, cards

    def view(self, n: int) -> NodeFree:
        return NodeFree(
            name="",
            free=tuple(self.free[n]),
            capacity=(MILLI_PER_GPU,) * len(self.free[n]),
            cpu_free_milli=int(self.cpu[n]),
            mem_free_mib=int(self.mem[n]),
            gpu_model=self.nodes[n].model,
            cpu_milli=self.nodes[n].cpu_milli,  # the node's kind (the policy's kind pressure)
            mem_mib=self.nodes[n].memory_mib,
        )

    def feasible(self, d: Demand) -> IntArray:
        mask = (self.cpu >= d.cpu_milli) & (self.mem >= d.mem_mib)
        if d.gpu_models:
            mask &= np.isin(self.models, d.gpu_models)
        if d.gpus and d.whole:
            mask &= self.full >= d.gpus
        elif d.gpus:
            mask &= self.max_free >= d.mib_per_card
        return np.flatnonzero(mask)

    def _change(self, n: int, pod: OpenbPod, cards: tuple[int, ...], sign: int) -> None:
        for c in cards:
            self.free[n][c] -= sign * pod.gpu_milli
        self.cpu[n] -= sign * pod.cpu_milli
        self.mem[n] -= sign * pod.memory_mib
        self.max_free[n] = max(self.free[n], default=0)
        self.full[n] = sum(1 for f in self.free[n] if f == MILLI_PER_GPU)
        self.version[n] += 1

    def place(self, n: int, pod: OpenbPod, cards: tuple[int, ...]) -> None:
        self._change(n, pod, cards, 1)
        self.where[pod.name] = (n, cards, pod)

    def move(self, pod_name: str, n: int, cards: tuple[int, ...]) -> None:
        src, old, pod = self.where[pod_name]
        self._change(src, pod, old, -1)
        self.place(n, pod, cards)

    def fleet_state(self) -> FleetState:
        nodes = tuple(
            PlacementNode(
                name=self.nodes[i].name,
                cards=tuple(
                    Card(
                        index=c,
                        capacity_mib=MILLI_PER_GPU,
                        model=self.nodes[i].model,
                        allocated_mib=MILLI_PER_GPU - f,
                    )
                    for c, f in enumerate(self.free[i])
                ),
                cpu_milli=self.nodes[i].cpu_milli,
                cpu_allocated_milli=self.nodes[i].cpu_milli - int(self.cpu[i]),
                host_mem_mib=self.nodes[i].memory_mib,
                host_mem_allocated_mib=self.nodes[i].memory_mib - int(self.mem[i]),
            )
            for i in range(len(self.nodes))
        )
        allocations = tuple(
            Allocation(
                job=name,
                node=self.nodes[n].name,
                cards=cards,
                mib_per_card=pod.gpu_milli if pod.num_gpu else 0,
                whole=pod.num_gpu > 0 and pod.gpu_milli >= MILLI_PER_GPU,
                cpu_milli=pod.cpu_milli,
                host_mem_mib=pod.memory_mib,
            )
            for name, (n, cards, pod) in sorted(self.where.items())
        )
        return FleetState(nodes=nodes, allocations=allocations, version="bench")


def facts_of(cluster: Cluster) -> list[JobFacts]:
    return [
        JobFacts(job=name, checkpoint_age_s=0.0, gpu_models=pod_demand(pod).gpu_models)
        for name, (_, _, pod) in sorted(cluster.where.items())
    ]


def consolidate(
    cluster: Cluster, workload: Workload, max_moves: int, index_of: dict[str, int]
) -> int:
    """One pass of the planner on the cluster; its moves are applied. Returns the moves made."""
    if max_moves <= 0:
        return 0
    plan = plan_consolidation(
        cluster.fleet_state(), facts_of(cluster), max_moves=max_moves, workload=workload, now=0.0
    )
    for m in plan.moves:
        cluster.move(m.job, index_of[m.to_node], m.to_cards)
    return len(plan.moves)


# The replay's slices stay slices whatever their size (a pod of 1000 milli takes whole cards).
SETTINGS = Settings(whole_card_over=1.0)


def pod_request(pod: OpenbPod) -> JobRequest:
    """A pod as the planner's target (`gpuctl consolidate --for-job`)."""
    per = WHOLE if pod.gpu_milli >= MILLI_PER_GPU else MemPerCard(mib=pod.gpu_milli)
    shape = JobShape(
        gpus=pod.num_gpu,
        mem_per_card=per if pod.num_gpu else WHOLE,
        gpu_models=pod_demand(pod).gpu_models,
        cpu_milli=pod.cpu_milli,
        host_mem_mib=pod.memory_mib,
    )
    return JobRequest(pod.name, shape)


def make_room(
    cluster: Cluster, pod: OpenbPod, workload: Workload, max_moves: int, index_of: dict[str, int]
) -> int | None:
    """Drain-and-refill for a pod that found no room: the planner's plan is applied and the pod
    placed where it made room. Returns the moves made, or None where no plan within `max_moves`
    makes room (nothing changes)."""
    plan = plan_consolidation(
        cluster.fleet_state(),
        facts_of(cluster),
        max_moves=max_moves,
        workload=workload,
        settings=SETTINGS,
        now=0.0,
        target=pod_request(pod),
    )
    if plan.target is None or not plan.target.fits or plan.target.node is None:
        return None
    for m in plan.moves:
        cluster.move(m.job, index_of[m.to_node], m.to_cards)
    cluster.place(index_of[plan.target.node], pod, plan.target.cards)
    return len(plan.moves)


def replay_consolidating(
    nodes: Sequence[OpenbNode],
    pods: Sequence[OpenbPod],
    policy: Policy,
    rng: Rng,
    *,
    seed: int,
    every: int,
    max_moves_pct: float,
    tune: float = 1.3,
    policy_workload: Workload | None = None,
    room_moves: int = 0,
) -> ConsolidationRun:
    """Replay with a consolidation pass every `every` arrivals (0: none) and, with `room_moves`,
    drain-and-refill (at most that many moves) for each pod that finds no room. The policy sees
    `policy_workload` (default: the paper's), and the planner measures against the same: placement
    and consolidation weigh one workload."""
    if every < 0 or room_moves < 0 or not 0 <= max_moves_pct <= 100:
        raise ValueError("every and room_moves must be >= 0 and max_moves_pct in [0, 100]")
    started = time.perf_counter()
    capacity = gpu_capacity_milli(nodes)
    paper = target_workload(pods)
    workload = policy_workload if policy_workload is not None else paper
    arrivals = arrival_sequence(pods, rng, round(tune * capacity))
    ordered = sorted(nodes, key=lambda n: n.name)
    prio = node_priority(ordered, rng)
    rank = np.array([prio[n.name] for n in ordered], dtype=np.int64)
    index_of = {n.name: i for i, n in enumerate(ordered)}
    cluster = Cluster(ordered)
    scores = Scores(fleet_policy(policy, ordered), workload, len(ordered))
    arrived = used = placed = moves = passes = 0
    before_failure: int | None = None  # arrivals before the first pod that found no room
    planner = 0.0
    plans = 0  # drain-and-refill plans
    hopeless: set[tuple[Demand, int]] = set()
    arrived_log: list[int] = []
    used_log: list[int] = []
    for k, pod in enumerate(arrivals, start=1):
        demand = pod_demand(pod)
        arrived += pod.gpu_request_milli
        chosen = scores.best(cluster, demand, rank)
        made: int | None = None
        if chosen is not None:
            cluster.place(chosen[0], pod, chosen[1])
        elif room_moves:
            budget = min(room_moves, math.floor(max_moves_pct * placed / 100) - moves)
            # the same plan fails again for the same request while nothing changed
            key = (demand, int(cluster.version.sum()))
            if budget > 0 and key not in hopeless:
                t0 = time.perf_counter()
                made = make_room(cluster, pod, workload, budget, index_of)
                planner += time.perf_counter() - t0
                plans += 1
                if made is None:
                    hopeless.add(key)
                else:
                    moves += made
        if chosen is not None or made is not None:
            placed += 1
            used += pod.gpu_request_milli
        elif before_failure is None:
            before_failure = k - 1
        arrived_log.append(arrived)
        used_log.append(used)
        if every and k % every == 0:
            budget = math.floor(max_moves_pct * placed / 100) - moves
            t0 = time.perf_counter()
            moves += consolidate(cluster, workload, budget, index_of)
            planner += time.perf_counter() - t0
            passes += 1
    curve = allocation_curve(arrived_log, used_log, capacity)
    must = len(arrivals) if before_failure is None else before_failure
    placed_pods = [pod for _, _, pod in cluster.where.values()]
    prefix = bound.column_prefix(arrivals, capacity, 130) or ()
    placed_names = frozenset(cluster.where)
    return ConsolidationRun(
        policy=policy.name,
        seed=seed,
        every=every,
        max_moves_pct=max_moves_pct,
        alloc_100=curve[100],
        alloc_130=curve[130],
        moves=moves,
        passes=passes,
        placed=placed,
        pods=len(arrivals),
        seconds=time.perf_counter() - started,
        planner_seconds=planner,
        ceiling_pct=ceiling(placed_pods, arrivals, capacity),
        packing_ceiling_pct=bound.packing_ceiling(
            arrivals, must, capacity, sum(n.gpus for n in nodes)
        )
        if bound.available()
        else None,
        forced_ceiling_pct=bound.forced_ceiling(nodes, arrivals, must)
        if bound.available()
        else None,
        # a consolidating run's own would be replaced by its pair's (`paired`): not solved twice
        kept_ceiling_pct=kept_ceiling(nodes, prefix, placed_names)
        if prefix and not (every or room_moves)
        else None,
        before_failure=before_failure,
        curve=curve,
        room_moves=room_moves,
        room_plans=plans,
        prefix=prefix,
        placed_names=placed_names,
    )


HOLE_MAX = 200  # a card holding a slice of 800 milli or more keeps a hole of at most this


def ceiling(placed: Sequence[OpenbPod], arrivals: Sequence[OpenbPod], capacity: int) -> float:
    """An upper bound on the allocation (% of capacity) any placement of the arrivals can reach
    once `placed` are placed for good: a card holding a slice of g >= 800 milli has at most
    1000 - g left, which only slices of at most 200 milli can use, and no more of those
    arrive than the arrivals hold."""
    holes = sum(
        MILLI_PER_GPU - p.gpu_milli
        for p in placed
        if p.num_gpu == 1 and MILLI_PER_GPU - HOLE_MAX <= p.gpu_milli < MILLI_PER_GPU
    )
    small = sum(p.gpu_milli for p in arrivals if p.num_gpu == 1 and p.gpu_milli <= HOLE_MAX)
    return round(100.0 * min(capacity, capacity - holes + small) / capacity, 2)


def kept_ceiling(
    nodes: Sequence[OpenbNode], prefix: Sequence[OpenbPod], keep: Collection[str]
) -> float:
    """An upper bound on the allocation at x=130 (% of capacity) of any run whose arrivals up
    to column 130 are `prefix` and which places the pods of `keep` among them, however its
    pods are moved meanwhile; a bound, no assumption.

    The lowest of `ceiling` (the holes beside the kept slices of 800 milli or more), the
    packing ceiling and the forced bound's LP (`bound.packing_ceiling`, `bound.forced_bound`)
    with the kept pods as the forced ones and the other arrivals of the column optional. Those
    two force a prefix of the arrivals; the order matters to neither but for which pods are
    forced, so the kept pods go first. A run without consolidation places its own pods; one
    with consolidation compared with it is bound by the pods both placed (`paired`).
    """
    capacity = gpu_capacity_milli(nodes)
    kept = [p for p in prefix if p.name in keep]
    pods = kept + [p for p in prefix if p.name not in keep]
    best = ceiling(kept, prefix, capacity)
    if bound.available():
        lp = bound.forced_bound(nodes, pods, len(kept))
        cards = sum(n.gpus for n in nodes)
        best = min(
            best,
            round(100.0 * lp.milli / capacity, 2),
            bound.packing_ceiling(pods, len(kept), capacity, cards),
        )
    return best


def paired(
    nodes: Sequence[OpenbNode], base: ConsolidationRun, run: ConsolidationRun
) -> ConsolidationRun:
    """`run` with its kept ceiling over the pods both it and `base` (the same seed without
    consolidation, the same arrivals) placed by column 130, a bound for both, and the count of
    `base`'s pods it did not place. A consolidating run may turn away a pod the run without
    consolidation placed (its fleet differs when the pod arrives), so `base`'s own kept
    ceiling does not bind it."""
    if not run.prefix:
        return run
    arrived = {p.name for p in run.prefix}
    both = base.placed_names & run.placed_names
    return dataclasses.replace(
        run,
        kept_ceiling_pct=kept_ceiling(nodes, run.prefix, both),
        dropped=len((base.placed_names - run.placed_names) & arrived),
    )


class Scores:
    """Per demand, the policy's answer for every node, stamped with the node's version."""

    def __init__(self, policy: Policy, workload: Workload, n_nodes: int) -> None:
        self.policy = policy
        self.workload = workload
        self.n = n_nodes
        self.memo: dict[tuple[NodeFree, Demand], Choice | None] = {}
        self.tables: dict[
            Demand, tuple[npt.NDArray[np.float64], IntArray, list[tuple[int, ...]]]
        ] = {}

    def best(
        self, cluster: Cluster, demand: Demand, rank: IntArray
    ) -> tuple[int, tuple[int, ...]] | None:
        idx = cluster.feasible(demand)
        if idx.size == 0:
            return None
        table = self.tables.get(demand)
        if table is None:
            table = self.tables[demand] = (
                np.full(self.n, -math.inf),
                np.full(self.n, -1, dtype=np.int64),
                [()] * self.n,
            )
        score, stamp, cards = table
        for n in idx[stamp[idx] != cluster.version[idx]].tolist():
            key = (cluster.view(n), demand)
            if key in self.memo:
                choice = self.memo[key]
            else:
                if len(self.memo) > 1_000_000:
                    self.memo.clear()
                choice = self.memo[key] = self.policy.choose(key[0], demand, self.workload)
            score[n] = -math.inf if choice is None else choice.score
            cards[n] = () if choice is None else choice.cards
            stamp[n] = cluster.version[n]
        s = score[idx]
        top = s.max()
        if top == -math.inf:
            return None
        tied = idx[s == top]
        n = int(tied[np.argmin(rank[tied])])
        return n, cards[n]


def run_one(
    nodes: tuple[OpenbNode, ...],
    pods: tuple[OpenbPod, ...],
    name: str,
    seed: int,
    every: int,
    max_moves_pct: float,
    tune: float = 1.3,
    room_moves: int = 0,
) -> ConsolidationRun:
    """One replay of policy `name` (as the placement benchmark configures it)."""
    from gpuctl.bench.rng import NumpyRng
    from gpuctl.bench.runner import bench_policy

    policy, spec = bench_policy(name)
    run = replay_consolidating(
        nodes,
        pods,
        policy,
        NumpyRng(seed),
        seed=seed,
        every=every,
        max_moves_pct=max_moves_pct,
        tune=tune,
        policy_workload=target_workload(pods, spec),
        room_moves=room_moves,
    )
    return dataclasses.replace(run, policy=name)


def failed_pods(
    nodes: Sequence[OpenbNode],
    pods: Sequence[OpenbPod],
    name: str,
    seed: int,
    which: Sequence[int],
    tune: float = 1.3,
) -> Iterator[tuple[int, OpenbPod, Cluster, dict[str, int], Workload]]:
    """The replay of policy `name` without consolidation, stopped at its `which`-th failed pods
    (1: the first): (arrival number, the pod, the cluster then, node indexes, the paper's
    workload). The cluster is the replay's own: read it before the next one is yielded."""
    from gpuctl.bench.rng import NumpyRng
    from gpuctl.bench.runner import bench_policy

    policy, spec = bench_policy(name)
    rng = NumpyRng(seed)
    arrivals = arrival_sequence(pods, rng, round(tune * gpu_capacity_milli(nodes)))
    ordered = sorted(nodes, key=lambda n: n.name)
    prio = node_priority(ordered, rng)
    rank = np.array([prio[n.name] for n in ordered], dtype=np.int64)
    cluster = Cluster(ordered)
    scores = Scores(fleet_policy(policy, ordered), target_workload(pods, spec), len(ordered))
    index_of = {n.name: i for i, n in enumerate(ordered)}
    paper = target_workload(pods)
    wanted, failed = set(which), 0
    for k, pod in enumerate(arrivals, start=1):
        if not wanted:
            return
        chosen = scores.best(cluster, pod_demand(pod), rank)
        if chosen is not None:
            cluster.place(chosen[0], pod, chosen[1])
            continue
        failed += 1
        if failed in wanted:
            wanted.discard(failed)
            yield k, pod, cluster, index_of, paper
