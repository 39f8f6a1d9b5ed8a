"""gpuctl reading a real Slurm (tests/slurm.py: Debian's munged, slurmctld and one slurmd per lab
node) over a lab fleet whose nodes are Slurm's nodes: NVML from the lab's fake nvidia-smi, jobs
and node states from Slurm. A Slurm job's GPUs count in `status` and `place` refuses them; a
drain set with `scontrol update` shows in `nodes list` with its reason and who set it."""

from __future__ import annotations

import json
import os
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

GPUS = 2


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[LabFleet, SlurmCluster, Path]]:
    with lab_fleet(nodes=2, gpus=GPUS) as lab, slurm_cluster(lab.names, gpus=GPUS) as slurm:
        inventory = lab.dir / "slurm-inventory.yaml"  # beside the lab's key: relative paths
        inventory.write_text(
            lab.lab.inventory_path.read_text()
            + f"slurm:\n  cluster: gpuctltest\n  conf: {slurm.conf}\n"
        )
        yield lab, slurm, inventory


def cli(rig: tuple[LabFleet, SlurmCluster, Path], tmp_path: Path, *args: str) -> Result:
    _, _, inventory = rig

    def transport() -> SshTransport:
        return SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=())

    ctx = AppContext(transport_factory=transport, env={**os.environ, "USER": "alice"})  # type: ignore[arg-type]
    argv = ["-i", str(inventory), "--state-dir", str(tmp_path / "state"), *args]
    return CliRunner().invoke(app, argv, obj=ctx)


def test_a_slurm_jobs_gpus_count_in_status_and_place_refuses_them(
    rig: tuple[LabFleet, SlurmCluster, Path], tmp_path: Path
) -> None:
    lab, slurm, _ = rig
    first = lab.names[0]
    job = slurm.sbatch(
        f"--gres=gpu:{GPUS}", "-w", first, "-J", "slurm-train", "--wrap", "sleep 300"
    )
    try:
        waiting.wait_for(lambda: slurm.job_state(job) == "RUNNING", timeout_s=30, every_s=0.2)
        result = cli(rig, tmp_path, "status", "-o", "json")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        held = [j for j in doc["scheduler"]["jobs"] if j["job_id"] == job]
        assert [(j["node"], j["cards"], j["name"]) for j in held] == [
            (first, list(range(GPUS)), "slurm-train")
        ]
        numbers = doc["numbers"]
        assert numbers["utilization_pct"] == pytest.approx(50.0)  # one node's cards of two

        spec = tmp_path / "job.yaml"
        spec.write_text("name: one\nresources:\n  gpus: 1\n  mem_per_gpu: whole\n")
        result = cli(rig, tmp_path, "place", str(spec), "-o", "json")
        assert result.exit_code == 0, result.output
        (decision,) = json.loads(result.stdout)["jobs"]
        assert decision["placed"] is True
        assert decision["node"] == lab.names[1], decision  # the Slurm job's cards are taken
    finally:
        slurm.run("scancel", job)


def test_a_slurm_drain_shows_in_nodes_list_with_its_reason_and_who(
    rig: tuple[LabFleet, SlurmCluster, Path], tmp_path: Path
) -> None:
    lab, slurm, _ = rig
    node = lab.names[1]
    slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=bad fan")
    try:
        result = cli(rig, tmp_path, "nodes", "list", "-o", "json")
        assert result.exit_code == 0, result.output
        rows = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
        row = rows[node]
        assert row["state"] == "cordoned"
        assert row["state_reason"] == "Slurm IDLE+DRAIN: bad fan"
        assert row["state_by"] == "root"
        assert row["state_source"] == "slurm"
        assert rows[lab.names[0]]["state"] == "ready"
        assert rows[node]["labels"]["partition/gpu"] == "true"

        result = cli(rig, tmp_path, "nodes", "list")
        assert result.exit_code == 0, result.output
        assert "bad fan" in result.stdout
    finally:
        slurm.run("scontrol", "update", f"nodename={node}", "state=resume")
