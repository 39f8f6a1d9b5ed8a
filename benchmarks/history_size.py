"""How big a month of the fleet's history is: synthetic samples for a fleet of N nodes, at the
default resolution, with the default downsampling applied, written into a fresh SQLite store.

    python benchmarks/history_size.py               # 1,000 nodes, 30 days
    python benchmarks/history_size.py --nodes 100 -o json

What is written is what the store holds after a month of recording and pruning with the default
`core.history.Retention`: a sample a minute for the last 24 h, 5-minute averages for the 6 days
before, hourly averages for the 23 days before those. Goal (issue 16): at most 200 MB for 1,000
nodes. The exit status is 0 when the file is within it, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from gpuctl.adapters.store import open_store
from gpuctl.core.history import (
    FIVE_MIN_S,
    FLEET_SERIES,
    HOUR_S,
    FleetSample,
    NodeSample,
    Retention,
    bucket,
)

GOAL_MB = 200.0
NOW = 1_800_000_000


def timestamps(retention: Retention, now: int) -> list[tuple[int, int]]:
    """(at, step) of every sample a month of recording leaves in the store."""
    out: list[tuple[int, int]] = []
    raw_from = bucket(now - retention.raw_s, FIVE_MIN_S)
    five_from = bucket(now - retention.five_min_s, HOUR_S)
    out += [(t, HOUR_S) for t in range(now - retention.keep_s, five_from, HOUR_S)]
    out += [(t, FIVE_MIN_S) for t in range(five_from, raw_from, FIVE_MIN_S)]
    res = retention.resolution_s
    out += [(t, res) for t in range(raw_from, now, res)]
    return out


def write(path: Path, nodes: int, retention: Retention, seed: int) -> int:
    rng = random.Random(seed)
    names = [f"gpu-node-{i:04d}" for i in range(nodes)]
    plan = timestamps(retention, NOW)
    with open_store(path, write=True) as store:
        for at, step in plan:
            fleet = FleetSample(at, step, {k: round(rng.uniform(0, 100), 2) for k in FLEET_SERIES})
            samples = [
                NodeSample(
                    at,
                    step,
                    name,
                    float(rng.randint(0, 100)),
                    rng.randint(0, 640_000),
                    rng.randint(0, 640_000),
                    rng.choice((0, 0, 0, 512)),
                    8 * 81_559,
                )
                for name in names
            ]
            store.record_samples(fleet, samples)
    return len(plan)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-o", dest="output", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    retention = Retention()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        started = time.perf_counter()
        stamps = write(state, args.nodes, retention, args.seed)
        took = time.perf_counter() - started
        size = sum(p.stat().st_size for p in state.glob("state.db*"))
    mb = size / 1e6
    figures = {
        "nodes": args.nodes,
        "days": retention.keep_s / 86400,
        "timestamps": stamps,
        "node_rows": stamps * args.nodes,
        "size_mb": round(mb, 1),
        "bytes_per_node_row": round(size / max(1, stamps * args.nodes), 1),
        "goal_mb": GOAL_MB,
        "write_s": round(took, 1),
    }
    if args.output == "json":
        print(json.dumps(figures))
    else:
        for k, v in figures.items():
            print(f"{k:<20} {v}")
    return 0 if mb <= GOAL_MB else 1


if __name__ == "__main__":
    sys.exit(main())
