"""Store time inside one control-loop pass: a synthetic fleet of N nodes x 8 GPUs with J jobs
(most running, one card each; the rest queued), the real pass (`Reconciler.run_once`: gather,
observe, settle, checkpoints, health, migrations, place and launch, publish the snapshot) over a
scripted fleet and job runner (`gpuctl.testing.fakerunner`), with every store call timed.

    python benchmarks/store_pass.py                          # SQLite and PostgreSQL, 2,000 nodes
    python benchmarks/store_pass.py --nodes 5000 --jobs 25000
    python benchmarks/store_pass.py --backend postgresql --state-url postgresql://u@host/db

PostgreSQL is the tests' own server (`tests/pg.py`: Debian's postgresql in a temporary folder),
or `--state-url` (an empty database). The pass measured is a warm one: the loop has passed once
over the state already, as a running controller has. Goal (issue 12): at most 200 ms of store
time per pass at 2,000 nodes and 10,000 jobs on both backends; the exit status is 0 when met.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuctl.adapters.protocols import Store
from gpuctl.config.jobspec import spec_from_data
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import (
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    LaunchRequest,
)
from gpuctl.core.placement.model import Settings
from gpuctl.ops.loop import Reconciler, ReconcileSettings
from gpuctl.testing.fakerunner import FakeCluster, FakeFleet, FakeRunner, ManualClock

GOAL_MS = 200.0
GPUS = 8
SLICE_MIB = 20 * 1024
CARD_MIB = 81_920


class Timed:
    """A store whose every call is timed (seconds and calls per method)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found) or name == "loop_lock":
            return found

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return found(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
                self.calls[name] += 1

        return timed


def populate(store: Store, cluster: FakeCluster, runner: FakeRunner, jobs: int) -> int:
    """`jobs` jobs, one card of 20 GiB each: as many running as fit 2 to a card on half the
    fleet's cards, the rest queued (they stay queued: the band is full). Returns running."""
    spec = spec_from_data(
        {"name": "train", "command": ["python", "train.py"],
         "resources": {"gpus": 1, "mem_per_gpu": "20GiB"}}
    )  # fmt: skip
    now = cluster.clock.now()
    nodes = list(cluster.inventory().nodes)
    slots = [(n, card) for n in nodes for card in range(GPUS // 2) for _ in range(2)]
    running = min(len(slots), int(jobs * 0.8))
    for i in range(jobs):
        job = Job(f"train-{i:06x}", "train", spec, JobState.QUEUED, 0, "standard", now,
                  updated_at=now, owner="bench")  # fmt: skip
        store.add_job(job, Event(now, "bench", "submit", f"submitted {job.id}", job.id))
        if i >= running:
            continue
        node, card = slots[i]
        inc = Incarnation(job.id, 1, node.name, (card,), (f"GPU-{node.name}-{card}",),
                          SLICE_MIB, False, IncarnationState.LAUNCHING, now,
                          f".gpuctl/runs/{job.id}/1")  # fmt: skip
        store.begin_launch(
            inc,
            capacity_mib={(node.name, card): CARD_MIB},
            event=Event(now, "gpuctl", "launch", f"launching {job.id}", job.id, node.name),
        )
        status = runner.launch(
            node, LaunchRequest(job.id, 1, ("python",), str(card), SLICE_MIB, "/ckpt")
        )
        store.update_incarnation(
            job.id, 1, state=IncarnationState.RUNNING, pid=status.pid, run_dir=status.run_dir
        )
    return running


@contextlib.contextmanager
def opened(backend: str, url: str | None) -> Iterator[Store]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            from gpuctl.adapters.store import open_store

            store = open_store(Path(tmp), write=True)
            try:
                yield store
            finally:
                store.close()
        return
    from gpuctl.adapters.store.postgres import open_url

    if url is not None:
        with open_url(url, write=True) as store:
            yield store
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.pg import running_server

    with running_server() as server, open_url(server.url(server.fresh_database()), write=True) as s:
        yield s


def measure(backend: str, nodes: int, jobs: int, url: str | None, passes: int) -> dict[str, Any]:
    clock = ManualClock()
    cluster = FakeCluster.of(*(f"n{i:05d}" for i in range(nodes)), gpus=GPUS, clock=clock)
    runner, fleet = FakeRunner(cluster), FakeFleet(cluster)
    with opened(backend, url) as raw:
        started = time.perf_counter()
        running = populate(raw, cluster, runner, jobs)
        setup_s = time.perf_counter() - started
        store = Timed(raw)
        settings = ReconcileSettings(
            placement=Settings(policy="best-fit", band_max=0.5, headroom=0.0),
            health=AutoDrainPolicy(enabled=False),
            checkpoint_scan_s=3600.0,
        )
        loop = Reconciler(store, fleet, runner, cluster.inventory(), clock, settings)  # type: ignore[arg-type]
        clock.advance(5)
        loop.run_once()  # the first pass after a start reads everything once
        store_ms, pass_ms = [], []
        for _ in range(passes):
            clock.advance(5)
            store.reset()
            t0 = time.perf_counter()
            loop.run_once()
            pass_ms.append((time.perf_counter() - t0) * 1000)
            store_ms.append(sum(store.seconds.values()) * 1000)
        best = min(range(passes), key=lambda i: store_ms[i])
        calls = dict(sorted(store.calls.items()))
        top = sorted(store.seconds.items(), key=lambda kv: -kv[1])[:6]
    return {
        "backend": backend,
        "nodes": nodes,
        "gpus_per_node": GPUS,
        "jobs": jobs,
        "running": running,
        "setup_s": round(setup_s, 1),
        "store_ms_median": round(sorted(store_ms)[len(store_ms) // 2], 1),
        "store_ms_best": round(store_ms[best], 1),
        "pass_ms_median": round(sorted(pass_ms)[len(pass_ms) // 2], 1),
        "calls_last_pass": calls,
        "slowest_last_pass_ms": {k: round(v * 1000, 1) for k, v in top},
        "goal_ms": GOAL_MS,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--state-url", default=None, help="an empty PostgreSQL database to use")
    ap.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = ap.parse_args(argv)
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    results = [measure(b, args.nodes, args.jobs, args.state_url, args.passes) for b in backends]
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(
                f"{r['backend']:<10} {r['nodes']} nodes x {GPUS} GPUs, {r['jobs']} jobs "
                f"({r['running']} running): store {r['store_ms_median']} ms per pass (median; "
                f"best {r['store_ms_best']}), whole pass {r['pass_ms_median']} ms; "
                f"goal {GOAL_MS:g} ms"
            )
            print(f"           slowest calls: {r['slowest_last_pass_ms']}")
    return 0 if all(r["store_ms_median"] <= GOAL_MS for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
