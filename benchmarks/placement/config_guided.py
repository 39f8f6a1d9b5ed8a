"""An experiment, not a policy of gpuctl's: the default policy guided by a plan of whole nodes.

Usage: python benchmarks/placement/config_guided.py NODES_CSV PODS_CSV [--seeds 42,43]
       [--bonus 0,10] [--scale 1.01]

The plan: the configuration LP (`gpuctl.bench.bound.configuration_plan`) of the workload's own
mix, each observed pod class at its share of the trace, as many pods as ask `--scale` times the
fleet's GPU. Its configurations, rounded to whole nodes per node type, are handed out to the
nodes of each type in the run's node order, once. Then the FGD paper's protocol replays the
trace with the default policy, and a node whose configuration still has room for the arriving
pod's class scores `--bonus` points more, a tenth more again if it already runs a pod (0: the
default itself; the replay's memo of the policy's answers is per node state, so the loop here
adds the bonus per node). Prints the KPI at x=100 and x=130 per seed and bonus, and their
means. The plan does not look at the arrivals to come.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections import Counter
from pathlib import Path

from gpuctl.bench import bound
from gpuctl.bench.openb import OpenbNode, OpenbPod, load_nodes, load_pods
from gpuctl.bench.protocol import (
    FULL_WORKLOAD,
    gpu_capacity_milli,
    node_priority,
    pod_demand,
    target_workload,
)
from gpuctl.bench.replay import _Cluster, allocation_curve, arrivals_for, fleet_policy
from gpuctl.bench.rng import NumpyRng
from gpuctl.core.placement.fit import Choice, Demand, NodeFree
from gpuctl.core.placement.policies import get_policy
from gpuctl.errors import GpuctlError


def forecast(pods: list[OpenbPod], capacity: int, scale: float) -> list[OpenbPod]:
    """Each pod class at its share of the trace, as many pods as ask `scale` x `capacity`."""
    by_class: dict[bound.PodClass, list[OpenbPod]] = {}
    for p in pods:
        by_class.setdefault(bound.pod_class(p), []).append(p)
    factor = scale * capacity / sum(p.gpu_request_milli for p in pods)
    return [same[0] for same in by_class.values() for _ in range(round(len(same) * factor))]


def targets_for(
    nodes: list[OpenbNode], rank: list[int], plan: list[bound.NodeConfiguration]
) -> dict[str, Counter[Demand]]:
    """The plan rounded to whole nodes per type (largest remainders), handed out in node order."""
    examples: dict[bound.PodClass, Demand] = {}
    out: dict[str, Counter[Demand]] = {}
    for node_type in {c.node for c in plan}:
        mine = sorted((c for c in plan if c.node == node_type), key=lambda c: -c.nodes)
        order = sorted(
            (i for i, n in enumerate(nodes) if bound.node_class(n) == node_type),
            key=lambda i: rank[i],
        )
        counts = [math.floor(c.nodes + 1e-9) for c in mine]
        left = len(order) - sum(counts)
        for j in sorted(range(len(mine)), key=lambda j: counts[j] - mine[j].nodes):
            if left <= 0 or mine[j].nodes - counts[j] <= 1e-9:
                break
            counts[j] += 1
            left -= 1
        slots = iter(order)
        for c, count in zip(mine, counts, strict=True):
            for _ in range(count):
                i = next(slots, None)
                if i is None:
                    break
                out[nodes[i].name] = Counter(
                    {examples.setdefault(k, _demand(k)): n for k, n in c.pods.items()}
                )
    return out


def _demand(k: bound.PodClass) -> Demand:
    cpu, mem, gpus, milli, spec = k
    return pod_demand(OpenbPod("plan", cpu, mem, gpus, milli, spec))


def run(
    nodes: list[OpenbNode],
    pods: list[OpenbPod],
    plan: list[bound.NodeConfiguration],
    seed: int,
    bonus: float,
) -> tuple[float | None, float | None]:
    """One replay under the paper's protocol. The replay's own loop (`replay.simulate`) shares
    a policy's answers between nodes in the same state, which a per-node target cannot, so
    this loop asks the default per node state and adds the bonus per node."""
    capacity = gpu_capacity_milli(nodes)
    rng = NumpyRng(seed)
    arrivals = arrivals_for(pods, rng, capacity, tune=1.3, order="paper")
    prio = node_priority(nodes, rng)
    rank = [prio[n.name] for n in nodes]
    by_name = targets_for(nodes, rank, plan)
    targets = [by_name.get(n.name, Counter()) for n in nodes]
    policy = fleet_policy(get_policy("gpuctl"), nodes)
    workload = target_workload(pods, FULL_WORKLOAD)
    cluster = _Cluster(nodes)
    started = [False] * len(nodes)
    answers: dict[tuple[NodeFree, Demand], Choice | None] = {}
    arrived: list[int] = []
    used: list[int] = []
    totals = [0, 0]
    for pod in arrivals:
        demand = pod_demand(pod)
        best: tuple[float, int, int, tuple[int, ...]] | None = None
        for n in cluster.feasible(demand).tolist():
            key = (cluster.state[n], demand)
            if key not in answers:
                answers[key] = policy.choose(cluster.state[n], demand, workload)
            choice = answers[key]
            if choice is None:
                continue
            score = choice.score
            if pod.num_gpu and targets[n][demand] > 0:
                score += bonus * (1.1 if started[n] else 1.0)
            if best is None or (score, -rank[n]) > (best[0], -best[1]):
                best = (score, rank[n], n, choice.cards)
        totals[0] += pod.gpu_request_milli
        if best is not None:
            n = best[2]
            cluster.place(n, demand, best[3])
            totals[1] += pod.gpu_request_milli
            started[n] = True
            if targets[n][demand] > 0:
                targets[n][demand] -= 1
        arrived.append(totals[0])
        used.append(totals[1])
    curve = allocation_curve(arrived, used, capacity, 130)
    return curve[100], curve[130]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("nodes", type=Path)
    parser.add_argument("pods", type=Path)
    parser.add_argument("--seeds", default="42", help="comma-separated (default 42)")
    parser.add_argument("--bonus", default="0,10", help="comma-separated points (default 0,10)")
    parser.add_argument("--scale", type=float, default=1.01, help="the plan's GPU over capacity")
    args = parser.parse_args(argv)
    nodes = sorted(load_nodes(args.nodes), key=lambda n: n.name)
    pods = list(load_pods(args.pods))
    started = time.process_time()
    plan = bound.configuration_plan(nodes, forecast(pods, gpu_capacity_milli(nodes), args.scale))
    print(f"plan: {len(plan)} configurations, {time.process_time() - started:.0f} s of CPU")
    results: dict[float, list[tuple[float | None, float | None]]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        for bonus in (float(b) for b in args.bonus.split(",")):
            at100, at130 = run(nodes, pods, plan, seed, bonus)
            results.setdefault(bonus, []).append((at100, at130))
            print(f"seed {seed} bonus {bonus:g}: x=100 {at100} x=130 {at130}", flush=True)
    for bonus, rows in results.items():
        a = [r[0] for r in rows if r[0] is not None]
        b = [r[1] for r in rows if r[1] is not None]
        print(
            f"bonus {bonus:g}: mean x=100 {statistics.fmean(a):.3f} x=130 {statistics.fmean(b):.3f}"
        )
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except GpuctlError as exc:  # bad data paths or files: one line, exit 1
        raise SystemExit(f"{Path(__file__).name}: {exc}") from None
