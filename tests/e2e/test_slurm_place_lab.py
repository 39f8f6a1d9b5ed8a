"""`gpuctl place --emit sbatch` over a real Slurm (tests/slurm.py) whose nodes are the lab's: the
options it prints, submitted by real `sbatch`, put the job on the node gpuctl chose with the
GPU count and type it asked."""

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
from tests.slurm import SLURM_USER, SlurmCluster, slurm_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

Rig = tuple[LabFleet, SlurmCluster, Path]
GPUS = 2


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    with lab_fleet(nodes=2, gpus=GPUS) as lab, slurm_cluster(lab.names, gpus=GPUS) as slurm:
        inventory = lab.dir / "slurm-inventory.yaml"  # beside the lab's key: relative paths
        inventory.write_text(
            lab.lab.inventory_path.read_text()
            + f"slurm:\n  cluster: gpuctltest\n  conf: {slurm.conf}\n"
        )
        yield lab, slurm, inventory


def cli(rig: Rig, state: Path, *args: str) -> Result:
    _, _, inventory = rig

    def transport() -> SshTransport:
        return SshTransport(own_known_hosts=state / "kh", system_known_hosts=())

    ctx = AppContext(transport_factory=transport, env={**os.environ, "USER": "alice"})  # type: ignore[arg-type]
    argv = ["-i", str(inventory), "--state-dir", str(state / "state"), *args]
    return CliRunner().invoke(app, argv, obj=ctx)


def test_emitted_sbatch_options_land_the_job_where_gpuctl_placed_it(
    rig: Rig, tmp_path: Path
) -> None:
    lab, slurm, _ = rig
    first, second = lab.names
    holder = slurm.sbatch("--gres=gpu:1", "-w", first, "-J", "holder", "--wrap", "sleep 300")
    try:
        waiting.wait_for(lambda: slurm.job_state(holder) == "RUNNING", timeout_s=30, every_s=0.2)
        spec = tmp_path / "train.yaml"
        spec.write_text(
            "name: train\nresources:\n  gpus: 2\n  mem_per_gpu: 10GiB\n  cpu: 1\n"
            "  host_mem: 100MiB\n"
        )
        result = cli(rig, tmp_path, "place", str(spec), "--emit", "sbatch")
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert lines[:7] == [
            "#SBATCH --job-name=train",
            f"#SBATCH --nodelist={second}",  # the first node has one card free of its two
            "#SBATCH --nodes=1",
            "#SBATCH --ntasks=1",
            "#SBATCH --gres=gpu:h100:2",
            "#SBATCH --cpus-per-task=1",
            "#SBATCH --mem=100M",
        ]
        assert lines[7].startswith(f"# gpuctl placed train on {second}, cards 0,1:")

        script = slurm.dir / "train.sh"  # where the harness's user reads it
        script.write_text("#!/bin/sh\n" + result.stdout + "sleep 300\n")
        script.chmod(0o755)
        job = slurm.sbatch(str(script))
        try:
            waiting.wait_for(lambda: slurm.job_state(job) == "RUNNING", timeout_s=30, every_s=0.2)
            doc = json.loads(slurm.run("squeue", "--json", "-j", job))
            (found,) = [j for j in doc["jobs"] if str(j["job_id"]) == job]
            assert found["nodes"] == second
            assert found["name"] == "train"
            assert found["user_name"] == SLURM_USER
            shown = slurm.run("scontrol", "show", "job", "-d", job)
            assert "gpu:h100:2(IDX:0-1)" in shown, shown
        finally:
            slurm.run("scancel", job)
    finally:
        slurm.run("scancel", holder)


def test_emit_sbatch_without_a_slurm_inventory_is_one_line_and_exit_2(
    rig: Rig, tmp_path: Path
) -> None:
    lab, _, _ = rig
    spec = tmp_path / "one.yaml"
    spec.write_text("name: one\nresources:\n  gpus: 1\n")
    argv = ["-i", str(lab.lab.inventory_path), "place", str(spec), "--emit", "sbatch"]

    def transport() -> SshTransport:
        return SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=())

    result = CliRunner().invoke(
        app,
        ["--state-dir", str(tmp_path / "state"), *argv],
        obj=AppContext(transport_factory=transport),  # type: ignore[arg-type]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0] == (
        "error: --emit sbatch: the inventory reads no Slurm cluster"
    )


def test_inventory_list_and_the_job_commands_see_slurms_nodes(rig: Rig, tmp_path: Path) -> None:
    lab, _, _ = rig
    result = cli(rig, tmp_path, "inventory", "list", "-o", "json")
    assert result.exit_code == 0, result.output
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    assert sorted(nodes) == sorted(lab.names)
    for name in lab.names:
        assert nodes[name]["labels"]["slurm"] == "gpuctltest"
        assert nodes[name]["labels"]["partition/gpu"] == "true"

    # submit loads the same inventory (its fit check polls the nodes with Slurm's labels)
    spec = tmp_path / "gpu.yaml"
    spec.write_text(
        "name: gpu\ncommand: [sleep, '1']\nresources:\n  gpus: 1\n"
        "affinity:\n  nodes: {partition/gpu: 'true'}\n"
    )
    result = cli(rig, tmp_path, "submit", str(spec))
    assert result.exit_code == 0, result.output
    assert "could ever" not in result.stderr
