"""Jobs Slurm runs (`submit --backend slurm`): the control loop leaves them to Slurm, the fleet
check calls none a stray, their stored spec keeps the Slurm job id, their state reads from
squeue and the exit marker, and their batch script carries no secret."""

from __future__ import annotations

import dataclasses

from gpuctl.adapters.slurm import SlurmJobState, batch_script
from gpuctl.adapters.slurm._jobs import encode_secrets
from gpuctl.core.jobs.model import Event, Job, JobState, LaunchRequest
from gpuctl.core.jobs.spec import Backend, JobSpec
from gpuctl.ops.fleetcheck import check_fleet
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.slurm_jobs import seen
from gpuctl.testing.memstore import MemoryStore
from tests.unit.ops.test_reconcile import make

BACKEND = Backend("slurm", "42", "/home/alice/.gpuctl/slurm/sjob-1", "hpc1")


def slurm_job(template: Job, state: JobState = JobState.QUEUED) -> Job:
    spec = dataclasses.replace(template.spec, backend=BACKEND)
    return dataclasses.replace(template, id="sjob-1", name="sjob", spec=spec, state=state)


def add(store: MemoryStore, job: Job) -> None:
    store.add_job(
        job, Event(at=0.0, actor="alice", kind="submit", message="to Slurm", job_id=job.id)
    )


def test_the_loop_never_launches_a_job_slurm_runs_and_db_check_finds_it_sound() -> None:
    t = make(MemoryStore())
    ours = t.submit("train")
    add(t.store, slurm_job(ours))
    t.step()
    assert t.job(ours.id).state is JobState.RUNNING  # gpuctl's own job: placed and launched
    assert t.job("sjob-1").state is JobState.QUEUED
    assert t.store.incarnations("sjob-1") == []
    assert [n for n, r in t.runner.launches if r.job_id == "sjob-1"] == []

    running = make(MemoryStore())
    add(running.store, slurm_job(ours, JobState.RUNNING))
    assert check_invariants(running.store) == []


def test_a_slurm_jobs_process_on_a_node_is_no_stray() -> None:
    t = make(MemoryStore())
    template = t.submit("train")
    add(t.store, slurm_job(template, JobState.RUNNING))
    t.step()
    request = LaunchRequest("sjob-1", 1, ("sleep", "60"), "1", 1024, "/ckpt")
    t.runner.launch(t.cluster.node("n2").spec(), request)  # what Slurm started there
    found = check_fleet(t.store, t.cluster.inventory(), t.runner)
    assert found.problems == (), found.problems


def test_the_slurm_job_id_round_trips_in_the_stored_spec() -> None:
    t = make(MemoryStore())
    spec = dataclasses.replace(t.submit("train").spec, backend=BACKEND)
    data = spec.to_dict()
    assert data["backend"] == {
        "kind": "slurm",
        "id": "42",
        "run_dir": BACKEND.run_dir,
        "cluster": "hpc1",
    }
    assert JobSpec.from_dict(data) == spec
    slow = {**data, "env": {"A": 1}}  # the key-by-key reader, which names the field
    try:
        JobSpec.from_dict(slow)
    except ValueError as exc:
        assert "env.A" in str(exc)
    assert "backend" not in dataclasses.replace(spec, backend=None).to_dict()


def test_state_from_squeue_then_from_the_exit_marker() -> None:
    t = make(MemoryStore())
    job = slurm_job(t.submit("train"))
    pending = seen(job, SlurmJobState("42", "PENDING", None, "Resources"), None)
    assert (pending.state, pending.reason) == (JobState.QUEUED, "Slurm job 42: PENDING (Resources)")
    running = seen(job, SlurmJobState("42", "RUNNING", "gpu07", None, restarts=1), None)
    assert (running.state, running.node, running.incarnation) == (JobState.RUNNING, "gpu07", 2)
    assert seen(job, None, (2, 0)).state is JobState.SUCCEEDED
    failed = seen(job, None, (2, 3))
    assert (failed.state, failed.reason) == (JobState.FAILED, "Slurm job 42: exited 3")
    assert seen(job, None, None).state is JobState.FAILED


def test_the_batch_script_carries_the_contract_and_no_secret() -> None:
    script = batch_script(
        job_id="sjob-1",
        argv=("python", "train.py", "--lr", "0.1 x"),
        checkpoint_dir="/shared/ckpt/sjob-1",
        mib_per_card=81920,
        env={"MODE": "fast"},
    )
    assert "export GPUCTL_JOB_ID=sjob-1" in script
    assert "GPUCTL_INCARNATION=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))" in script
    assert "unset GPUCTL_RESUME_FROM" in script
    assert "python train.py --lr '0.1 x'" in script
    assert b"hunter2" not in script.encode() and b"aHVudGVyMg==" in encode_secrets({"T": "hunter2"})
