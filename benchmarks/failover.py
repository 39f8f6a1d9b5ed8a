"""Failover benchmark: a lab fleet running training jobs under `gpuctl reconcile --watch`; one node
is killed; how long until gpuctl notices, how long until every job it ran runs again elsewhere,
and how much work (training steps) the jobs lost.

    python benchmarks/failover.py [--nodes 5] [--jobs 10] [--grace 10] [--interval 1]
                                  [--checkpoint-every 20] [--step-seconds 0.1] [--seed 7] [-o json]

Set-up: a lab of `--nodes` nodes with 4 GPUs each; `--jobs` copies of `examples/train.py`
submitted with `gpuctl submit` (one whole card each, checkpoints on storage every node sees,
`sync: shared`); the control loop is the real command, `gpuctl reconcile --watch --interval I
--grace G`, in its own process. Once every job runs and has a committed checkpoint, the bench
waits a seeded random fraction of a checkpoint interval (so the kill lands anywhere in the
checkpoint cycle) and kills the node that runs the most jobs (`gpuctl lab kill`: its sshd and
every process on it).

Measured (from the moment of the kill, by polling the state store every 0.1 s):

- detection: until gpuctl records the node as failing (its first failed poll), and as `down`
  (after the grace: the decision to fail over);
- running again: until each affected job's next incarnation is `running` on another node (its
  process started and seen there), p50 / p95 / max over the affected jobs;
- work lost: per affected job, the last step its dead incarnation logged minus the step its new
  incarnation resumed from (p50 / p95 / max and the total), next to the checkpoint interval.

Goal (issue 4): every affected job running again within grace + 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from gpuctl.adapters.store import open_store
from gpuctl.core.jobs.model import IncarnationState
from gpuctl.testing.lab import LabFleet, lab_fleet

REPO = Path(__file__).resolve().parents[1]
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
GPUS_PER_NODE = 4
CLI = "import sys; from gpuctl.cli.main import run; sys.argv[0] = 'gpuctl'; run()"
STEP = re.compile(rb"^step (\d+) ", re.M)


def gpuctl(lab: LabFleet, state: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-c", CLI, "--state-dir", str(state), "-i", str(lab.lab.inventory_path),
        *args,
    ]  # fmt: skip


def percentile(values: list[float], pct: float) -> float:
    """Nearest rank (as gpuctl's own numbers): p95 of 20 values is the 19th smallest."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


def shared_folder(lab: LabFleet) -> Path:
    folder = lab.dir / "checkpoints"
    folder.mkdir(mode=0o755)
    if os.geteuid() == 0:
        pw = pwd.getpwnam(lab.lab.user)
        os.chown(folder, pw.pw_uid, pw.pw_gid)
    return folder


def job_specs(count: int, folder: Path, every: int, step_s: float) -> dict[str, Any]:
    command = [
        PYTHON, "train.py", "--steps", "1000000", "--checkpoint-every", str(every),
        "--step-seconds", str(step_s),
    ]  # fmt: skip
    return {
        "jobs": [
            {
                "name": f"train-{i:02d}",
                "command": command,
                "workdir": str(REPO / "examples"),
                "resources": {"gpus": 1, "mem_per_gpu": "whole"},
                "checkpoint": {"dir": f"{folder}/{{job_id}}", "sync": "shared"},
                "env": {"PYTHONDONTWRITEBYTECODE": "1"},
            }
            for i in range(count)
        ]
    }


class Watch:
    """Polls the store (read-only) for what the benchmark times."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def snapshot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        with open_store(self.state, write=False) as store:
            jobs = {j.id: j for j in store.jobs()}
            incs = {(i.job_id, i.n): i for i in store.incarnations()}
            live = store.liveness()
            checkpoints = {j: bool(store.checkpoints(j)) for j in jobs}
        return {"jobs": jobs, "incs": incs, "checkpoints": checkpoints}, live


def wait(probe: Any, timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up: {what} (not within {timeout_s:g} s)")
        time.sleep(every_s)


def last_step(log: Path) -> int:
    try:
        found = STEP.findall(log.read_bytes())
    except OSError:
        return 0
    return int(found[-1]) if found else 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with lab_fleet(nodes=args.nodes, gpus=GPUS_PER_NODE) as lab:
        state = lab.dir / "state"
        spec = lab.dir / "jobs.yaml"
        folder = shared_folder(lab)
        spec.write_text(yaml.safe_dump(job_specs(args.jobs, folder, args.every, args.step_s)))
        subprocess.run(gpuctl(lab, state, "submit", str(spec)), check=True, capture_output=True)
        loop = subprocess.Popen(
            gpuctl(lab, state, "reconcile", "--watch", "--interval", str(args.interval),
                   "--grace", str(args.grace)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            return measure(args, rng, lab, state, loop)
        finally:
            loop.send_signal(signal.SIGINT)  # a clean stop, as Ctrl-C
            try:
                loop.wait(timeout=30)
            except subprocess.TimeoutExpired:
                loop.kill()


def measure(
    args: argparse.Namespace,
    rng: random.Random,
    lab: LabFleet,
    state: Path,
    loop: subprocess.Popen[bytes],
) -> dict[str, Any]:
    watch = Watch(state)

    def ready() -> dict[str, Any] | None:
        if not (state / "state.db").exists():
            return None
        view, _ = watch.snapshot()
        running = [j for j in view["jobs"].values() if j.state == "running"]
        ok = len(running) == args.jobs and all(view["checkpoints"][j.id] for j in running)
        return view if ok else None

    started = time.monotonic()
    view = wait(ready, 120, "every job running with a committed checkpoint")
    warm_up_s = time.monotonic() - started
    time.sleep(rng.uniform(0.0, args.every * args.step_s))  # anywhere in the checkpoint cycle
    view, _ = watch.snapshot()
    per_node: dict[str, list[str]] = {}
    for job in view["jobs"].values():
        per_node.setdefault(view["incs"][(job.id, job.incarnation)].node, []).append(job.id)
    victim = max(sorted(per_node), key=lambda n: len(per_node[n]))
    affected = sorted(per_node[victim])
    before = {j: view["jobs"][j].incarnation for j in affected}

    killed_at = time.time()
    t0 = time.monotonic()
    lab.kill(victim)
    failing_s = down_s = None
    back: dict[str, float] = {}
    deadline = t0 + args.grace + 120
    while len(back) < len(affected) and time.monotonic() < deadline:
        view, live = watch.snapshot()
        now = time.monotonic() - t0
        node = live.get(victim)
        if failing_s is None and node is not None and node.failing_since is not None:
            failing_s = max(0.0, node.failing_since - killed_at)
        if down_s is None and node is not None and node.down:
            down_s = now
        for job_id in affected:
            inc = view["incs"].get((job_id, before[job_id] + 1))
            if job_id not in back and inc is not None and inc.state is IncarnationState.RUNNING:
                back[job_id] = now
        time.sleep(0.1)
    if loop.poll() is not None:
        raise SystemExit(f"gpuctl reconcile --watch stopped (exit {loop.returncode})")
    if len(back) < len(affected):
        raise SystemExit(f"only {len(back)} of {len(affected)} jobs ran again")

    lost = []
    view, _ = watch.snapshot()
    for job_id in affected:
        old = view["incs"][(job_id, before[job_id])]
        new = view["incs"][(job_id, before[job_id] + 1)]
        log = lab.lab.node_dir(victim) / "home" / old.run_dir / "log"
        lost.append(last_step(log) - (new.resume_step or 0))
    times = list(back.values())
    return {
        "nodes": args.nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "jobs": args.jobs,
        "grace_s": args.grace,
        "interval_s": args.interval,
        "checkpoint_every_steps": args.every,
        "step_s": args.step_s,
        "seed": args.seed,
        "warm_up_s": round(warm_up_s, 2),
        "killed_node": victim,
        "affected_jobs": len(affected),
        "detection_failing_s": None if failing_s is None else round(failing_s, 2),
        "detection_down_s": None if down_s is None else round(down_s, 2),
        "running_again_p50_s": round(percentile(times, 50), 2),
        "running_again_p95_s": round(percentile(times, 95), 2),
        "running_again_max_s": round(max(times), 2),
        "work_lost_steps_p50": percentile([float(x) for x in lost], 50),
        "work_lost_steps_p95": percentile([float(x) for x in lost], 95),
        "work_lost_steps_max": max(lost),
        "work_lost_steps_total": sum(lost),
        "work_lost_steps_mean": round(statistics.mean(lost), 1),
        "goal_s": args.grace + 10,
        "goal_met": max(times) <= args.grace + 10,
    }


def report(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"failover of a {r['nodes']}-node lab ({r['gpus_per_node']} GPUs each), "
            f"{r['jobs']} training jobs; grace {r['grace_s']:g} s, loop every "
            f"{r['interval_s']:g} s, a checkpoint every {r['checkpoint_every_steps']} steps of "
            f"{r['step_s']:g} s (seed {r['seed']})",
            f"killed {r['killed_node']}: {r['affected_jobs']} job(s) on it",
            f"detection       failing after {r['detection_failing_s']} s, "
            f"down after {r['detection_down_s']} s",
            f"running again   p50 {r['running_again_p50_s']} s, p95 {r['running_again_p95_s']} s, "
            f"max {r['running_again_max_s']} s",
            f"work lost       p50 {r['work_lost_steps_p50']:g}, p95 "
            f"{r['work_lost_steps_p95']:g}, max {r['work_lost_steps_max']} steps "
            f"(total {r['work_lost_steps_total']}, mean {r['work_lost_steps_mean']})",
            f"goal: every affected job running again within grace + 10 s = {r['goal_s']:g} s: "
            + ("met" if r["goal_met"] else "NOT met"),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--grace", type=float, default=10.0, help="seconds (gpuctl: 30)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes")
    parser.add_argument("--checkpoint-every", dest="every", type=int, default=20)
    parser.add_argument("--step-seconds", dest="step_s", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    if args.jobs > args.nodes * GPUS_PER_NODE * 0.8:
        parser.error("more jobs than the fleet admits (80% of its cards)")
    result = run(args)
    print(json.dumps(result, indent=2) if args.output == "json" else report(result))
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
