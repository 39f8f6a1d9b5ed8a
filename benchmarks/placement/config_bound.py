"""The node-type LP of `--bound` against the configuration LP (whole nodes' contents, by column
generation) at the first and last events of a column, per seed.

Usage: python benchmarks/placement/config_bound.py NODES_CSV PODS_CSV [--seeds 42,44] [--x 100]

For each seed, under the FGD paper's protocol (pods shuffled, tuned to 1.3 x capacity), prints
the GPU arrived by the column's first and last events and each LP's bound there, in % of the
fleet's GPU capacity, with the CPU seconds each took. Where the two agree, the node-type LP
loses nothing by pooling a node type's CPU, memory and cards: the room it leaves above a
policy is in the online protocol (pods in order, each placed if it fits), not in the LP.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpuctl.bench import bound
from gpuctl.bench.openb import load_nodes, load_pods
from gpuctl.bench.protocol import gpu_capacity_milli
from gpuctl.bench.replay import arrivals_for
from gpuctl.bench.rng import NumpyRng
from gpuctl.errors import GpuctlError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("nodes", type=Path)
    parser.add_argument("pods", type=Path)
    parser.add_argument("--seeds", default="42", help="comma-separated (default 42)")
    parser.add_argument("--x", type=int, default=100, help="the column (default 100)")
    args = parser.parse_args(argv)
    nodes, pods = load_nodes(args.nodes), load_pods(args.pods)
    capacity = gpu_capacity_milli(nodes)
    print("seed event arrived% node-type-LP% (s) configuration-LP% (s)")
    for seed in (int(s) for s in args.seeds.split(",")):
        arrivals = arrivals_for(pods, NumpyRng(seed), capacity, tune=1.3, order="paper")
        events = bound.column_events(arrivals, capacity, args.x)
        if events is None:
            print(f"{seed} - the run never reaches column {args.x}")
            continue
        for label, last in (("first", events[0]), ("last", events[-1])):
            prefix = arrivals[: last + 1]
            cpu = time.process_time()
            pooled = bound.allocation_bound(nodes, prefix)
            mid = time.process_time()
            nodewise = bound.configuration_bound(nodes, prefix)
            end = time.process_time()
            print(
                f"{seed} {label} {100 * pooled.arrived_milli / capacity:.2f}"
                f" {100 * pooled.milli / capacity:.3f} ({mid - cpu:.1f})"
                f" {100 * nodewise.milli / capacity:.3f} ({end - mid:.1f})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except GpuctlError as exc:  # bad data paths or files: one line, exit 1
        raise SystemExit(f"{Path(__file__).name}: {exc}") from None
