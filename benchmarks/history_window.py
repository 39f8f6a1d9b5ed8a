"""How long the dashboard takes to load its history when it starts: the last 6 h of a fleet of N
nodes recorded once a minute, read as the dashboard read it before (every raw node sample, then
averaged into 5-minute points in Python) and as it reads it now (`ops.history.window` with
`step_s`: the store averages each node's samples per point, GROUP BY node and at / step), on
SQLite and PostgreSQL.

    python benchmarks/history_window.py                        # 1,000 nodes, 6 h, both stores
    python benchmarks/history_window.py --nodes 200 --backend sqlite -o json
    python benchmarks/history_window.py --state-url postgresql://u@host/db

PostgreSQL is the tests' own server (`tests/pg.py`: Debian's postgresql in a temporary folder),
or `--state-url` (an empty database). Each read is timed `--repeat` times (the best is reported,
and the median); both reads must give the same points, which the script checks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.core.history import FLEET_SERIES, FleetSample, NodeSample, average_fleet, average_nodes
from gpuctl.ops.history import window

NOW = 1_800_000_000 + 123
WINDOW_S = 6 * 3600
STEP_S = 300  # the 6h window's points


def fill(store: Store, nodes: int, seed: int) -> int:
    """A sample a minute for the window and half an hour before it; rows written."""
    rng = random.Random(seed)
    names = [f"gpu-node-{i:04d}" for i in range(nodes)]
    start = NOW - WINDOW_S - 1800
    rows = 0
    for at in range(start - start % 60, NOW, 60):
        fleet = FleetSample(at, 60, {k: round(rng.uniform(0, 100), 2) for k in FLEET_SERIES})
        samples = [
            NodeSample(
                at,
                60,
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
        rows += len(samples)
    return rows


def before(store: Store) -> tuple[list[FleetSample], list[NodeSample], int]:
    """What the dashboard did: every raw sample of the window, averaged here."""
    fleet, nodes = window(store, NOW, WINDOW_S)
    return average_fleet(fleet, STEP_S), average_nodes(nodes, STEP_S), len(nodes)


def after(store: Store) -> tuple[list[FleetSample], list[NodeSample], int]:
    """What it does now: the nodes' points averaged by the store."""
    fleet, nodes = window(store, NOW, WINDOW_S, step_s=STEP_S)
    return fleet, nodes, len(nodes)


def timed(
    read: Callable[[Store], tuple[list[FleetSample], list[NodeSample], int]],
    store: Store,
    repeat: int,
) -> tuple[dict[str, Any], tuple[list[FleetSample], list[NodeSample]]]:
    took = []
    got: tuple[list[FleetSample], list[NodeSample], int] | None = None
    for _ in range(repeat):
        started = time.perf_counter()
        got = read(store)
        took.append(time.perf_counter() - started)
    assert got is not None
    figures = {
        "node_rows_read": got[2],
        "best_ms": round(min(took) * 1000, 1),
        "median_ms": round(statistics.median(took) * 1000, 1),
    }
    return figures, (got[0], got[1])


@contextlib.contextmanager
def opened(backend: str, url: str | None) -> Iterator[Store]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp, open_store(Path(tmp) / "s", write=True) as s:
            yield s
        return
    from gpuctl.adapters.store.postgres import open_url

    if url is not None:
        with open_url(url, write=True) as s:
            yield s
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.pg import running_server

    with running_server() as server, open_url(server.url(server.fresh_database()), write=True) as s:
        yield s


def run(backend: str, nodes: int, repeat: int, seed: int, url: str | None) -> dict[str, Any]:
    with opened(backend, url) as store:
        started = time.perf_counter()
        rows = fill(store, nodes, seed)
        fill_s = time.perf_counter() - started
        old, old_points = timed(before, store, repeat)
        new, new_points = timed(after, store, repeat)
    if old_points != new_points:
        raise SystemExit(f"{backend}: the store's buckets differ from averaging every sample")
    return {
        "backend": backend,
        "nodes": nodes,
        "rows_stored": rows,
        "fill_s": round(fill_s, 1),
        "before": old,
        "after": new,
        "points": len(new_points[1]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--state-url", default=None, help="an empty PostgreSQL database")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-o", dest="output", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    results = [run(b, args.nodes, args.repeat, args.seed, args.state_url) for b in backends]
    if args.output == "json":
        print(json.dumps(results))
        return 0
    for r in results:
        b, a = r["before"], r["after"]
        print(
            f"{r['backend']:<10} {r['nodes']} nodes, 6 h: every sample {b['node_rows_read']} rows "
            f"{b['best_ms']} ms (median {b['median_ms']}) -> buckets {a['node_rows_read']} rows "
            f"{a['best_ms']} ms (median {a['median_ms']}); filled in {r['fill_s']} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
