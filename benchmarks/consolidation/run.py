"""The consolidation benchmark: the openb replay with and without consolidation passes, and the
greedy planner against an exact CP-SAT optimum on small fleets. Prints Markdown tables.

    python benchmarks/consolidation/run.py --nodes NODES.csv --pods PODS.csv \
        --policy fgd,gpuctl --seeds 42-44 --consolidate-every 500 --max-moves-pct 5 --jobs 2 \
        --exact-nodes 8,12,16,20 --exact-seeds 2 --exact-moves 1,2 --time-limit 120

`--room-moves 2` makes room (drain-and-refill, at most 2 moves) for each pod that finds none,
within the same cap; with `--consolidate-every 0` that alone.

The exact part needs OR-Tools (`pip install ortools`, a benchmark-only dependency); without it
the script says so and skips that part.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpuctl.bench import consolidation as bench
from gpuctl.bench import consolidation_exact as exact
from gpuctl.bench import consolidation_report as report
from gpuctl.bench.openb import load_nodes, load_pods
from gpuctl.bench.protocol import target_workload
from gpuctl.bench.runner import bench_policy, parse_policies, parse_seeds, workload_name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=Path, required=True)
    ap.add_argument("--pods", type=Path, required=True)
    ap.add_argument("--policy", default="fgd,gpuctl")
    ap.add_argument("--seeds", default="42-44")
    ap.add_argument("--tune", type=float, default=1.3)
    ap.add_argument("--consolidate-every", type=int, default=500)
    ap.add_argument("--max-moves-pct", type=float, default=5.0)
    ap.add_argument(
        "--room-moves",
        type=int,
        default=0,
        help="drain-and-refill (at most this many moves) for each pod that finds no room; "
        "with --consolidate-every 0, alone",
    )
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--exact-nodes", default="", help="fleet sizes for the exact comparison")
    ap.add_argument("--exact-seeds", type=int, default=2)
    ap.add_argument("--exact-moves", default="1,2", help="move budgets, e.g. 1,2,5")
    ap.add_argument("--exact-policy", default="fgd")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--json", type=Path, help="also write the replay document here")
    args = ap.parse_args(argv)
    nodes, pods = load_nodes(args.nodes), load_pods(args.pods)
    name = workload_name(args.pods)
    if not args.skip_replay:
        rows = report.run_matrix(
            nodes,
            pods,
            parse_policies(args.policy),
            parse_seeds(args.seeds),
            every=args.consolidate_every,
            max_moves_pct=args.max_moves_pct,
            tune=args.tune,
            jobs=args.jobs,
            progress=_progress,
            room_moves=args.room_moves,
        )
        sys.stdout.write(report.render_table(rows, name) + "\n")
        if args.json:
            doc = report.report_document(rows, name, args.tune)
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
    sizes = [int(n) for n in args.exact_nodes.split(",") if n.strip()]
    if sizes:
        if not exact.available():
            sys.stdout.write(exact.MISSING + "\n")
            return 0
        policy, spec = bench_policy(args.exact_policy)
        workload = target_workload(pods, spec)
        gaps = []
        for size in sizes:
            for seed in range(args.exact_seeds):
                inst = exact.small_fleet(nodes, pods, policy, workload, n_nodes=size, seed=seed)
                for budget in (int(m) for m in args.exact_moves.split(",")):
                    row = exact.gap(inst, budget, time_limit_s=args.time_limit)
                    sys.stderr.write(f"exact: {row.instance}, {budget} moves: {row}\n")
                    gaps.append(row)
        sys.stdout.write(exact.render_gaps(gaps))
    return 0


def _progress(run: bench.ConsolidationRun) -> None:
    how = f"every {run.every}" if run.every else "none"
    if run.room_moves:
        how += f" + room ({run.room_plans} plans, {run.planner_seconds:.0f} s)"
    sys.stderr.write(
        f"{run.policy} seed {run.seed} consolidation {how}: {run.alloc_100:.2f} @100, "
        f"{run.alloc_130:.2f} @130, {run.moves} moves ({run.seconds:.0f} s)\n"
    )


if __name__ == "__main__":
    sys.exit(main())
