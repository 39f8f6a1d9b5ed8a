"""Job faults on a lab fleet: a job SIGKILLed (restarted within its budget, then held), a crash
loop (held, its node not blamed), a kill in the middle of a checkpoint write (the previous one is
used), a corrupted checkpoint (the one before it, loudly), every checkpoint corrupted (held for a
person, never started fresh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.adapters.node import _checkpoints as job_checkpoints
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import (
    PYTHON,
    REPO,
    SLOW_SAVE,
    Rig,
    committed_steps,
    gpuctl,
    rig,
    steps,
)

pytestmark = pytest.mark.e2e


def checkpointed(r: Rig, job_id: str, step: int) -> bool:
    return any(c.step >= step for c in r.store.checkpoints(job_id))


def test_a_job_killed_with_sigkill_is_restarted_from_its_checkpoint_then_held_past_its_budget(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    with rig(own_lab, tmp_path) as r:
        job = r.train("train", extra="restart_budget: 1\n")
        r.until(lambda: r.running(job.id, 1) and checkpointed(r, job.id, 5), "a checkpoint")
        r.kill_incarnation(job.id, 1)

        r.until(lambda: r.running(job.id, 2), "restarted after the crash")
        assert "restarting (1 of 1 restarts)" in r.events(job.id, "restart")[-1].message
        assert r.job(job.id).restarts == 1
        last = committed_steps(r.shared / job.id, incarnation=1)[-1]
        assert r.inc(job.id, 2).resume_step == last
        log = r.until(lambda: r.log(job.id, 2) if steps(r.log(job.id, 2)) else "", "a step")
        assert f"resumed from step {last} (incarnation 1)" in log
        assert steps(log)[0][0] == last + 1

        r.kill_incarnation(job.id, 2)
        r.until(lambda: r.job(job.id).state is JobState.HELD, "held")
        reason = r.job(job.id).reason or ""
        assert "restart budget spent: 2 failures within 1h00m (budget 1)" in reason
        r.run_pass()
        assert [i.n for i in r.incs(job.id)] == [1, 2]  # held: not started again
        assert r.copies(job.id) == []
        assert r.store.cordons() == []
        r.check()


def test_a_crash_looping_job_is_held_and_its_node_is_not_blamed(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    with rig(own_lab, tmp_path) as r:
        job = r.submit(
            "crasher",
            f"command: [{PYTHON}, -c, 'import sys; print(\"boom\"); sys.exit(3)']\n"
            "resources: {gpus: 1, mem_per_gpu: 1GiB}\n"
            "restart_budget: 10\n",
        )
        r.until(lambda: r.job(job.id).state is JobState.HELD, "held")
        assert "crash loop" in (r.job(job.id).reason or "")
        incs = r.incs(job.id)
        assert [(i.n, i.exit_code) for i in incs] == [(1, 3), (2, 3), (3, 3)]
        assert all(i.state is IncarnationState.EXITED for i in incs)
        assert "boom" in r.log(job.id, 3)
        r.run_pass()
        r.run_pass()
        assert len(r.incs(job.id)) == 3  # held stays held
        assert r.store.cordons() == []  # the node is not blamed
        assert all(n.liveness == "ok" for n in r.reports[-1].nodes)
        r.check()


def test_a_kill_during_a_checkpoint_write_resumes_from_the_previous_checkpoint(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    with rig(own_lab, tmp_path) as r:
        script = r.shared / "slow_save.py"
        script.write_text(SLOW_SAVE)
        job = r.submit(
            "slow",
            f"command: [{PYTHON}, {script}]\n"
            "resources: {gpus: 1, mem_per_gpu: 1GiB}\n"
            f"checkpoint: {{dir: '{r.shared}/{{job_id}}', sync: shared}}\n"
            f"env: {{REPO: '{REPO}', SLOW_AT: '10', PYTHONDONTWRITEBYTECODE: '1'}}\n",
        )
        r.until(lambda: "writing checkpoint 10" in r.log(job.id, 1), "inside the save of 10")
        folder = r.shared / job.id
        assert list(folder.glob(".tmp-step-10-*/weights.bin"))  # half written
        r.kill_incarnation(job.id, 1)

        r.until(lambda: r.running(job.id, 2), "restarted")
        assert committed_steps(folder, incarnation=1) == [5]
        assert r.inc(job.id, 2).resume_step == 5
        log = r.until(lambda: r.log(job.id, 2) if steps(r.log(job.id, 2)) else "", "a step")
        assert "resumed from step 5" in log and steps(log)[0][0] == 6
        r.check()


def corrupt_newest_and_restart(r: Rig, job_id: str) -> tuple[int, int]:
    """Kill the job with two committed checkpoints or more, damage the newest (a byte of its
    state.json), and run the loop until the job runs again: (the damaged step, the one before)."""
    folder = r.shared / job_id
    r.until(lambda: len(committed_steps(folder, incarnation=1)) >= 2, "two checkpoints")
    r.kill_incarnation(job_id, 1)
    *_, previous, newest = committed_steps(folder, incarnation=1)
    damage(folder / f"step-{newest:08d}")
    r.until(lambda: r.running(job_id, 2), "restarted")
    return newest, previous


def damage(checkpoint: Path) -> None:
    """Flip letters in a committed checkpoint's state.json: its checksum no longer matches."""
    data = checkpoint / "state.json"
    data.write_bytes(data.read_bytes().replace(b"weights", b"WEIGHTS"))


def test_a_corrupted_checkpoint_is_skipped_loudly_for_the_one_before_it(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    # the loop reads checkpoints every 30 s (the default): the newest ones are not in the store
    with rig(own_lab, tmp_path, checkpoint_scan_s=30.0) as r:
        job = r.train("train")
        newest, previous = corrupt_newest_and_restart(r, job.id)

        assert r.inc(job.id, 2).resume_step == previous
        skipped = [e.message for e in r.events(job.id, "checkpoint_skipped")]
        assert any(
            f"step-{newest:08d} of incarnation 1: checksum mismatch: state.json" in m
            for m in skipped
        ), skipped
        log = r.until(lambda: r.log(job.id, 2) if steps(r.log(job.id, 2)) else "", "a step")
        assert f"resumed from step {previous} (incarnation 1)" in log
        assert steps(log)[0][0] == previous + 1
        r.check()


def test_a_checkpoint_damaged_after_the_store_recorded_it_still_passes_the_invariants(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    with rig(own_lab, tmp_path, checkpoint_scan_s=0.0) as r:
        job = r.train("train", every=10)  # 0.5 s apart: one older than the recorded one is kept
        r.until(lambda: len(r.store.checkpoints(job.id)) >= 2, "two recorded checkpoints")
        r.kill_incarnation(job.id, 1)
        recorded = r.store.checkpoints(job.id)[0].step  # the newest the store knows
        on_disk = committed_steps(r.shared / job.id, incarnation=1)
        for step in on_disk:
            if step >= recorded:  # it, and any the job committed since the last pass
                damage(r.shared / job.id / f"step-{step:08d}")
        r.until(lambda: r.running(job.id, 2), "restarted")
        assert r.inc(job.id, 2).resume_step == max(s for s in on_disk if s < recorded)
        r.check()


def test_a_job_whose_every_checkpoint_is_damaged_at_failover_is_held_not_started_fresh(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    with rig(own_lab, tmp_path) as r:
        job = r.train("train")
        r.until(lambda: len(r.store.checkpoints(job.id)) >= 2, "two recorded checkpoints")
        node = r.inc(job.id, 1).node
        own_lab.kill(node)  # the node dies with the job: no checkpoint is written after this
        folder = r.shared / job.id
        on_disk = committed_steps(folder, incarnation=1)
        for step in on_disk:
            damage(folder / f"step-{step:08d}")

        r.until(lambda: r.job(job.id).state is JobState.HELD, "held")
        reason = r.job(job.id).reason or ""
        assert reason.startswith("no usable checkpoint: "), reason
        for step in on_disk[-2:]:
            assert f"step {step} of incarnation 1: checksum mismatch: state.json" in reason
        assert "gpuctl submit --replace" in reason
        r.run_pass()
        assert [i.n for i in r.incs(job.id)] == [1]  # nothing launched from a fresh start
        assert r.inc(job.id, 1).state is IncarnationState.LOST
        assert r.copies(job.id) == []
        r.check()
        checked = gpuctl(r.state_dir, None, "db", "check")
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_damaged_copy_in_gpuctl_s_checkpoint_store_is_skipped_for_the_one_before_it(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    with rig(own_lab, tmp_path) as r:
        job = r.train("train", sync="pull")
        r.until(lambda: len(r.store.checkpoints(job.id)) >= 2, "two copied checkpoints")
        r.kill_incarnation(job.id, 1)
        newest, previous = r.store.checkpoints(job.id)[:2]  # newest first
        damage(Path(newest.path))

        r.until(lambda: r.running(job.id, 2), "restarted")
        assert r.inc(job.id, 2).resume_step == previous.step
        assert r.events(job.id, "checkpoint_skipped")
        r.check()


def test_a_checkpoint_pruned_while_it_is_listed_is_not_reported_as_unreadable() -> None:
    """The node lists a step folder, the job prunes it, the marker read finds nothing: the line
    is dropped, not turned into an "unreadable marker" (a false alarm in the control loop)."""
    assert job_checkpoints.parse_checkpoint_listing(b"gpuctl-ckpt marker step-00000010 \n") == []
