"""The lab's switches for the fault tests: sshd killed while the node's jobs run on, and a
network partition (the node in its own network namespace, its link down), from the command line
as an operator uses them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuctl.adapters.ssh import SshTransport
from gpuctl.cli.main import app
from gpuctl.errors import ConnectRefused, TransportError
from gpuctl.lab import fleet, netns
from gpuctl.lab.sshd import alive
from gpuctl.testing.lab import LabFleet, lab_fleet

pytestmark = pytest.mark.e2e


def states(runner: CliRunner, lab_dir: Path) -> dict[str, str]:
    listed = runner.invoke(app, ["lab", "list", "--dir", str(lab_dir), "-o", "json"])
    assert listed.exit_code == 0, listed.stderr
    return {n["name"]: n["state"] for n in json.loads(listed.stdout)["nodes"]}


def test_kill_sshd_only_leaves_the_node_s_jobs_running(own_lab: LabFleet, tmp_path: Path) -> None:
    spec = own_lab.spec("lab-01")
    runner = CliRunner()
    with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
        transport.run(spec, "setsid -f sleep 600 </dev/null >/dev/null 2>&1", timeout_s=10)
        sshd_pid = own_lab.lab.node("lab-01").pid
        assert sshd_pid is not None
        before = own_lab.processes("lab-01")

        killed = runner.invoke(
            app, ["lab", "kill", "lab-01", "--sshd-only", "--dir", str(own_lab.dir)]
        )
        assert killed.exit_code == 0, killed.stderr
        assert "its jobs run on" in killed.stderr
        assert not alive(sshd_pid)
        survivors = {p for p in before if alive(p)}
        assert survivors and survivors == own_lab.processes("lab-01")  # the detached sleep
        with pytest.raises(ConnectRefused):
            transport.run(spec, "true", timeout_s=5)
        assert states(runner, own_lab.dir)["lab-01"] == "down"

        own_lab.revive("lab-01")
        assert transport.run(spec, "echo back", timeout_s=10).stdout == b"back\n"
        assert survivors <= own_lab.processes("lab-01")


def test_a_partitioned_node_does_not_answer_until_healed_and_down_removes_its_namespaces(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    with lab_fleet(nodes=2, gpus=1) as lab:
        spec = lab.spec("lab-02", connect_timeout_s=1.0)
        lab_dir = str(lab.dir)
        with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
            assert transport.run(spec, "echo before", timeout_s=10).stdout == b"before\n"
            cut = runner.invoke(app, ["lab", "partition", "lab-02", "--dir", lab_dir])
            assert cut.exit_code == 0, cut.stderr
            assert states(runner, lab.dir) == {"lab-01": "up", "lab-02": "partitioned"}
            node = fleet.load(lab.dir).node("lab-02")
            assert node.netns is not None and node.relay_pid is not None

            began = time.monotonic()
            with pytest.raises(TransportError):
                transport.run(spec, "echo during", timeout_s=2)
            assert time.monotonic() - began < 8  # within gpuctl's own deadlines, not a hang
            assert transport.run(lab.spec("lab-01"), "true", timeout_s=10).exit_code == 0

            healed = runner.invoke(app, ["lab", "heal", "lab-02", "--dir", lab_dir])
            assert healed.exit_code == 0, healed.stderr
            assert states(runner, lab.dir)["lab-02"] == "up"
            assert transport.run(spec, "echo after", timeout_s=10).stdout == b"after\n"

        down = runner.invoke(app, ["lab", "down", "--dir", lab_dir])
        assert down.exit_code == 0, down.stderr
        assert not any(netns.exists(ns) for ns in netns.names(lab.dir, "lab-02"))
        assert not alive(node.relay_pid)


def test_a_job_on_another_lab_s_node_of_the_same_name_is_not_seen_on_this_one(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    """Two labs at once (two test runs, a demo beside the tests) both have a lab-01: GPU work on
    one must not show as ghost memory on the other."""
    query = "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
    start = "CUDA_VISIBLE_DEVICES=0 setsid -f sleep 600 </dev/null >/dev/null 2>&1"
    with (
        lab_fleet(nodes=1, gpus=2) as other,
        SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport,
    ):
        transport.run(other.spec("lab-01"), start, timeout_s=10)
        there = transport.run(other.spec("lab-01"), query, timeout_s=10).stdout.decode()
        here = transport.run(own_lab.spec("lab-01"), query, timeout_s=10).stdout.decode()
        assert there.strip() and not here.strip(), (there, here)
