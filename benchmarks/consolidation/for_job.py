"""Drain-and-refill on the openb fleet (`gpuctl consolidate --for-job`): CPU per plan.

    python benchmarks/consolidation/for_job.py --nodes NODES.csv --pods PODS.csv --seed 42 \
        --failures 1,20,200 --max-moves 2

Replays the policy without consolidation (the consolidation benchmark's protocol) and, at each
of the given failed pods (1: the first), plans room for it on the fleet as it is then, with the
planner `gpuctl consolidate --for-job` uses. Prints one line per plan: the CPU it took
(time.process_time) and its answer.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpuctl.bench import consolidation as bench
from gpuctl.bench.openb import load_nodes, load_pods
from gpuctl.core.consolidation import plan_consolidation


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=Path, required=True)
    ap.add_argument("--pods", type=Path, required=True)
    ap.add_argument("--policy", default="gpuctl")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--failures", default="1,20,200", help="which failed pods, e.g. 1,20,200")
    ap.add_argument("--max-moves", type=int, default=2)
    args = ap.parse_args(argv)
    which = [int(w) for w in args.failures.split(",") if w.strip()]
    nodes, pods = load_nodes(args.nodes), load_pods(args.pods)
    states = bench.failed_pods(nodes, pods, args.policy, args.seed, which, args.tune)
    for k, pod, cluster, _, paper in states:
        state, facts = cluster.fleet_state(), bench.facts_of(cluster)
        started = time.process_time()
        plan = plan_consolidation(
            state,
            facts,
            max_moves=args.max_moves,
            workload=paper,
            settings=bench.SETTINGS,
            now=0.0,
            target=bench.pod_request(pod),
        )
        cpu = time.process_time() - started
        sys.stdout.write(
            f"arrival {k}, {pod.name}: {cpu:.2f} s CPU, {len(plan.moves)} move(s): {plan.reason}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
