"""Metrics scrape benchmark: how long `gpuctl metrics serve` takes to build one exposition of a
large fleet, server-side, and how big it is.

    python benchmarks/metrics_scrape.py [--nodes 1000] [--gpus 8] [--jobs-per-node 4]
                                        [--rounds 15] [--seed 7] [-o json]

A synthetic fleet view (every GPU with what the probe reads: memory, utilization, temperature,
power, ECC, remapped rows, thermal flags; an XID on a few) and an in-memory store with jobs: one
running job per two cards on average, a queue of one job per node and a few held. The reading is
made once (`read_fleet`, as a refresh makes it; its time is reported too), then the exposition of
that reading is built `--rounds` times, as a scrape after a refresh does: the median CPU time,
and the size in bytes (plain and gzipped, as Prometheus asks for it).

Goal (issue 16): ≤ 100 ms for 1,000 nodes × 8 GPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import random
import statistics
import sys
import time

from gpuctl.config.jobspec import spec_from_data
from gpuctl.core.jobs.model import Checkpoint, Event, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.model import (
    FleetSnapshot,
    GpuProcess,
    GpuSnapshot,
    NodeFacts,
    NodeSnapshot,
    NodeState,
    Observation,
    Reach,
    XidEvent,
)
from gpuctl.ops.metrics import Reading, exposition_parts, read_fleet
from gpuctl.ops.metrics._serve import gzip_parts
from gpuctl.testing.memstore import MemoryStore

NOW = 2_000_000_000.0
CAP = 81559
GOAL_S = 0.100


def fleet(nodes: int, gpus: int, rng: random.Random) -> FleetSnapshot:
    out = []
    for n in range(nodes):
        name = f"gpu{n:04d}"
        cards = tuple(
            GpuSnapshot(
                index=i,
                uuid=f"GPU-{n:08x}-{i:04x}-4000-8000-{rng.getrandbits(48):012x}",
                model="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                mem_total_mib=CAP,
                mem_used_mib=rng.randrange(0, CAP),
                util_pct=rng.randrange(0, 101),
                temp_c=rng.randrange(30, 85),
                power_w=round(rng.uniform(60, 700), 2),
                power_limit_w=700.0,
                ecc_mode=True,
                ecc_volatile_corrected=rng.choice((0, 0, 0, 3)),
                ecc_volatile_uncorrected=0,
                ecc_aggregate_corrected=rng.choice((0, 0, 12, 117)),
                ecc_aggregate_uncorrected=0,
                remapped_rows_correctable=rng.choice((0, 0, 0, 1)),
                remapped_rows_uncorrectable=0,
                remapped_rows_pending=False,
                remapped_rows_failure=False,
                mig_mode=False,
                thermal_slowdown_hw=False,
                thermal_slowdown_sw=rng.random() < 0.01,
            )
            for i in range(gpus)
        )
        xids = (XidEvent(13, "0000:18:00", "Graphics Exception", "812.5"),) if n % 50 == 0 else ()
        procs = tuple(GpuProcess(100_000 + n * 10 + i, c.uuid, 4096) for i, c in enumerate(cards))
        obs = Observation(gpus=cards, processes=procs, xids=xids, facts=NodeFacts(hostname=name))
        out.append(NodeSnapshot(name, Reach.OK, NodeState.READY, observation=obs, taken_at=NOW))
    return FleetSnapshot(taken_at=NOW, nodes=tuple(out))


def store_for(snap: FleetSnapshot, jobs_per_node: int, rng: random.Random) -> MemoryStore:
    store = MemoryStore()
    spec = spec_from_data(
        {"name": "bench", "command": ["train"], "resources": {"mem_per_gpu": "16GiB"}}
    )
    for node in snap.nodes:
        cards = list(node.gpus)
        for k in range(jobs_per_node):
            jid = f"{node.name}-j{k}"
            submitted = NOW - rng.uniform(600, 86400)
            store.add_job(
                Job(jid, jid, spec, JobState.QUEUED, 0, "standard", submitted),
                Event(submitted, "bench", "submit", "s", jid),
            )
            card = cards[k % len(cards)] if cards else None
            if k == jobs_per_node - 1 or card is None:
                if k % 97 == 0:
                    store.update_job(jid, state=JobState.HELD, reason="crash loop")
                continue  # queued (or held)
            uuids = (card.uuid or "",)
            inc = Incarnation(jid, 1, node.name, (card.index,), uuids, 16384, False,
                              IncarnationState.LAUNCHING, submitted + 60, jid)  # fmt: skip
            store.begin_launch(
                inc,
                capacity_mib={(node.name, card.index): CAP},
                event=Event(submitted + 60, "gpuctl", "launch", "l", jid),
            )
            store.update_incarnation(
                jid, 1, state=IncarnationState.RUNNING, pid=100_000 + int(node.name[3:]) * 10 + k
            )
            store.add_checkpoint(Checkpoint(jid, 1, 10, f"/ckpt/{jid}", NOW - rng.uniform(0, 3600),
                                            "shared"))  # fmt: skip
    return store


def variant(snap: FleetSnapshot, rng: random.Random) -> FleetSnapshot:
    """The same fleet a refresh later: the same nodes and cards, new measurements."""
    nodes = []
    for node in snap.nodes:
        obs = node.observation
        assert obs is not None
        cards = tuple(
            dataclasses.replace(
                c,
                mem_used_mib=rng.randrange(0, CAP),
                util_pct=rng.randrange(0, 101),
                temp_c=rng.randrange(30, 85),
                power_w=round(rng.uniform(60, 700), 2),
            )
            for c in obs.gpus
        )
        nodes.append(dataclasses.replace(node, observation=dataclasses.replace(obs, gpus=cards)))
    return dataclasses.replace(snap, nodes=tuple(nodes))


def churn(reading: Reading, share: float, tag: int, rng: random.Random) -> Reading:
    """`share` of the live jobs replaced by new ones (new ids): what a refresh later sees on a
    busy fleet, so the per-job series' labels change between expositions."""
    jobs = list(reading.jobs or ())
    for k in rng.sample(range(len(jobs)), int(len(jobs) * share)):
        jobs[k] = dataclasses.replace(jobs[k], id=f"{jobs[k].id}-r{tag}")
    return dataclasses.replace(reading, jobs=tuple(jobs))


def percentile(values: list[float], p: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--jobs-per-node", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--readings", type=int, default=3, help="distinct readings built in turn")
    ap.add_argument("--churn", type=float, default=0.01, help="share of jobs new per reading")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-o", dest="output", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    snap = fleet(args.nodes, args.gpus, rng)
    store = store_for(snap, args.jobs_per_node, rng)
    started = time.process_time()
    first = read_fleet(snap, store, NOW, ())
    refresh_s = time.process_time() - started
    readings = [first] + [
        churn(read_fleet(variant(snap, rng), store, NOW, ()), args.churn, k, rng)
        for k in range(1, args.readings)
    ]
    started = time.process_time()
    parts = exposition_parts(first)  # cold: every label text and template made
    cold_s = time.process_time() - started
    builds, scrapes = [], []
    for r in range(args.rounds):  # what the first scrape after each refresh costs the server
        reading = readings[(r + 1) % len(readings)]
        started = time.process_time()
        parts = exposition_parts(reading)
        built = time.process_time()
        gzip_parts(parts)
        builds.append(built - started)
        scrapes.append(time.process_time() - started)
    page = b"".join(parts)
    zipped = {
        "isal 1 (served)": (
            len(gzip_parts(parts)),
            statistics.median(scrapes) - statistics.median(builds),
        )
    }
    for level in (1, 3, 6):
        started = time.process_time()
        size = len(gzip.compress(page, compresslevel=level))
        zipped[f"zlib {level}"] = (size, time.process_time() - started)
    median = statistics.median(scrapes)
    figures = {
        "nodes": args.nodes,
        "gpus": len(readings[0].gpus),
        "live_jobs": len(readings[0].jobs or ()),
        "samples": sum(1 for line in page.splitlines() if line and not line.startswith(b"#")),
        "build_median_s": statistics.median(builds),
        "build_p95_s": percentile(builds, 95),
        "build_min_s": min(builds),
        "build_max_s": max(builds),
        "build_cold_s": cold_s,
        "scrape_median_s": median,
        "scrape_p95_s": percentile(scrapes, 95),
        "bytes": len(page),
        "gzip_bytes": zipped["isal 1 (served)"][0],
        "gzip": {k: {"bytes": b, "s": t} for k, (b, t) in zipped.items()},
        "reading_s": refresh_s,
        "goal_s": GOAL_S,
        "met": median <= GOAL_S,
    }
    if args.output == "json":
        print(json.dumps(figures, indent=2))
    else:
        levels = "\n".join(
            f"  {k:16s} {b / 1e6:.2f} MB in {t * 1000:.0f} ms" for k, (b, t) in zipped.items()
        )
        ms = {k: v * 1000 for k, v in figures.items() if k.endswith("_s") and isinstance(v, float)}
        print(
            f"metrics exposition of {args.nodes} nodes × {args.gpus} GPUs "
            f"({figures['gpus']} GPUs, {figures['live_jobs']} live jobs, "
            f"{figures['samples']} samples), CPU over {args.rounds} rounds of "
            f"{len(readings)} readings in turn ({args.churn:.0%} of jobs new in each)\n"
            f"build      median {ms['build_median_s']:.1f} ms, p95 {ms['build_p95_s']:.1f} ms "
            f"(min {ms['build_min_s']:.1f}, max {ms['build_max_s']:.1f}; "
            f"cold, the first, {ms['build_cold_s']:.1f})\n"
            f"build+gzip median {ms['scrape_median_s']:.1f} ms, p95 {ms['scrape_p95_s']:.1f} ms "
            f"(the first scrape after a refresh; the next ones send the same bytes)\n"
            f"size       {len(page) / 1e6:.2f} MB plain; gzip:\n{levels}\n"
            f"the reading (refresh, CPU)    {refresh_s:.2f} s\n"
            f"goal ≤ {GOAL_S * 1000:.0f} ms: {'met' if figures['met'] else 'NOT met'}"
        )
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
