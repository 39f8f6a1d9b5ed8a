"""Node faults on a lab fleet, judged by what runs, what the logs say and the shared invariants:
a node killed mid-job, sshd killed while its job lives on, a network partition."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuctl.core.jobs.model import IncarnationState
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import Rig, committed_steps, rig, steps, train_losses

pytestmark = pytest.mark.e2e


def checkpointed(r: Rig, job_id: str, step: int) -> bool:
    """The store knows a committed checkpoint of the job at `step` or later."""
    return any(c.step >= step for c in r.store.checkpoints(job_id))


def test_a_killed_node_s_jobs_run_again_elsewhere_from_their_last_committed_checkpoints(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    with rig(own_lab, tmp_path) as r:
        jobs = [r.train("train-a"), r.train("train-b")]
        r.until(lambda: all(r.running(j.id, 1) for j in jobs), "both jobs running")
        r.until(lambda: all(checkpointed(r, j.id, 10) for j in jobs), "two checkpoints each")
        node = r.inc(jobs[0].id, 1).node
        moved = [j for j in jobs if r.inc(j.id, 1).node == node]
        own_lab.kill(node)

        r.until(lambda: all(r.running(j.id, 2) for j in moved), "the jobs restarted elsewhere")
        for job in moved:
            second = r.inc(job.id, 2)
            assert second.node != node and r.job(job.id).id == job.id
            assert r.inc(job.id, 1).state is IncarnationState.LOST
            # the dead copy can commit nothing more: its newest checkpoint is the one to resume
            last = committed_steps(r.shared / job.id, incarnation=1)[-1]
            assert second.resume_step == last

            def resumed(job_id: str = job.id, last: int = last) -> list[tuple[int, str]]:
                return [s for s in steps(r.log(job_id, 2)) if s[0] >= last + 3]

            assert r.until(resumed, "incarnation 2 logging steps")
            log = r.log(job.id, 2)
            assert f"resumed from step {last} (incarnation 1)" in log
            after = steps(log)
            assert after[0][0] == last + 1  # no step skipped, none repeated
            expected = train_losses(after[-1][0])
            assert after == [(n, expected[n]) for n, _ in after]  # as if never interrupted
            assert r.copies(job.id) == [2]
        r.check()


def test_sshd_killed_is_not_a_dead_job_no_restart_in_the_grace_and_no_duplicate_after(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    grace = 3.0
    with rig(own_lab, tmp_path, grace_s=grace) as r:
        job = r.train("train", sync="pull")
        r.until(lambda: r.running(job.id, 1) and checkpointed(r, job.id, 5), "a checkpoint")
        node = r.inc(job.id, 1).node

        # sshd dies and comes back within the grace: nothing is restarted or killed
        own_lab.kill_sshd(node)
        logged = len(steps(r.log(job.id, 1)))
        began = time.monotonic()
        while time.monotonic() - began < grace * 0.6:
            r.run_pass()
            assert r.running(job.id, 1) and r.copies(job.id) == [1], r.history(job.id)
        assert r.events(node=node, kind="node_failing")
        assert len(steps(r.log(job.id, 1))) > logged  # the job worked on without its sshd
        own_lab.revive(node)
        r.until(lambda: r.events(node=node, kind="node_recovered"), "the node recovered")
        assert r.running(job.id, 1) and r.copies(job.id) == [1]
        assert not r.events(job.id, "failover")

        # sshd dies for longer than the grace: restarted elsewhere, the stale copy fenced
        own_lab.kill_sshd(node)
        r.until(lambda: r.running(job.id, 2), "restarted after the grace")
        failing = r.events(node=node, kind="node_failing")[-1].at
        assert r.events(job.id, "failover")[-1].at - failing >= grace
        assert r.inc(job.id, 2).node != node
        assert r.copies(job.id) == [1, 2]  # the old copy lives on where gpuctl cannot reach it
        own_lab.revive(node)
        r.until(lambda: r.inc(job.id, 1).state is IncarnationState.KILLED, "the old copy fenced")
        assert "killed the stale copy" in r.events(job.id, "fence")[-1].message
        assert r.copies(job.id) == [2]
        assert r.running(job.id, 2)
        r.check()


def test_a_partitioned_node_s_job_restarts_elsewhere_and_its_old_copy_is_fenced_on_return(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    for name in own_lab.names:  # each node in its own network namespace, behind a link
        own_lab.enclose(name)
    with rig(own_lab, tmp_path) as r:
        job = r.train("train", sync="pull")
        r.until(lambda: r.running(job.id, 1) and checkpointed(r, job.id, 5), "a checkpoint")
        node = r.inc(job.id, 1).node
        own_lab.partition(node)

        r.until(lambda: r.running(job.id, 2), "restarted on the other side of the partition")
        assert r.inc(job.id, 2).node != node
        assert r.inc(job.id, 1).state is IncarnationState.LOST
        assert r.events(node=node, kind="node_down")
        assert r.copies(job.id) == [1, 2]  # cut off, the old copy runs on
        resumed = r.inc(job.id, 2).resume_step
        assert resumed is not None and resumed >= 5

        own_lab.heal(node)
        r.until(lambda: r.inc(job.id, 1).state is IncarnationState.KILLED, "the old copy fenced")
        assert r.events(node=node, kind="node_back")
        assert "killed the stale copy" in r.events(job.id, "fence")[-1].message
        assert r.copies(job.id) == [2]
        log = r.until(lambda: r.log(job.id, 2), "incarnation 2 logging")
        assert f"resumed from step {resumed} (incarnation 1)" in log
        r.check()
