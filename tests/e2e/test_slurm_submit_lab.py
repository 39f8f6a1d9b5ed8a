"""`gpuctl submit --backend slurm` over a real Slurm (tests/slurm.py) whose nodes are the lab's:
the job lands on the node gpuctl chose, `jobs show` and `logs` follow it, a requeue resumes it
from its newest committed checkpoint with the same GPUCTL_* contract, `cancel` is scancel, and
its secret is on no command line nor in the batch script Slurm keeps; a control-loop pass
records its state in the store, so `status`, metrics and `jobs` agree."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.ssh import SshTransport
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.testing import waiting
from gpuctl.testing.lab import LabFleet, lab_fleet
from tests.slurm import SlurmCluster, slurm_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

Rig = tuple[LabFleet, SlurmCluster, Path]
GPUS = 2
SECRET = "s3cr3t-4f9a1c-value"
REPO = Path(__file__).resolve().parents[2]

TRAIN = """\
import os, sys, time
from gpuctl.checkpoint import Checkpointer

ckpt = Checkpointer(keep=10_000)  # the test reads the resumed step's marker later: keep it
loaded = ckpt.latest()
step = 0
if loaded is not None:
    step = int(loaded.read("step"))
    print(f"resumed from {step} (incarnation {os.environ['GPUCTL_INCARNATION']})", flush=True)
print("token", "ok" if len(os.environ.get("TOKEN", "")) == int(sys.argv[1]) else "missing")
while True:
    step += 1
    print(f"step {step} incarnation {os.environ['GPUCTL_INCARNATION']}", flush=True)
    ckpt.save(step, {"step": str(step).encode()})
    time.sleep(0.3)
"""


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    with lab_fleet(nodes=2, gpus=GPUS) as lab, slurm_cluster(lab.names, gpus=GPUS) as slurm:
        inventory = lab.dir / "slurm-inventory.yaml"
        inventory.write_text(
            lab.lab.inventory_path.read_text()
            + f"slurm:\n  cluster: gpuctltest\n  conf: {slurm.conf}\n"
        )
        yield lab, slurm, inventory


def cli(rig: Rig, state: Path, *args: str) -> Result:
    _, _, inventory = rig

    def transport() -> SshTransport:
        return SshTransport(own_known_hosts=state / "kh", system_known_hosts=())

    env = {**os.environ, "USER": "alice", "TOKEN": SECRET}
    ctx = AppContext(transport_factory=transport, env=env)  # type: ignore[arg-type]
    argv = ["-i", str(inventory), "--state-dir", str(state / "state"), *args]
    return CliRunner().invoke(app, argv, obj=ctx)


def _cmdlines() -> str:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out.append((entry / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return "\n".join(out)


def test_a_slurm_job_runs_where_gpuctl_placed_it_and_resumes_after_a_requeue(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab, slurm, _ = rig
    first, second = lab.names
    home = tmp_path / "home"  # the run dir goes under $HOME (a shared file system's, here local)
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "train.py").write_text(TRAIN)
    spec = tmp_path / "train.yaml"
    spec.write_text(
        "name: train\n"
        f"command: [{sys.executable}, {tmp_path / 'train.py'}, '{len(SECRET)}']\n"
        f"env: {{PYTHONPATH: {REPO}}}\n"
        "secret_env: [TOKEN]\n"
        f"checkpoint: {{dir: '{tmp_path}/ckpt/{{job_id}}', sync: shared}}\n"
        "resources: {gpus: 2, mem_per_gpu: 10GiB}\n"
    )
    holder = slurm.sbatch("--gres=gpu:1", "-w", first, "-J", "holder", "--wrap", "sleep 300")
    try:
        waiting.wait_for(lambda: slurm.job_state(holder) == "RUNNING", timeout_s=30, every_s=0.2)
        result = cli(rig, tmp_path, "submit", "--backend", "slurm", str(spec))
        assert result.exit_code == 0, result.output
        m = re.match(r"submitted (\S+) to Slurm as job (\d+)", result.stdout)
        assert m is not None, result.stdout
        job, sid = m.group(1), m.group(2)

        assert waiting.wait_for(lambda: slurm.job_state(sid) == "RUNNING", timeout_s=30)
        assert slurm.run("squeue", "-h", "-j", sid, "-o", "%N").strip() == second
        assert SECRET not in _cmdlines()
        script = slurm.run("scontrol", "write", "batch_script", sid, "-")
        assert "GPUCTL_JOB_ID" in script and SECRET not in script

        passed = cli(rig, tmp_path, "reconcile", "-o", "json")  # it records Slurm's state
        assert passed.exit_code == 0, passed.output
        shown = cli(rig, tmp_path, "jobs", "show", job, "-o", "json")
        assert shown.exit_code == 0, shown.output
        doc = json.loads(shown.stdout)
        assert (doc["state"], doc["node"], len(doc["gpus"])) == ("running", second, 2)

        def log() -> str:
            out = cli(rig, tmp_path, "logs", job)
            assert out.exit_code == 0, out.output
            return out.stdout

        assert waiting.wait_for(lambda: "step 3 incarnation 1" in log(), timeout_s=30, every_s=0.3)
        assert "token ok" in log()

        slurm.run("scontrol", "requeue", sid)
        # Slurm holds a requeued batch job back for two minutes (its BeginTime): start it now
        assert waiting.wait_for(lambda: slurm.job_state(sid) == "PENDING", timeout_s=30)
        slurm.run("scontrol", "update", f"jobid={sid}", "starttime=now")
        restarted = waiting.wait_for(lambda: "resumed from" in log(), timeout_s=90, every_s=0.5)
        assert restarted, slurm.run("squeue", "-h", "-j", sid, "-o", "%T %r %S %V")
        assert waiting.wait_for(lambda: "incarnation 2\n" in log(), timeout_s=30, every_s=0.3)
        text = log()
        assert "resumed from " in text, text[-3000:]
        after = text.split("resumed from ", 1)[1]
        resumed = int(after.split()[0])
        assert after.startswith(f"{resumed} (incarnation 2)")
        first_step = re.search(r"^step (\d+) incarnation 2$", after, re.MULTILINE)
        assert first_step is not None and int(first_step.group(1)) == resumed + 1
        marker = json.loads(
            (tmp_path / "ckpt" / job / f"step-{resumed:08d}" / "COMMITTED").read_text()
        )
        assert (marker["job_id"], marker["incarnation"]) == (job, 1)
        assert f"step {resumed} incarnation 1" in log()

        done = cli(rig, tmp_path, "cancel", job, "--yes")
        assert done.exit_code == 0, done.output
        assert done.stdout.startswith(f"{job} cancelled (scancel {sid})")
        assert waiting.wait_for(
            lambda: slurm.job_state(sid) not in ("RUNNING", "PENDING", "COMPLETING"),
            timeout_s=60,
            every_s=0.3,
        )
        shown = cli(rig, tmp_path, "jobs", "show", job, "-o", "json")
        assert json.loads(shown.stdout)["state"] == "cancelled"
    finally:
        slurm.run("scancel", holder)


def test_a_pass_records_a_slurm_jobs_run_and_its_end_and_every_surface_agrees(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, slurm, _ = rig
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    gate = tmp_path / "go"
    spec = tmp_path / "short.yaml"
    wait = f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.2)\n"
    spec.write_text(
        "name: short\n"
        f"command: [{sys.executable}, -c, {json.dumps(wait)}]\n"
        "resources: {gpus: 1, mem_per_gpu: 10GiB}\n"
    )
    result = cli(rig, tmp_path, "submit", "--backend", "slurm", str(spec))
    assert result.exit_code == 0, result.output
    m = re.match(r"submitted (\S+) to Slurm as job (\d+)", result.stdout)
    assert m is not None, result.stdout
    job, sid = m.group(1), m.group(2)
    try:
        assert waiting.wait_for(lambda: slurm.job_state(sid) == "RUNNING", timeout_s=30)
        node = slurm.run("squeue", "-h", "-j", sid, "-o", "%N").strip()

        def surfaces() -> tuple[dict[str, object], dict[str, object], str]:
            passed = cli(rig, tmp_path, "reconcile", "-o", "json")
            assert passed.exit_code == 0, passed.output
            shown = cli(rig, tmp_path, "jobs", "show", job, "-o", "json")
            status = cli(rig, tmp_path, "status", "-o", "json")
            metrics = cli(rig, tmp_path, "metrics", "dump", "--from-store")
            assert shown.exit_code == 0 and status.exit_code in (0, 3), status.output
            return json.loads(shown.stdout), json.loads(status.stdout)["numbers"], metrics.stdout

        doc, numbers, metrics = surfaces()
        assert (doc["state"], doc["node"], doc["incarnation"]) == ("running", node, 1)
        assert len(doc["gpus"]) == 1
        assert (numbers["checkpoint_running_jobs"], numbers["queue_waiting"]) == (1, 0)
        assert f'job_id="{job}"' in metrics and 'state="running"' in metrics, metrics

        gate.write_text("")  # the job ends with status 0
        assert waiting.wait_for(
            lambda: slurm.job_state(sid) not in ("RUNNING", "COMPLETING"), timeout_s=60
        )
        doc, numbers, metrics = surfaces()
        assert (doc["state"], doc["reason"]) == ("succeeded", None)
        assert [i["state"] for i in doc["incarnations"]] == ["exited"]
        assert (numbers["checkpoint_running_jobs"], numbers["queue_waiting"]) == (0, 0)
        assert f'job_id="{job}"' not in metrics  # only live jobs have series
    finally:
        slurm.run("scancel", sid)
