"""Gather benchmark: a lab fleet of real sshd on loopback, polled by gpuctl cold and warm, side by
side in the same run with a naive loop of OpenSSH `ssh node nvidia-smi ...` calls.

    python benchmarks/gather.py --nodes 50 [--rounds 10] [--pollers N] [-o json]

Cold = a new transport (TCP connect, key exchange, auth) and one full probe per node. Warm = the
same transport polling again over its open connections. Naive = one `ssh` process per node, one
after the other, each running a single `nvidia-smi --query-gpu` (less work per node than gpuctl's
probe, which also reads health fields, processes, versions, host facts and XIDs).

Goals (issue 2): warm round <= 0.5 s and cold <= 2 s for 50 nodes; >= 5x faster than the naive loop.
Issue 12: gpuctl's own CPU per warm node poll <= 1 ms (`--nodes 200`); `idle` is what its open
connections cost it between polls, per connection and second.
Every node of the lab runs on this machine, so the nodes' own work (sshd sessions, the fake
nvidia-smi) shares its cores with gpuctl: CPU time of both sides is reported. `cpu all` is the
whole machine's (other work on it counts too); `cpu nodes` counts only the lab's processes (its
sshd processes and every session they ran), `cpu gpuctl` only gpuctl's: this process and, with
`--pollers N` (N > 1: `gpuctl.ops.gather_pool`), its poller processes too (their /proc stat
files); `cpu parent` is then this process alone: what collecting the pollers' answers
costs (the pipe, unpickling the snapshots).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpuctl.adapters.ssh import SshTransport
from gpuctl.core.model import FleetSnapshot, Reach
from gpuctl.lab import sshd
from gpuctl.lab.fleet import STATE_ENV
from gpuctl.ops.gather import Gatherer
from gpuctl.ops.gather_pool import PoolGatherer
from gpuctl.testing.lab import LabFleet, lab_fleet

T = TypeVar("T")

IDLE_S = 3.0
NAIVE_QUERY = (
    "nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,"
    "temperature.gpu --format=csv,noheader,nounits"
)


def machine_cpu_s() -> float:
    """CPU seconds used by the whole machine so far (all processes, user + system)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system = (int(x) for x in fields[:3])
    irq, softirq = int(fields[5]), int(fields[6])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def lab_processes(lab: LabFleet) -> tuple[int, ...]:
    """The nodes' sshd listeners and what runs under them now (per-connection sshd processes)."""
    table = sshd.ProcTable(STATE_ENV)
    pids: set[int] = set()
    for node in lab.lab.nodes:
        if node.pid is not None:
            pids |= {node.pid} | table.descendants(node.pid)
    return tuple(sorted(pids))


def nodes_cpu_s(pids: tuple[int, ...]) -> float:
    """CPU seconds of these processes and of their children that ended (sshd reaps every session,
    and each session's shell reaps its commands): on a warm round, all the nodes' work."""
    ticks = 0
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def timed(
    fn: Callable[[], T], nodes: tuple[int, ...] = (), children: Callable[[], float] | None = None
) -> tuple[T, dict[str, float]]:
    # gpuctl's own CPU is read next to the call: reading the nodes' /proc files is not gpuctl's
    m0, n0 = machine_cpu_s(), nodes_cpu_s(nodes)
    c0 = children() if children is not None else 0.0
    o0, w0 = own_cpu_s(), time.perf_counter()
    value = fn()
    wall, own = time.perf_counter() - w0, own_cpu_s() - o0
    pollers = (children() if children is not None else 0.0) - c0
    return value, {
        "wall_s": wall,
        "cpu_all_s": machine_cpu_s() - m0,
        "cpu_gpuctl_s": own + pollers,
        "cpu_parent_s": own,
        "cpu_nodes_s": nodes_cpu_s(nodes) - n0,
    }


def naive_loop(lab: LabFleet) -> int:
    ok = 0
    for spec in lab.specs():
        argv = [
            "ssh",
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={spec.known_hosts[0]}",
            "-i",
            str(spec.key_file),
            "-p",
            str(spec.port),
            f"{spec.user}@{spec.host}",
            NAIVE_QUERY,
        ]
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        ok += done.returncode == 0 and bool(done.stdout.strip())
    return ok


def answered(fleet: FleetSnapshot) -> int:
    return sum(1 for n in fleet.nodes if n.reach is Reach.OK and n.gpus)


def run(
    nodes: int, gpus: int, rounds: int, *, with_naive: bool = True, pollers: int = 1
) -> dict[str, Any]:
    with lab_fleet(nodes=nodes, gpus=gpus) as lab, tempfile.TemporaryDirectory() as tmp:
        specs = lab.specs()
        make = functools.partial(
            SshTransport, own_known_hosts=Path(tmp) / "known_hosts", system_known_hosts=()
        )
        transport = make()
        pool = PoolGatherer(make, pollers=pollers) if pollers > 1 else None
        children = None
        if pool is not None:  # the pollers' CPU as the kernel counts it (/proc/PID/stat)
            pollers_of = pool

            def children() -> float:
                return nodes_cpu_s(tuple(p.pid for p in pollers_of.pollers() if p.pid))

        with pool or Gatherer(transport) as gatherer:
            cold_fleet, cold = timed(lambda: gatherer.gather(specs), children=children)
            if answered(cold_fleet) != nodes:
                bad = [
                    (n.name, n.reach.value, n.error)
                    for n in cold_fleet.nodes
                    if n.reach is not Reach.OK
                ]
                raise SystemExit(
                    f"cold gather: only {answered(cold_fleet)}/{nodes} answered: {bad[:3]}"
                )
            warm = []
            pids = lab_processes(lab)  # the connections are open now: one sshd pair per node
            for _ in range(rounds):
                fleet, t = timed(lambda: gatherer.gather(specs), pids, children)
                if answered(fleet) != nodes:
                    raise SystemExit(f"warm gather: only {answered(fleet)}/{nodes} answered")
                warm.append(t)
            if pool is not None:
                connects, sessions = sum(p.connects for p in pool.pollers()), None
            else:
                connects, sessions = transport.connects, transport.sessions_started
            _, idle = timed(lambda: time.sleep(IDLE_S), children=children)
        transport.close()
        naive: dict[str, float] | None = None
        if with_naive:
            naive_ok, naive = timed(lambda: naive_loop(lab))
            if naive_ok != nodes:
                raise SystemExit(f"naive loop: only {naive_ok}/{nodes} answered")
    warm_walls = [w["wall_s"] for w in warm]
    polls = rounds * nodes
    warm_median = statistics.median(warm_walls)
    return {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "pollers": pollers,
        "rounds": rounds,
        "connections_opened": connects,
        "sessions_started": sessions,
        "idle_cpu_gpuctl_ms_per_connection_s": 1000 * idle["cpu_gpuctl_s"] / (nodes * IDLE_S),
        "cold": cold,
        "warm": {
            "median_wall_s": warm_median,
            "min_wall_s": min(warm_walls),
            "max_wall_s": max(warm_walls),
            "median_cpu_all_s": statistics.median(w["cpu_all_s"] for w in warm),
            "median_cpu_gpuctl_s": statistics.median(w["cpu_gpuctl_s"] for w in warm),
            "median_cpu_parent_s": statistics.median(w["cpu_parent_s"] for w in warm),
            "median_cpu_nodes_s": statistics.median(w["cpu_nodes_s"] for w in warm),
            "cpu_gpuctl_ms_per_poll": 1000 * sum(w["cpu_gpuctl_s"] for w in warm) / polls,
            "cpu_parent_ms_per_poll": 1000 * sum(w["cpu_parent_s"] for w in warm) / polls,
            "cpu_nodes_ms_per_poll": 1000 * sum(w["cpu_nodes_s"] for w in warm) / polls,
        },
        "naive": naive,
        "speedup_warm_vs_naive": naive["wall_s"] / warm_median if naive else None,
        "speedup_cold_vs_naive": naive["wall_s"] / cold["wall_s"] if naive else None,
        "goals": {
            "warm_le_0_5_s": warm_median <= 0.5,
            "cold_le_2_s": cold["wall_s"] <= 2.0,
            "warm_ge_5x_naive": naive["wall_s"] / warm_median >= 5.0 if naive else None,
            "gpuctl_cpu_per_warm_poll_le_1_ms": (
                1000 * sum(w["cpu_gpuctl_s"] for w in warm) / polls <= 1.0
            ),
        },
    }


def report(result: dict[str, Any], nodes: int, gpus: int, rounds: int) -> str:
    cold, warm, naive = result["cold"], result["warm"], result["naive"]
    rows = [
        ("cold (connect)", cold["wall_s"], cold["cpu_all_s"], f"{cold['cpu_gpuctl_s']:.2f}"),
        ("warm (median)", warm["median_wall_s"], warm["median_cpu_all_s"],
         f"{warm['median_cpu_gpuctl_s']:.2f}"),
    ]  # fmt: skip
    if naive is not None:
        rows.append(("naive ssh loop", naive["wall_s"], naive["cpu_all_s"], "-"))
    lines = [
        f"gather of a {nodes}-node lab ({gpus} GPUs each), {rounds} warm rounds, "
        + (f"{result['pollers']} poller processes" if result["pollers"] > 1 else "in process"),
        f"{'':18}{'wall s':>9}{'cpu all s':>11}{'cpu gpuctl s':>14}",
        *(f"{name:18}{wall:9.3f}{cpu:11.2f}{own:>14}" for name, wall, cpu, own in rows),
        f"warm min/max {warm['min_wall_s']:.3f}/{warm['max_wall_s']:.3f} s; "
        f"connections opened: {result['connections_opened']}, "
        f"answering sessions started: {result['sessions_started'] or 'in the pollers'}",
        f"warm CPU per node poll: {warm['cpu_nodes_ms_per_poll']:.1f} ms on the node (sshd, "
        f"probe, fake tools), {warm['cpu_gpuctl_ms_per_poll']:.2f} ms in gpuctl",
        *(
            [
                f"of which {warm['cpu_parent_ms_per_poll']:.2f} ms in the parent (collecting the "
                "pollers' answers: the pipe and unpickling)"
            ]
            if result["pollers"] > 1
            else []
        ),
        f"idle: {result['idle_cpu_gpuctl_ms_per_connection_s']:.3f} ms of gpuctl's CPU per open "
        "connection per second",
        f"speed-up vs naive: warm {result['speedup_warm_vs_naive']:.1f}x, "
        f"cold {result['speedup_cold_vs_naive']:.1f}x"
        if naive is not None
        else "naive ssh loop: skipped (--no-naive)",
        "goals: "
        + ", ".join(
            f"{k}={'yes' if v else 'NO'}" for k, v in result["goals"].items() if v is not None
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node")
    parser.add_argument("--rounds", type=int, default=10, help="warm rounds")
    parser.add_argument(
        "--no-naive", action="store_true", help="skip the naive ssh loop (minutes at 200 nodes)"
    )
    parser.add_argument(
        "--pollers",
        type=int,
        default=1,
        help="poller processes (1: in process; N > 1: gpuctl.ops.gather_pool)",
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    if args.pollers < 1:
        parser.error("--pollers must be at least 1")
    result = run(
        args.nodes, args.gpus, args.rounds, with_naive=not args.no_naive, pollers=args.pollers
    )
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(report(result, args.nodes, args.gpus, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
