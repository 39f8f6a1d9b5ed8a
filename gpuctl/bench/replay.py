"""One replay of an openb trace under the FGD paper's protocol.

Pods arrive one at a time and are placed for good or dropped (no queue, no departures). For each
pod: filter the nodes (CPU, host memory, card model, card capacity) with numpy, ask the policy's
per-node `choose` for every feasible node, take the best score, and break ties by the seeded node
priority. `choose` is pure, so its answers are cached per (node state, pod shape): a node's answer
is recomputed only after the node itself changes, and identical nodes share one answer.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from gpuctl.bench.openb import MILLI_PER_GPU, OpenbNode, OpenbPod
from gpuctl.bench.protocol import (
    PAPER_WORKLOAD,
    WorkloadSpec,
    arrival_sequence,
    gpu_capacity_milli,
    node_free,
    node_priority,
    pod_demand,
    target_workload,
)
from gpuctl.bench.rng import Rng
from gpuctl.core.placement.fit import Choice, Demand, NodeFree, Workload, take
from gpuctl.core.placement.fragmentation import index_for
from gpuctl.core.placement.policies import NodeKind, Policy, for_fleet

IntArray = npt.NDArray[np.int64]


@dataclasses.dataclass(frozen=True, slots=True)
class RunResult:
    """The KPIs of one replay (allocation ratios in % of the cluster's GPU capacity)."""

    policy: str
    seed: int
    alloc_100: float | None  # None: the run never reached x=100 (tune < 1)
    alloc_130: float | None
    alloc_end: float  # after the last arrival (the trace-order protocol's KPI)
    frag_ratio_100: float | None  # % of idle GPU that is fragmented, around x=100
    seconds: float
    pods: int
    placed: int
    rejected: int
    curve: tuple[float | None, ...]  # allocation ratio per column x = 0..130


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """Where one arriving pod went: a node index (in name order) and its cards, or nowhere."""

    node: int | None
    cards: tuple[int, ...] = ()


class _Cluster:
    """Mutable replay state: numpy columns for the filters, `NodeFree` objects for the policy."""

    def __init__(self, nodes: Sequence[OpenbNode]) -> None:
        self.models = np.array([n.model for n in nodes])
        self.cpu_free: IntArray = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_free: IntArray = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.max_free: IntArray = np.array(
            [MILLI_PER_GPU if n.gpus else 0 for n in nodes], dtype=np.int64
        )
        self.full: IntArray = np.array([n.gpus for n in nodes], dtype=np.int64)
        self.version: IntArray = np.zeros(len(nodes), dtype=np.int64)
        self.state: list[NodeFree] = [node_free(n) for n in nodes]
        self._allowed: dict[tuple[str, ...], npt.NDArray[np.bool_]] = {}

    def feasible(self, d: Demand) -> IntArray:
        mask = (self.cpu_free >= d.cpu_milli) & (self.mem_free >= d.mem_mib)
        if d.gpus and d.gpu_models:
            allowed = self._allowed.get(d.gpu_models)
            if allowed is None:
                allowed = self._allowed[d.gpu_models] = np.isin(self.models, d.gpu_models)
            mask &= allowed
        if d.gpus and (d.whole or d.gpus > 1):
            mask &= self.full >= d.gpus
        elif d.gpus:
            mask &= self.max_free >= d.mib_per_card
        return np.flatnonzero(mask)

    def place(self, n: int, demand: Demand, cards: tuple[int, ...]) -> None:
        node = take(self.state[n], demand, cards)
        self.state[n] = node
        self.cpu_free[n] -= demand.cpu_milli
        self.mem_free[n] -= demand.mem_mib
        self.max_free[n] = max(node.free, default=0)
        self.full[n] = sum(1 for f, c in zip(node.free, node.capacity, strict=True) if f == c)
        self.version[n] += 1


class _Answers:
    """The policy's answers, memoised per (node state, shape) and kept per shape for every node,
    stamped with the node's version so that only changed nodes are asked again."""

    def __init__(self, policy: Policy, workload: Workload, n_nodes: int) -> None:
        self.policy = policy
        self.workload = workload
        self.n_nodes = n_nodes
        self.memo: dict[tuple[NodeFree, Demand], Choice | None] = {}
        self.score: dict[Demand, npt.NDArray[np.float64]] = {}
        self.stamp: dict[Demand, IntArray] = {}
        self.cards: dict[Demand, list[tuple[int, ...]]] = {}

    def choose(self, node: NodeFree, demand: Demand) -> Choice | None:
        key = (node, demand)
        if key in self.memo:
            return self.memo[key]
        choice = self.policy.choose(node, demand, self.workload)
        if len(self.memo) > 2_000_000:
            self.memo.clear()
        self.memo[key] = choice
        return choice

    def best(self, cluster: _Cluster, idx: IntArray, rank: IntArray, demand: Demand) -> Placement:
        if demand not in self.score:
            self.score[demand] = np.full(self.n_nodes, -math.inf)
            self.stamp[demand] = np.full(self.n_nodes, -1, dtype=np.int64)
            self.cards[demand] = [()] * self.n_nodes
        score, stamp, cards = self.score[demand], self.stamp[demand], self.cards[demand]
        stale = idx[stamp[idx] != cluster.version[idx]]
        for n in stale.tolist():
            choice = self.choose(cluster.state[n], demand)
            score[n] = -math.inf if choice is None else choice.score
            cards[n] = () if choice is None else choice.cards
            stamp[n] = cluster.version[n]
        s = score[idx]
        top = s.max()
        if top == -math.inf:
            return Placement(node=None)
        tied = idx[s == top]
        n = int(tied[np.argmin(rank[tied])])
        return Placement(node=n, cards=cards[n])


def fleet_policy(policy: Policy, nodes: Sequence[OpenbNode]) -> Policy:
    """`policy` bound to the fleet's cards per model and nodes per kind, as the engine binds it
    (`for_fleet`)."""
    cards: dict[str, int] = {}
    hosts: dict[NodeKind, int] = {}
    for n in nodes:
        cards[n.model] = cards.get(n.model, 0) + n.gpus
        kind = NodeKind.of(node_free(n))
        hosts[kind] = hosts.get(kind, 0) + 1
    return for_fleet(policy, cards, hosts)


def simulate(
    nodes: Sequence[OpenbNode],
    arrivals: Sequence[OpenbPod],
    policy: Policy,
    workload: Workload,
    rank: Sequence[int],
    on_event: Callable[[OpenbPod, Placement, NodeFree | None], None] | None = None,
) -> list[Placement]:
    """Place `arrivals` one by one onto `nodes`: the best score wins, ties go to the lowest `rank`.

    `on_event(pod, placement, node_after)` is called after every arrival.
    """
    cluster = _Cluster(nodes)
    answers = _Answers(fleet_policy(policy, nodes), workload, len(nodes))
    rank_arr = np.asarray(rank, dtype=np.int64)
    out: list[Placement] = []
    for pod in arrivals:
        demand = pod_demand(pod)
        idx = cluster.feasible(demand)
        placement = Placement(node=None)
        if idx.size == 1:
            choice = answers.choose(cluster.state[int(idx[0])], demand)
            if choice is not None:
                placement = Placement(node=int(idx[0]), cards=choice.cards)
        elif idx.size:
            placement = answers.best(cluster, idx, rank_arr, demand)
        after = None
        if placement.node is not None:
            cluster.place(placement.node, demand, placement.cards)
            after = cluster.state[placement.node]
        out.append(placement)
        if on_event is not None:
            on_event(pod, placement, after)
    return out


def replay(
    nodes: Sequence[OpenbNode],
    pods: Sequence[OpenbPod],
    policy: Policy,
    rng: Rng,
    *,
    seed: int,
    tune: float = 1.3,
    workload: WorkloadSpec = PAPER_WORKLOAD,
    order: str = "paper",
) -> RunResult:
    """Replay `pods` onto `nodes` with `policy` under the protocol; `rng` is seeded with `seed`.

    The policy sees the target workload drawn by `workload`; the fragmentation KPI always uses
    the paper's. `order`: "paper", the FGD paper's (shuffled, tuned to `tune` x capacity), or
    "trace", the pods as the trace lists them, each once (CAFGD's protocol; `tune` is unused and
    the seed only orders the nodes for ties).
    """
    started = time.perf_counter()
    capacity = gpu_capacity_milli(nodes)
    paper = target_workload(pods)
    arrivals = arrivals_for(pods, rng, capacity, tune=tune, order=order)
    sorted_nodes = sorted(nodes, key=lambda n: n.name)
    prio = node_priority(sorted_nodes, rng)
    rank = [prio[n.name] for n in sorted_nodes]

    index = index_for(paper)
    frag = [index.stranded_num(node_free(n)) for n in sorted_nodes]
    totals = {"frag": sum(frag), "idle": capacity, "arrived": 0, "used": 0}
    arrived_log: list[int] = []
    used_log: list[int] = []
    frag_log: list[float | None] = []

    def on_event(pod: OpenbPod, placement: Placement, after: NodeFree | None) -> None:
        totals["arrived"] += pod.gpu_request_milli
        if placement.node is not None and after is not None:
            totals["used"] += pod.gpu_request_milli
            totals["idle"] -= pod.gpu_request_milli
            new = index.stranded_num(after)
            totals["frag"] += new - frag[placement.node]
            frag[placement.node] = new
        arrived_log.append(totals["arrived"])
        used_log.append(totals["used"])
        idle = totals["idle"]
        frag_log.append(
            None if idle == 0 else round(100.0 * totals["frag"] / index.denominator / idle, 2)
        )

    policy_workload = paper if workload == PAPER_WORKLOAD else target_workload(pods, workload)
    placements = simulate(sorted_nodes, arrivals, policy, policy_workload, rank, on_event)
    placed = sum(1 for p in placements if p.node is not None)
    curve = allocation_curve(arrived_log, used_log, capacity)
    return RunResult(
        policy=policy.name,
        seed=seed,
        alloc_100=curve[100],
        alloc_130=curve[130],
        alloc_end=round(100.0 * (used_log[-1] if used_log else 0) / capacity, 2),
        frag_ratio_100=column_mean(arrived_log, frag_log, capacity, 100),
        seconds=time.perf_counter() - started,
        pods=len(arrivals),
        placed=placed,
        rejected=len(arrivals) - placed,
        curve=curve,
    )


ORDERS = ("paper", "trace")


def arrivals_for(
    pods: Sequence[OpenbPod], rng: Rng, capacity_milli: int, *, tune: float, order: str
) -> tuple[OpenbPod, ...]:
    """The arrival sequence of one run: the paper's (`arrival_sequence`, tuned to `tune` x
    capacity) or the trace's own order (after the same first draw, so that the node priority is
    drawn alike)."""
    if order == "trace":
        rng.discard(1)
        return tuple(pods)
    if order != "paper":
        raise ValueError(f"unknown order {order!r}; known: {', '.join(ORDERS)}")
    return arrival_sequence(pods, rng, round(tune * capacity_milli))


def _by_column(
    arrived: Sequence[int], values: Sequence[float | None], capacity: int
) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for a, v in zip(arrived, values, strict=True):
        if v is not None:
            # Python's round: ties to even, as the artifact's analysis scripts.
            out.setdefault(round(a / capacity * 100), []).append(v)
    return out


def _mean_at(cols: dict[int, list[float]], x: int) -> float | None:
    picked = cols.get(x) or [v for c in (x - 1, x, x + 1) for v in cols.get(c, ())]
    return round(sum(picked) / len(picked), 2) if picked else None


def allocation_curve(
    arrived: Sequence[int], used: Sequence[int], capacity: int, last: int = 130
) -> tuple[float | None, ...]:
    """The published KPI: per column x (arrived GPU request, % of capacity), the mean of the
    per-event allocation ratio (used GPU, % of capacity, 2 decimals) over events in the column
    (or in x-1..x+1 when the column has none)."""
    cols = _by_column(arrived, [round(100 * u / capacity, 2) for u in used], capacity)
    return tuple(_mean_at(cols, x) for x in range(last + 1))


def column_mean(
    arrived: Sequence[int], values: Sequence[float | None], capacity: int, x: int
) -> float | None:
    """Mean of `values` over the events in column `x` (or in x-1..x+1 if none), 2 decimals."""
    return _mean_at(_by_column(arrived, values, capacity), x)
