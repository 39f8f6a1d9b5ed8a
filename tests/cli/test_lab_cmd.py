"""`gpuctl lab ...` as an operator sees it, without starting any sshd."""

import json
import shutil
import tempfile
from pathlib import Path

from typer.testing import CliRunner

from gpuctl.cli.main import app


def test_lab_up_without_openssh_server_says_how_to_install_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-sshd"
    result = CliRunner().invoke(
        app, ["lab", "up", "--nodes", "2", "--dir", str(tmp_path / "lab"), "--sshd", str(missing)]
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"OpenSSH server not found ({missing})" in result.stderr
    assert "apt-get install -y openssh-server" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "lab").exists()


def test_lab_sshd_path_can_come_from_the_environment(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["lab", "up", "--dir", str(tmp_path / "lab")],
        env={"GPUCTL_SSHD": "/nonexistent/sshd"},
    )
    assert result.exit_code == 1
    assert "OpenSSH server not found (/nonexistent/sshd)" in result.stderr


def test_lab_down_in_an_empty_folder_is_a_no_op(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["lab", "down", "--dir", str(tmp_path)])
    assert result.exit_code == 0
    assert "stopped 0 process(es)" in result.stderr


def test_lab_kill_of_an_unknown_folder_points_at_lab_up(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["lab", "kill", "lab-01", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no lab here" in result.stderr
    assert "gpuctl lab up --dir" in result.stderr


def test_lab_inject_without_a_fault_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["lab", "inject", "lab-01", "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "nothing to inject" in result.stderr


def test_lab_up_that_cannot_start_sshd_fails_cleanly_and_leaves_nothing_running() -> None:
    lab_dir = Path(tempfile.mkdtemp(prefix="gpuctl-lab-fail-", dir="/tmp"))
    lab_dir.chmod(0o755)
    try:
        result = CliRunner().invoke(
            app, ["lab", "up", "--nodes", "2", "--dir", str(lab_dir), "--sshd", "/bin/false"]
        )
        assert result.exit_code == 1
        assert "lab-01: sshd did not start: sshd exited" in result.stderr
        assert "Traceback" not in result.stderr
        record = json.loads((lab_dir / "lab.json").read_text())
        assert [n["pid"] for n in record["nodes"]] == [None, None]
    finally:
        shutil.rmtree(lab_dir)
