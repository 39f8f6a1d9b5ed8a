"""A fault campaign against one running job: short outages of its node's sshd, a frozen sshd and
a network partition, each well inside the grace, while the control loop runs pass after pass at
0.3 s. None of them is a node failure, so after every round the job must still run as its first
incarnation, in exactly one live copy, with the store's invariants and the fleet check clean.

This is how issue 17's double run was found: a pass that observed the node while its sshd was
being killed read an empty run list and took it for "the run is gone", so the job was restarted
elsewhere while its first copy ran on.

The rounds are drawn from a seeded generator: `GPUCTL_CAMPAIGN_SEED` and `GPUCTL_CAMPAIGN_ROUNDS`
change them (default 40 rounds: 30 sshd outages, 12 of them timed to land while the loop observes
the node, 6 frozen sshd, 4 partitions where network namespaces work); `GPUCTL_CAMPAIGN_REPORT=FILE`
writes the round counts and how many readings were cut short, for a long run's record.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuctl.adapters.protocols import JobRunner
from gpuctl.core.jobs.model import JobState, LaunchRequest, RunStatus
from gpuctl.core.model import NodeSpec
from gpuctl.lab import netns
from gpuctl.ops.fleetcheck import check_fleet
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import Rig, gpuctl, rig

pytestmark = pytest.mark.e2e

GRACE_S = 60.0
INTERVAL_S = 0.3


def _partitions_work() -> bool:
    try:
        netns.check_available()
    except Exception:
        return False
    return True


KINDS = ("sshd", "sshd-mid-observe", "freeze", "partition")


def plan_rounds(seed: int, rounds: int, *, partitions: bool) -> list[tuple[str, float, float]]:
    """(fault, how long it lasts, pause after) per round, in a seeded order. Of every 40: 18 sshd
    outages at a random moment, 12 that start while the loop's observe is on its way to the node
    (the race that ran a job twice: at a random moment it takes a few dozen rounds to hit), 6
    frozen sshd and 4 partitions (more sshd outages where network namespaces are missing)."""
    rng = random.Random(seed)
    kinds = ["sshd"] * 18 + ["sshd-mid-observe"] * 12 + ["freeze"] * 6
    kinds += ["partition"] * 4 if partitions else ["sshd"] * 4
    plan = []
    for i in range(rounds):
        kind = kinds[i % len(kinds)]
        plan.append((kind, rng.uniform(0.1, 1.2), rng.uniform(0.1, 0.9)))
    rng.shuffle(plan)
    return plan


class Watched:
    """The loop's job runner, with an event set each time an observe leaves for a node."""

    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner
        self.observing = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    def observe(self, node: NodeSpec) -> list[RunStatus]:
        self.observing.set()
        return self.runner.observe(node)


def inflict(lab: LabFleet, node: str, kind: str, lasts_s: float, watched: Watched) -> None:
    """One fault on `node`, lasting about `lasts_s`, then undone."""
    if kind == "sshd-mid-observe":
        watched.observing.clear()
        watched.observing.wait(10.0)
        kind = "sshd"
    if kind == "sshd":
        lab.kill_sshd(node)
        time.sleep(lasts_s)
        lab.revive(node)
    elif kind == "freeze":
        lab.freeze(node)
        time.sleep(lasts_s)
        lab.thaw(node)
    else:
        lab.partition(node)
        time.sleep(lasts_s)
        lab.heal(node)


def passes_while(r: Rig, busy: Callable[[], bool]) -> None:
    """Passes at the loop's interval for as long as `busy()` holds, and at least one."""
    while True:
        started = time.monotonic()
        r.run_pass()
        if not busy():
            return
        time.sleep(max(0.0, INTERVAL_S - (time.monotonic() - started)))


def test_outages_inside_the_grace_never_run_a_job_twice_nor_restart_it(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    seed = int(os.environ.get("GPUCTL_CAMPAIGN_SEED", "17"))
    rounds = int(os.environ.get("GPUCTL_CAMPAIGN_ROUNDS", "40"))
    plan = plan_rounds(seed, rounds, partitions=_partitions_work())
    with rig(own_lab, tmp_path, grace_s=GRACE_S) as r:
        watched = Watched(r.loop.runner)
        r.loop.runner = watched
        job = r.train("campaign")
        r.until(lambda: r.running(job.id, 1), "the job running")
        node = r.inc(job.id, 1).node
        if any(kind == "partition" for kind, _, _ in plan):
            own_lab.enclose(node)  # its sshd moves into a namespace; the job stays where it is
        done: dict[str, int] = {}
        for i, (kind, lasts_s, pause_s) in enumerate(plan):
            where = f"round {i + 1} of {len(plan)} ({kind} {lasts_s:.2f}s, seed {seed})"
            fault = threading.Thread(target=inflict, args=(own_lab, node, kind, lasts_s, watched))
            fault.start()
            passes_while(r, fault.is_alive)
            fault.join()
            until = time.monotonic() + pause_s
            passes_while(r, lambda until=until: time.monotonic() < until)
            done[kind] = done.get(kind, 0) + 1

            # what really runs: one copy, the first incarnation, and the store agrees
            assert r.copies(job.id) == [1], f"{where}: live copies {r.copies(job.id)}\n" + (
                r.history(job.id)
            )
            current = r.job(job.id)
            assert current.incarnation == 1, f"{where}: restarted\n{r.history(job.id)}"
            assert current.state is JobState.RUNNING, f"{where}: {current.state}"
            r.check()
            r.until(
                lambda: (
                    not r.reports[-1].nodes or all(n.reach == "ok" for n in r.reports[-1].nodes)
                ),
                f"{where}: the node answering again",
            )
            found = check_fleet(r.store, r.inventory, r.runner)
            assert found.clean, f"{where}: {found.problems}"
        assert sum(done.values()) == len(plan)
        if "GPUCTL_CAMPAIGN_REPORT" in os.environ:  # the figures for a long run's record
            cut = [
                a for rep in r.reports for a in rep.actions if "nothing is concluded" in a.message
            ]
            summary = {
                "seed": seed,
                "rounds": done,
                "passes": len(r.reports),
                "cut_short": len(cut),
            }
            Path(os.environ["GPUCTL_CAMPAIGN_REPORT"]).write_text(json.dumps(summary) + "\n")


def test_the_fleet_check_reports_a_copy_planted_by_hand_and_is_clean_once_it_is_fenced(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    with rig(own_lab, tmp_path) as r:
        job = r.train("planted")
        r.until(lambda: r.running(job.id, 1), "the job running")
        home = r.inc(job.id, 1).node
        other = next(n for n in own_lab.names if n != home)
        inventory = own_lab.lab.inventory_path
        assert gpuctl(r.state_dir, inventory, "db", "check", "--fleet").returncode == 0
        planted = LaunchRequest(
            job_id=job.id,
            incarnation=1,
            argv=("sleep", "120"),
            cuda_visible_devices="1",
            mib_per_card=1024,
            checkpoint_dir=str(tmp_path / "elsewhere"),
        )
        r.runner.launch(r.specs[other], planted)  # the same incarnation, started by hand

        checked = gpuctl(r.state_dir, inventory, "db", "check", "--fleet")
        assert checked.returncode == 1, checked.stdout + checked.stderr
        assert f"job {job.id}: 2 live copies: incarnation 1 on {home}, incarnation 1 on " in (
            checked.stdout
        )
        assert (
            f"stray run on {other}: incarnation 1 of job {job.id} is live there; the store has "
            f"it on {home}"
        ) in checked.stdout
        assert "the fleet does not match the store: 2 problem(s)" in checked.stderr
        as_json = gpuctl(r.state_dir, inventory, "db", "check", "--fleet", "-o", "json")
        fleet = json.loads(as_json.stdout)["fleet"]
        assert fleet["clean"] is False and len(fleet["problems"]) == 2
        assert {"job_id": job.id, "incarnation": 1, "nodes": sorted([home, other])} in fleet["live"]

        assert r.runner.fence(r.specs[other], job.id, 1).gone  # that node's copy only
        assert r.copies(job.id) == [1] and r.running(job.id, 1)
        assert gpuctl(r.state_dir, inventory, "db", "check", "--fleet").returncode == 0
