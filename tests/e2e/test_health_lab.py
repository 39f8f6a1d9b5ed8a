"""`gpuctl health` against a lab fleet of real sshd: faults injected the way an operator would."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuctl.adapters.ssh import SshTransport
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.testing.lab import LabFleet, lab_fleet

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def health_lab() -> Iterator[LabFleet]:
    """Two nodes of two GPUs, for this module only (its tests inject faults)."""
    with lab_fleet(nodes=2, gpus=2) as fleet:
        yield fleet


@pytest.fixture
def lab(health_lab: LabFleet) -> LabFleet:
    for name in health_lab.names:
        inject(health_lab, name, "--clear")
    return health_lab


def inject(lab: LabFleet, node: str, *args: str) -> None:
    result = CliRunner().invoke(app, ["lab", "inject", node, "--dir", str(lab.dir), *args])
    assert result.exit_code == 0, result.output


def health(lab: LabFleet, state: Path, *args: str) -> Any:
    def transport() -> SshTransport:
        return SshTransport(own_known_hosts=state / "known_hosts", system_known_hosts=())

    ctx = AppContext(transport_factory=transport)  # type: ignore[arg-type]
    argv = ["-i", str(lab.lab.inventory_path), "--state-dir", str(state), "health", *args]
    return CliRunner().invoke(app, argv, obj=ctx)


def node_doc(result: Any, name: str) -> dict[str, Any]:
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    return nodes[name]


def test_a_clean_lab_is_healthy_with_exit_0(lab: LabFleet, tmp_path: Path) -> None:
    result = health(lab, tmp_path, "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(n["name"], n["verdict"], n["action"]) for n in doc["nodes"]] == [
        ("lab-01", "healthy", "none"),
        ("lab-02", "healthy", "none"),
    ]


def test_injected_uncorrectable_ecc_is_critical_and_drains(lab: LabFleet, tmp_path: Path) -> None:
    inject(lab, "lab-02", "--gpu", "1", "--ecc-uncorrected", "2")
    env = {"HOME": str(tmp_path), "GPUCTL_STATE_DIR": str(tmp_path / "state")}
    code = "from gpuctl.cli.main import run; run()"
    done = subprocess.run(
        [sys.executable, "-c", code, "-i", str(lab.lab.inventory_path), "health", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )
    assert done.returncode == 2, done.stderr
    nodes = {n["name"]: n for n in json.loads(done.stdout)["nodes"]}
    assert nodes["lab-01"]["verdict"] == "healthy"
    bad = nodes["lab-02"]
    assert (bad["verdict"], bad["severity"], bad["action"]) == ("unhealthy", "critical", "drain")
    assert [(r["rule"], r["gpu"]) for r in bad["reasons"]] == [("ecc_uncorrected", 1)]
    assert done.stderr.endswith("exit 2 (critical)\n")


def test_xid_79_drains_the_node(lab: LabFleet, tmp_path: Path) -> None:
    inject(lab, "lab-01", "--gpu", "0", "--xid", "79")
    result = health(lab, tmp_path, "-o", "json")
    assert result.exit_code == 2, result.output
    node = node_doc(result, "lab-01")
    assert (node["verdict"], node["action"]) == ("unhealthy", "drain")
    [reason] = node["reasons"]
    assert (reason["rule"], reason["gpu"]) == ("xid_hardware", 0)
    assert "GPU has fallen off the bus" in reason["text"]


def test_xid_13_blames_the_job_and_leaves_the_node_ok(lab: LabFleet, tmp_path: Path) -> None:
    inject(lab, "lab-01", "--gpu", "1", "--xid", "13")
    result = health(lab, tmp_path, "-o", "json")
    assert result.exit_code == 0, result.output
    node = node_doc(result, "lab-01")
    assert (node["verdict"], node["severity"], node["action"]) == ("healthy", "ok", "none")
    [reason] = node["reasons"]
    assert (reason["rule"], reason["gpu"]) == ("xid_application", 1)
    assert "blamed on the job" in reason["text"]


def test_garbage_from_nvidia_smi_is_unknown_and_cordons(lab: LabFleet, tmp_path: Path) -> None:
    inject(lab, "lab-02", "--garbage")
    result = health(lab, tmp_path, "-o", "json")
    assert result.exit_code == 3, result.output
    node = node_doc(result, "lab-02")
    assert (node["verdict"], node["severity"], node["action"]) == ("unknown", "unknown", "cordon")
    assert [r["rule"] for r in node["reasons"]] == ["unreadable"]
    assert "\x1b" not in result.stdout
    assert node_doc(result, "lab-01")["verdict"] == "healthy"


def test_heat_once_warns_and_heat_over_several_samples_drains(
    lab: LabFleet, tmp_path: Path
) -> None:
    inject(lab, "lab-01", "--gpu", "0", "--temp", "95")
    once = health(lab, tmp_path / "once", "lab-01", "-o", "json")
    assert once.exit_code == 1, once.output
    node = node_doc(once, "lab-01")
    assert (node["verdict"], node["action"]) == ("degraded", "alert")
    assert node["reasons"][0]["rule"] == "temp_spike"

    quick = tmp_path / "quick-rules.yaml"  # the 60 s window shortened to keep the test short
    quick.write_text("thresholds:\n  temperature:\n    sustained_window_s: 1\n")
    args = ["lab-01", "--samples", "3", "--interval", "0.5", "--rules", str(quick), "-o", "json"]
    sustained = health(lab, tmp_path / "sustained", *args)
    assert sustained.exit_code == 2, sustained.output
    node = node_doc(sustained, "lab-01")
    assert (node["verdict"], node["action"]) == ("unhealthy", "drain")
    assert node["reasons"][0]["rule"] == "temp_sustained"
    assert node["reasons"][0]["gpu"] == 0
