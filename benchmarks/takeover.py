"""Controller takeover benchmark: two `gpuctl controller run` processes (two state dirs, one
PostgreSQL database) over a lab fleet running jobs; the leader is SIGKILLed, again and again; how
long until the standby leads, and until its first pass has ended.

    python benchmarks/takeover.py [--kills 20] [--lease 15] [--renew 5] [--interval 5]
                                  [--nodes 2] [--state-url postgresql://...] [--seed 12] [-o json]

Set-up: a lab of `--nodes` nodes (2 GPUs each) with one long job per node, and a PostgreSQL server
this benchmark starts itself (Debian's `postgresql`, `initdb` in a temporary folder, as the tests
do: tests/pg.py), or the database `--state-url` names (it must be empty: the benchmark submits
jobs there). Each controller is the real command, in its own process.

Each kill waits for a standby to have registered, then a seeded random fraction of a renewal
period (so the kill lands anywhere in the leader's renewal cycle), then SIGKILLs the leader (the
process that holds the store's lease) and starts a new controller as the next standby. Measured
from the kill, by reading the store every 0.05 s:

- takeover: until the lease is live again under a greater token (the standby leads);
- first pass: until the new leader has recorded the end of its first pass.

Goal (issue 12): takeover <= lease + 5 s at p95 over 20 kills, with the default lease (15 s).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests/pg.py starts the PostgreSQL server

from gpuctl.adapters.clock import SystemClock  # noqa: E402
from gpuctl.adapters.store.postgres import PostgresStore, open_url  # noqa: E402
from gpuctl.config.jobspec_files import load_specs  # noqa: E402
from gpuctl.core.lease import LEASE_S, RENEW_S, Lease  # noqa: E402
from gpuctl.ops import jobs as service  # noqa: E402
from gpuctl.testing.lab import lab_fleet  # noqa: E402

POLL_S = 0.05
CLI = "import sys; from gpuctl.cli.main import run; sys.argv[0] = 'gpuctl'; run()"


class Controller:
    def __init__(self, work: Path, n: int, url: str, inventory: Path, args: argparse.Namespace):
        self.err = work / f"ctl{n}.err"
        argv = [sys.executable, "-c", CLI, "--state-dir", str(work / f"state{n}")]
        argv += ["-i", str(inventory), "controller", "run", "--lease", str(args.lease)]
        argv += ["--renew", str(args.renew), "--interval", str(args.interval)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCTL_TEST_")}
        env["GPUCTL_STATE_URL"] = url
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env
            )

    def holds(self, holder: str) -> bool:
        return holder.split(":")[1:2] == [str(self.proc.pid)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait(probe: Callable[[], object], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise SystemExit(f"takeover.py: not within {timeout_s:g}s: {what}")
        time.sleep(POLL_S)


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from tests.pg import running_server

    with running_server() as server:
        name = server.fresh_database()
        yield server.url(name)


def submit_jobs(store: PostgresStore, work: Path, count: int) -> None:
    for i in range(count):
        spec = work / f"job{i}.yaml"
        spec.write_text(
            f"name: bench{i}\ncommand: [sleep, '100000']\n"
            "resources: {gpus: 1, mem_per_gpu: 1GiB}\n"
        )
        service.submit(store, load_specs([spec]), actor="bench", clock=SystemClock())


def run(args: argparse.Namespace) -> dict[str, list[float]]:
    rng = random.Random(args.seed)
    takeover: list[float] = []
    first_pass: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="gpuctl-takeover-") as tmp,
        lab_fleet(nodes=args.nodes, gpus=2) as lab,
        database(args.state_url) as url,
    ):
        work = Path(tmp)
        store = open_url(url, write=True)
        ctls: list[Controller] = []
        try:
            submit_jobs(store, work, args.nodes)

            def start() -> Controller:
                ctl = Controller(work, len(ctls), url, lab.lab.inventory_path, args)
                ctls.append(ctl)
                return ctl

            start()
            wait(lambda: _lease(store) is not None, "the first controller leading", 120)
            start()
            for k in range(args.kills):
                lease = _lease(store)
                assert lease is not None
                leader = next(c for c in ctls if c.proc.poll() is None and c.holds(lease.holder))
                wait(
                    lambda: any(m.role == "standby" for m in store.members()),
                    "a standby registered",
                    120,
                )
                time.sleep(rng.uniform(0.0, args.renew))  # anywhere in the renewal cycle
                killed_at = store.lease()
                assert killed_at is not None
                leader.proc.kill()
                t0 = time.monotonic()
                leader.proc.wait()
                wait(
                    functools.partial(_led_after, store, lease.token),
                    f"kill {k + 1}: a standby leading",
                    args.lease * 4 + 60,
                )
                takeover.append(time.monotonic() - t0)
                wait(
                    functools.partial(_passed_since, store, killed_at.now),
                    f"kill {k + 1}: the new leader's first pass",
                    args.lease * 4 + 60,
                )
                first_pass.append(time.monotonic() - t0)
                start()
                if not args.json:
                    sys.stderr.write(
                        f"kill {k + 1}/{args.kills}: led after {takeover[-1]:.2f}s, "
                        f"first pass after {first_pass[-1]:.2f}s\n"
                    )
        finally:
            for ctl in ctls:
                ctl.stop()
            store.close()
    return {"takeover": takeover, "first_pass": first_pass}


def report(args: argparse.Namespace, result: dict[str, list[float]]) -> dict[str, object]:
    goal = args.lease + 5.0
    takeover = _summary(result["takeover"])
    return {
        "kills": args.kills,
        "lease_s": args.lease,
        "renew_s": args.renew,
        "interval_s": args.interval,
        "nodes": args.nodes,
        "seed": args.seed,
        "takeover_s": takeover,
        "first_pass_s": _summary(result["first_pass"]),
        "goal_s": goal,
        "goal_met": takeover["p95"] <= goal,
        "samples": result,
    }


def _lease(store: PostgresStore) -> Lease | None:
    lease = store.lease()
    return lease if lease is not None and lease.live else None


def _led_after(store: PostgresStore, token: int) -> bool:
    lease = store.lease()
    return lease is not None and lease.live and lease.token > token


def _passed_since(store: PostgresStore, at: float) -> bool:
    lease = store.lease()
    return lease is not None and lease.last_pass_at is not None and lease.last_pass_at > at


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 2),
        "p95": round(_p95(values), 2),
        "max": round(max(values), 2),
        "min": round(min(values), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--lease", type=float, default=LEASE_S, help="controller run --lease")
    parser.add_argument("--renew", type=float, default=None, help="default: lease / 3")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between passes")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--state-url", default=None, help="an empty PostgreSQL database")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("-o", dest="output", choices=("table", "json"), default="table")
    args = parser.parse_args()
    if args.renew is None:
        args.renew = args.lease / 3 if args.lease != LEASE_S else RENEW_S
    args.json = args.output == "json"
    result = run(args)
    if args.json:
        print(json.dumps(report(args, result), indent=2))
        return
    t, f = _summary(result["takeover"]), _summary(result["first_pass"])
    print(
        f"{args.kills} kills, lease {args.lease:g}s, renew {args.renew:g}s, "
        f"interval {args.interval:g}s, {args.nodes} nodes"
    )
    print(f"  takeover    p50 {t['p50']:.2f}s  p95 {t['p95']:.2f}s  max {t['max']:.2f}s")
    print(f"  first pass  p50 {f['p50']:.2f}s  p95 {f['p95']:.2f}s  max {f['max']:.2f}s")
    goal = args.lease + 5.0
    met = "met" if t["p95"] <= goal else "NOT met"
    print(f"  goal: takeover p95 <= lease + 5 s = {goal:g}s: {met}")


if __name__ == "__main__":
    main()
