"""`gpuctl dash` without a terminal: `--once` (and any non-TTY stdout) prints the numbers and the
fleet table; bad options are usage errors; textual is never imported for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.errors import ConnectRefused
from gpuctl.lab import node_tools, nodestate
from gpuctl.testing.fakes import FakeTransport, ShellTransport

SNAPSHOT = Path(__file__).parents[1] / "fixtures" / "snapshots" / "fleet-5-nodes.json"


def test_once_on_a_saved_snapshot_prints_the_numbers_then_the_fleet(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["--state-dir", str(tmp_path), "dash", "--snapshot", str(SNAPSHOT), "--once"]
    )
    assert result.exit_code == 3, result.output  # gpu-04 did not answer
    lines = result.stdout.splitlines()
    assert lines[0] == "gpuctl dash · snapshot fleet-5-nodes.json · 5 node(s)"
    assert lines[2].startswith("UTILIZATION         0% allocated idle silicon, < 50%")
    assert [line.split()[0] for line in lines[2:8]] == [
        "UTILIZATION",
        "FRAGMENTATION",
        "QUEUE",
        "CHECKPOINT",
        "FAILOVER",
        "PREEMPTIONS",
    ]
    table = lines[9:15]
    assert table[0].split()[:3] == ["NODE", "STATE", "GPUS"]
    assert table[2].startswith("gpu-02  ready")
    assert table[4].startswith("gpu-04  down (timeout)")
    assert "critical gpu-04 timeout: timed out after 5.0 s connecting" in result.stdout
    assert not (tmp_path / "state.db").exists()  # read-only: nothing created


@pytest.fixture
def node_env(tmp_path: Path) -> dict[str, str]:
    state = tmp_path / "node.json"
    nodestate.write_state(
        state,
        nodestate.new_node_state(
            "gpu01", gpus=2, model="NVIDIA H100 80GB HBM3", mem_gib=80, node_index=0
        ),
    )
    node_tools.install_node_tools(tmp_path / "bin", python="/usr/bin/python3")
    return {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "GPUCTL_LAB_STATE": str(state),
        "GPUCTL_LAB_NODE": "gpu01",
    }


def test_a_live_fleet_without_a_terminal_prints_the_same_text(
    tmp_path: Path, node_env: dict[str, str]
) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        "nodes:\n"
        "  - {name: gpu01, host: 127.0.0.1, port: 2201, gpus: 2}\n"
        "  - {name: gpu02, host: 127.0.0.1, port: 2202}\n"
    )
    shell = ShellTransport({"gpu01": node_env})
    transport = FakeTransport(
        {
            "gpu01": lambda n, c: shell.run(n, c, timeout_s=10),
            "gpu02": ConnectRefused("connection refused"),
        }
    )
    ctx = AppContext(transport_factory=lambda: transport)  # type: ignore[arg-type,return-value]
    result = CliRunner().invoke(
        app,
        ["-i", str(inventory), "--state-dir", str(tmp_path / "state"), "dash", "--refresh", "5"],
        obj=ctx,
    )  # CliRunner's stdout is no terminal: the text, not the UI
    assert result.exit_code == 3, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("gpu0")}
    assert rows["gpu01"].split()[1:3] == ["ready", "2/2"]
    assert rows["gpu02"].split()[1:3] == ["down", "(refused)"]
    assert f"live {inventory}" in result.stdout.splitlines()[0]


def test_a_refresh_below_one_second_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["--state-dir", str(tmp_path), "dash", "--snapshot", str(SNAPSHOT), "--refresh", "0.5"]
    )
    assert result.exit_code == 2
    assert "--refresh" in result.output


def test_a_snapshot_that_is_not_one_is_an_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = CliRunner().invoke(
        app, ["--state-dir", str(tmp_path), "dash", "--snapshot", str(bad), "--once"]
    )
    assert result.exit_code == 2
    assert f"{bad}: not a fleet snapshot" in result.stderr


def test_the_capture_in_the_docs_is_what_once_prints(tmp_path: Path) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "dash.md").read_text(encoding="utf-8")
    command = "$ gpuctl dash --snapshot tests/fixtures/snapshots/fleet-5-nodes.json --once\n"
    shown = docs[docs.index(command) + len(command) :].split("```", 1)[0]
    result = CliRunner().invoke(
        app, ["--state-dir", str(tmp_path), "dash", "--snapshot", str(SNAPSHOT), "--once"]
    )
    assert result.stdout == shown


def test_once_never_imports_textual(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gpuctl.cli.main import app\n"
        f"sys.argv = ['gpuctl', '--state-dir', {str(tmp_path)!r}, 'dash', '--snapshot',"
        f" {str(SNAPSHOT)!r}, '--once']\n"
        "try:\n"
        "    app()\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write('textual loaded' if 'textual' in sys.modules else 'no textual')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.endswith("no textual"), out.stderr
    assert "FAILOVER OK" in out.stdout
