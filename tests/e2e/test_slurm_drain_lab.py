"""gpuctl draining through a real Slurm (tests/slurm.py) over a lab fleet whose nodes are Slurm's:
a health cordon of the control loop and an operator's `gpuctl cordon` drain the node in Slurm with
a `gpuctl: ...` reason, `gpuctl uncordon` resumes it, and a drain an operator set in Slurm is
never resumed by gpuctl."""

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
from gpuctl.testing.lab import LabFleet, lab_fleet
from tests.slurm import SlurmCluster, slurm_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

Rig = tuple[LabFleet, SlurmCluster, Path]


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    with lab_fleet(nodes=2, gpus=2) as lab, slurm_cluster(lab.names, gpus=2) as slurm:
        inventory = lab.dir / "slurm-inventory.yaml"  # beside the lab's key: relative paths
        inventory.write_text(
            lab.lab.inventory_path.read_text()
            + f"slurm:\n  cluster: gpuctltest\n  conf: {slurm.conf}\n"
        )
        yield lab, slurm, inventory


@pytest.fixture
def clean(rig: Rig) -> Rig:
    lab, slurm, _ = rig
    for name in lab.names:
        inject(lab, name, "--clear")
        if "drain" in slurm.node_state(name):
            slurm.run("scontrol", "update", f"nodename={name}", "state=resume")
    return rig


def inject(lab: LabFleet, node: str, *args: str) -> None:
    result = CliRunner().invoke(app, ["lab", "inject", node, "--dir", str(lab.dir), *args])
    assert result.exit_code == 0, result.output


def cli(rig: Rig, state: Path, *args: str) -> Result:
    _, _, inventory = rig

    def transport() -> SshTransport:
        return SshTransport(own_known_hosts=state / "kh", system_known_hosts=())

    ctx = AppContext(transport_factory=transport, env={**os.environ, "USER": "alice"})  # type: ignore[arg-type]
    argv = ["-i", str(inventory), "--state-dir", str(state / "state"), *args]
    return CliRunner().invoke(app, argv, obj=ctx)


def reason(slurm: SlurmCluster, node: str) -> tuple[str, str]:
    """`sinfo -R`'s state and reason of `node` (empty: Slurm holds no reason)."""
    out = slurm.run("sinfo", "-R", "-h", "-N", "-n", node, "-o", "%T|%E").strip()
    state, _, why = out.partition("|")
    return state, why


def test_an_ecc_error_drains_the_node_in_slurm_with_gpuctls_reason_and_uncordon_resumes_it(
    clean: Rig, tmp_path: Path
) -> None:
    lab, slurm, _ = clean
    sick = lab.names[1]
    inject(lab, sick, "--gpu", "1", "--ecc-uncorrected", "2")

    result = cli(clean, tmp_path, "reconcile", "-o", "json")
    assert result.exit_code == 0, result.output

    state, why = reason(slurm, sick)
    assert state == "drained"
    assert why.startswith("gpuctl: "), why
    assert "ecc" in why.lower(), why
    assert reason(slurm, lab.names[0]) == ("", "")  # the healthy node is left alone

    inject(lab, sick, "--clear")
    result = cli(clean, tmp_path, "uncordon", sick, "--yes")
    assert result.exit_code == 0, result.output
    assert slurm.node_state(sick).rstrip("*") == "idle"  # (*: a ping overdue on a busy host)
    assert reason(slurm, sick) == ("", "")


def test_an_operators_own_slurm_drain_is_never_resumed_by_gpuctl(
    clean: Rig, tmp_path: Path
) -> None:
    lab, slurm, _ = clean
    node = lab.names[0]
    result = cli(clean, tmp_path, "cordon", node, "--reason", "disk check", "--yes")
    assert result.exit_code == 0, result.output
    assert reason(slurm, node) == ("drained", "gpuctl: disk check")

    # an operator drains it in Slurm for a reason of their own, over gpuctl's
    slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=bad fan")
    result = cli(clean, tmp_path, "uncordon", node, "--yes")
    assert result.exit_code == 3, result.output
    assert "drained in Slurm by someone else" in result.stderr
    assert "bad fan" in result.stderr
    assert reason(slurm, node) == ("drained", "bad fan")  # still the operator's drain
    listed = cli(clean, tmp_path, "nodes", "list", "-o", "json")
    rows = {n["name"]: n for n in json.loads(listed.stdout)["nodes"]}
    assert rows[node]["state"] == "cordoned"  # gpuctl's cordon stays too: nothing changed

    # a cordon over the operator's drain leaves the operator's reason in Slurm
    result = cli(clean, tmp_path, "cordon", node, "--reason", "again", "--yes")
    assert result.exit_code == 0, result.output
    assert reason(slurm, node) == ("drained", "bad fan")
