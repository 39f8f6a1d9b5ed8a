"""The lab fleet as operators and tests use it: up, kill, revive, freeze, inject, down."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuctl.adapters.ssh import SshTransport
from gpuctl.cli.main import app
from gpuctl.config.inventory import load_inventory
from gpuctl.errors import ConnectRefused, LabError
from gpuctl.lab import fleet
from gpuctl.lab.sshd import generate_ed25519
from gpuctl.testing.lab import LabFleet, lab_fleet
from tests.e2e.faults import refuses

pytestmark = pytest.mark.e2e

QUERY = "nvidia-smi --query-gpu=index,temperature.gpu --format=csv,noheader,nounits"


def test_up_writes_an_inventory_and_known_hosts_that_work_with_strict_checking(
    lab: LabFleet, tmp_path: Path
) -> None:
    inventory = load_inventory(lab.lab.inventory_path)
    assert [n.name for n in inventory.nodes] == ["lab-01", "lab-02", "lab-03"]
    first = inventory.nodes[0]
    assert (first.host, first.port, first.user) == (
        "127.0.0.1",
        lab.lab.nodes[0].port,
        "gpuctl-lab",
    )
    assert first.key_file == str(lab.lab.key_path)
    assert first.known_hosts == (str(lab.lab.known_hosts_path),)
    assert first.expected_gpus == 4
    assert dict(first.labels) == {"lab": "true"}
    assert stat.S_IMODE(lab.lab.key_path.stat().st_mode) == 0o600
    lines = lab.lab.known_hosts_path.read_text().splitlines()
    for node, line in zip(lab.lab.nodes, lines, strict=True):
        public = lab.host_key_public(node.name).read_text().split()[:2]
        assert line == f"[127.0.0.1]:{node.port} {public[0]} {public[1]}"
    # only the lab's own files: nothing from this machine's ~/.ssh
    with SshTransport(own_known_hosts=tmp_path / "none", system_known_hosts=()) as transport:
        for spec in inventory.nodes:
            result = transport.run(spec, 'printf %s "$GPUCTL_LAB_NODE"', timeout_s=10)
            assert result.stdout == spec.name.encode()


def test_each_node_answers_nvidia_smi_from_its_own_state(lab: LabFleet) -> None:
    with SshTransport(own_known_hosts=Path("/nonexistent"), system_known_hosts=()) as transport:
        result = transport.run(lab.spec("lab-02"), QUERY, timeout_s=10)
    assert result.exit_code == 0, result.stderr
    assert [line.split(",")[0] for line in result.stdout.decode().splitlines()] == [
        "0",
        "1",
        "2",
        "3",
    ]


def test_kill_takes_the_node_and_its_processes_down_and_revive_brings_it_back(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    spec = own_lab.spec("lab-01")
    with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
        transport.run(spec, "setsid sleep 600 </dev/null >/dev/null 2>&1 &", timeout_s=10)
        node_pids = own_lab.processes("lab-01")
        assert len(node_pids) >= 3  # the listener, the session's sshd, the detached job

        own_lab.kill("lab-01")
        assert refuses(spec.host, spec.port)
        assert not any(_alive(p) for p in node_pids)
        assert own_lab.processes("lab-02")  # the other node lives on
        with pytest.raises(ConnectRefused):
            transport.run(spec, "true", timeout_s=5)
        assert [s.running for s in fleet.status(own_lab.dir)] == [False, True]

        own_lab.revive("lab-01")
        assert own_lab.lab.node("lab-01").port == spec.port
        # same host key: the known_hosts written by `up` still verifies it
        assert transport.run(spec, "echo back", timeout_s=10).stdout == b"back\n"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_inject_changes_what_the_node_reports(own_lab: LabFleet) -> None:
    spec = own_lab.spec("lab-02")
    with SshTransport(own_known_hosts=Path("/nonexistent"), system_known_hosts=()) as transport:
        own_lab.inject("lab-02", gpu=1, temp_c=97)
        hot = transport.run(spec, QUERY, timeout_s=10).stdout.decode().splitlines()
        assert hot[1].replace(" ", "") == "1,97"
        own_lab.inject("lab-02", missing=True)
        missing = transport.run(spec, QUERY, timeout_s=10)
        assert missing.exit_code != 0
        own_lab.inject("lab-02", clear=True)
        cleared = transport.run(spec, QUERY, timeout_s=10).stdout.decode().splitlines()
        assert cleared[1].replace(" ", "") != "1,97"


def test_freeze_and_thaw_show_in_the_node_list(own_lab: LabFleet) -> None:
    own_lab.freeze("lab-01")
    assert [(s.running, s.frozen) for s in fleet.status(own_lab.dir)] == [
        (True, True),
        (True, False),
    ]
    own_lab.thaw("lab-01")
    assert [s.frozen for s in fleet.status(own_lab.dir)] == [False, False]


def test_down_stops_every_sshd_and_node_process_and_can_be_repeated(tmp_path: Path) -> None:
    with lab_fleet(nodes=2, gpus=1) as lab:
        with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
            for spec in lab.specs():
                transport.run(spec, "setsid sleep 600 </dev/null >/dev/null 2>&1 &", timeout_s=10)
            started = lab.processes()
            assert len(started) >= 6  # per node: listener, session sshd(s), the detached job
            assert fleet.down(lab.dir) >= len(started)
        assert not any(_alive(p) for p in started)
        assert lab.processes() == set()
        assert fleet.down(lab.dir) == 0
        assert [s.running for s in fleet.status(lab.dir)] == [False, False]


def test_up_refuses_a_folder_where_a_lab_already_runs(lab: LabFleet) -> None:
    with pytest.raises(LabError, match="a lab is already running here"):
        fleet.up(lab.dir, nodes=1)


def test_up_refuses_a_folder_the_lab_user_cannot_enter() -> None:
    parent = Path(tempfile.mkdtemp(prefix="gpuctl-closed-", dir="/tmp"))
    try:
        parent.chmod(0o700)
        with pytest.raises(LabError, match=r"cannot enter .*gpuctl-closed-.* \(mode 700\)"):
            fleet.up(parent / "lab", nodes=1)
        assert not (parent / "lab" / "lab.json").exists()
    finally:
        shutil.rmtree(parent)


def test_the_lab_commands_from_the_command_line() -> None:
    lab_dir = Path(tempfile.mkdtemp(prefix="gpuctl-lab-cli-", dir="/tmp"))
    lab_dir.chmod(0o755)
    runner = CliRunner()
    try:
        up = runner.invoke(app, ["lab", "up", "--nodes", "2", "--gpus", "2", "--dir", str(lab_dir)])
        assert up.exit_code == 0, up.stderr
        assert [line.split("\t")[0] for line in up.stdout.splitlines()] == ["lab-01", "lab-02"]
        assert f"gpuctl -i {lab_dir / 'inventory.yaml'} status" in up.stderr

        killed = runner.invoke(app, ["lab", "kill", "lab-02", "--dir", str(lab_dir)])
        assert killed.exit_code == 0
        listed = runner.invoke(app, ["lab", "list", "--dir", str(lab_dir)])
        assert [line.split("\t")[2] for line in listed.stdout.splitlines()[1:]] == ["up", "down"]
        unknown = runner.invoke(app, ["lab", "revive", "lab-09", "--dir", str(lab_dir)])
        assert unknown.exit_code == 1
        assert "no node 'lab-09' (nodes: lab-01, lab-02)" in unknown.stderr

        down = runner.invoke(app, ["lab", "down", "--dir", str(lab_dir)])
        assert down.exit_code == 0
        assert "stopped" in down.stderr
    finally:
        fleet.down(lab_dir)
        shutil.rmtree(lab_dir)


def gpuctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line in its own process (its logging set-up and error boundary)."""
    code = "from gpuctl.cli.main import run; run()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_status_works_at_once_on_a_new_lab(lab: LabFleet, tmp_path: Path) -> None:
    isolated = {"HOME": str(tmp_path), "GPUCTL_STATE_DIR": str(tmp_path / "state")}
    result = gpuctl("-i", str(lab.lab.inventory_path), "status", "-o", "json", env=isolated)
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["nodes"]
    assert [(n["name"], n["reach"], n["state"]) for n in nodes] == [
        ("lab-01", "ok", "ready"),
        ("lab-02", "ok", "ready"),
        ("lab-03", "ok", "ready"),
    ]


def test_status_gives_each_broken_node_its_own_outcome_without_a_traceback(
    tmp_path: Path,
) -> None:
    with lab_fleet(nodes=5, gpus=1) as lab:
        generate_ed25519(lab.dir / "wrong_key", "not-authorized")
        inventory = lab.dir / "broken.yaml"
        extra = {
            "lab-04": ", key_file: wrong_key",  # a key the node does not accept
            "lab-05": ", known_hosts: []",  # a host key recorded nowhere
        }
        lines = [
            "defaults:",
            f"  user: {lab.lab.user}",
            "  key_file: id_ed25519",
            "  known_hosts: [known_hosts]",
            "  connect_timeout_s: 1",
            "  command_timeout_s: 5",
            "nodes:",
        ]
        for node in lab.lab.nodes:
            lines.append(
                f"  - {{name: {node.name}, host: {node.host}, port: {node.port}"
                f"{extra.get(node.name, '')}}}"
            )
        inventory.write_text("\n".join(lines) + "\n")
        lab.kill("lab-02")
        lab.freeze("lab-03")
        isolated = {"HOME": str(tmp_path), "GPUCTL_STATE_DIR": str(tmp_path / "state")}
        start = time.monotonic()
        result = gpuctl("-i", str(inventory), "status", "-o", "json", env=isolated)
        elapsed = time.monotonic() - start
        lab.thaw("lab-03")
    assert result.returncode == 5, result.stderr  # lab-05's unknown host key: an operator decides
    assert "Traceback" not in result.stderr + result.stdout
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    assert {name: n["reach"] for name, n in nodes.items()} == {
        "lab-01": "ok",
        "lab-02": "refused",
        "lab-03": "timeout",
        "lab-04": "auth_failed",
        "lab-05": "host_key",
    }
    assert "connection refused" in nodes["lab-02"]["error"]
    assert "timeout (connect)" in nodes["lab-03"]["error"]
    assert "authentication failed" in nodes["lab-04"]["error"]
    assert "host key unknown: ssh-ed25519 SHA256:" in nodes["lab-05"]["error"]
    assert elapsed < 8  # the frozen node costs one connect deadline, not the whole scan


def test_up_under_a_strict_umask_still_gives_the_lab_user_what_it_needs(tmp_path: Path) -> None:
    lab_dir = Path(tempfile.mkdtemp(prefix="gpuctl-lab-umask-", dir="/tmp"))
    lab_dir.chmod(0o755)
    code = "import os; os.umask(0o077); from gpuctl.cli.main import run; run()"
    try:
        argv = ["lab", "up", "--nodes", "1", "--gpus", "1", "--dir", str(lab_dir)]
        up = subprocess.run(
            [sys.executable, "-c", code, *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert up.returncode == 0, up.stderr
        node = fleet.load(lab_dir).nodes[0]
        spec = load_inventory(lab_dir / "inventory.yaml").nodes[0]
        assert spec.port == node.port
        with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
            result = transport.run(spec, QUERY, timeout_s=10)
        assert (result.exit_code, result.stdout.decode().split(",")[0]) == (0, "0"), result.stderr
    finally:
        fleet.down(lab_dir)
        shutil.rmtree(lab_dir)
