"""`gpuctl health`: Nagios exit codes, the JSON document, the table, bad rules files."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.errors import ConnectRefused
from gpuctl.lab import node_tools, nodestate
from gpuctl.ops.health import HISTORY_FILE
from gpuctl.testing.fakes import FakeTransport, ShellTransport

NODES = ("gpu01", "gpu02", "gpu03")


class Fleet:
    """Three simulated nodes of two GPUs answering through the local shell (no sshd)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        node_tools.install_node_tools(root / "bin", python="/usr/bin/python3")
        self.envs: dict[str, dict[str, str]] = {}
        for i, name in enumerate(NODES):
            state = root / name / "state.json"
            state.parent.mkdir()
            nodestate.write_state(
                state,
                nodestate.new_node_state(
                    name, gpus=2, model="NVIDIA H100 80GB HBM3", mem_gib=80, node_index=i
                ),
            )
            self.envs[name] = {
                "PATH": f"{root / 'bin'}:/usr/bin:/bin",
                "GPUCTL_LAB_STATE": str(state),
                "GPUCTL_LAB_NODE": name,
            }
        self.inventory = root / "fleet.yaml"
        self.inventory.write_text(
            "nodes:\n"
            + "".join(
                f"  - {{name: {n}, host: 127.0.0.1, port: {2201 + i}, gpus: 2}}\n"
                for i, n in enumerate(NODES)
            )
        )
        self.down: dict[str, Exception] = {}

    def inject(self, name: str, **faults: Any) -> None:
        nodestate.inject(Path(self.envs[name]["GPUCTL_LAB_STATE"]), **faults)

    def transport(self) -> FakeTransport:
        shell = ShellTransport(self.envs)
        answer = lambda n, c: shell.run(n, c, timeout_s=20)  # noqa: E731
        return FakeTransport({name: self.down.get(name, answer) for name in NODES})

    def health(self, *args: str) -> Any:
        ctx = AppContext(transport_factory=self.transport)  # type: ignore[arg-type]
        argv = ["-i", str(self.inventory), "--state-dir", str(self.root / "state"), "health"]
        return CliRunner().invoke(app, [*argv, *args], obj=ctx)


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet(tmp_path)


def test_a_healthy_fleet_exits_0_with_one_row_per_node(fleet: Fleet) -> None:
    result = fleet.health()
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NODE", "VERDICT", "SEVERITY", "ACTION", "GPU", "REASON"]
    assert [line.split() for line in lines[1:]] == [
        [name, "healthy", "ok", "none", "-", "-"] for name in NODES
    ]
    assert result.stderr == "health: 3 node(s), 3 healthy; exit 0 (ok)\n"
    assert (fleet.root / "state" / HISTORY_FILE).is_file()


def test_uncorrectable_ecc_is_critical_exit_2_with_the_documented_json(fleet: Fleet) -> None:
    fleet.inject("gpu02", gpu=1, ecc_uncorrected=3)
    result = fleet.health("-o", "json")
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert (doc["severity"], doc["exit_code"], doc["rules"], doc["samples"]) == (
        "critical",
        2,
        "built-in",
        1,
    )
    assert doc["summary"] == {
        "nodes": 3,
        "healthy": 2,
        "degraded": 0,
        "unhealthy": 1,
        "unknown": 0,
    }
    node = doc["nodes"][1]
    assert {k: node[k] for k in ("name", "verdict", "severity", "action", "alert")} == {
        "name": "gpu02",
        "verdict": "unhealthy",
        "severity": "critical",
        "action": "drain",
        "alert": True,
    }
    reason = {
        "rule": "ecc_uncorrected",
        "gpu": 1,
        "text": "3 volatile uncorrectable ECC error(s) (more than 0)",
        "severity": "critical",
        "action": "drain",
    }
    assert node["reasons"] == [reason]
    assert [(g["index"], g["verdict"], g["reasons"]) for g in node["gpus"]] == [
        (0, "healthy", []),
        (1, "unhealthy", [reason]),
    ]
    assert node["gpus"][1]["uuid"] == nodestate.fake_uuid("gpu02", 1)


def test_a_heat_spike_warns_with_exit_1(fleet: Fleet) -> None:
    fleet.inject("gpu03", gpu=0, temp_c=95)
    result = fleet.health("gpu03")
    assert result.exit_code == 1, result.output
    rows = [line.split(None, 5) for line in result.stdout.splitlines()[1:]]
    assert rows[0][:5] == ["gpu03", "degraded", "warn", "alert", "0"]
    assert "95 C, at or above 85 C in this sample only (a spike)" in result.stdout
    assert "software thermal slowdown" in result.stdout  # the fake driver throttles at 85 C
    assert len(rows) == 2  # spike and slowdown of GPU 0; gpu01 and gpu02 were not asked


def test_sustained_heat_over_several_samples_drains_with_exit_2(
    fleet: Fleet, tmp_path: Path
) -> None:
    rules = tmp_path / "quick.yaml"
    rules.write_text("thresholds:\n  temperature:\n    sustained_window_s: 0.2\n")
    fleet.inject("gpu01", gpu=1, temp_c=95)
    result = fleet.health(
        "gpu01", "--samples", "3", "--interval", "0.1", "--rules", str(rules), "-o", "json"
    )
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["rules"] == f"built-in + {rules}"
    rules_fired = [(r["rule"], r["gpu"], r["action"]) for r in doc["nodes"][0]["reasons"]]
    assert ("temp_sustained", 1, "drain") in rules_fired


def test_unreadable_or_silent_nodes_are_unknown_with_exit_3(fleet: Fleet) -> None:
    fleet.inject("gpu01", garbage=True)
    fleet.down["gpu03"] = ConnectRefused("gpu03 (127.0.0.1:2203): connection refused")
    result = fleet.health("-o", "json")
    assert result.exit_code == 3, result.output
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    assert (nodes["gpu01"]["verdict"], nodes["gpu01"]["action"]) == ("unknown", "cordon")
    assert nodes["gpu01"]["reasons"][0]["rule"] == "unreadable"
    assert (nodes["gpu03"]["verdict"], nodes["gpu03"]["action"]) == ("unknown", "none")
    assert "connection refused" in nodes["gpu03"]["reasons"][0]["text"]
    assert nodes["gpu02"]["verdict"] == "healthy"


def test_the_summary_names_the_nodes_that_are_not_healthy_as_one_hostlist(fleet: Fleet) -> None:
    fleet.inject("gpu01", garbage=True)
    fleet.down["gpu03"] = ConnectRefused("gpu03 (127.0.0.1:2203): connection refused")
    result = fleet.health()
    assert result.exit_code == 3, result.output
    summary = "health: 3 node(s), 1 healthy, 2 unknown (gpu[01,03]); exit 3 (unknown)\n"
    assert result.stderr == summary


def test_critical_outranks_unknown_and_unknown_outranks_warn(fleet: Fleet) -> None:
    fleet.inject("gpu01", garbage=True)
    fleet.inject("gpu02", gpu=0, temp_c=95)
    assert fleet.health().exit_code == 3
    fleet.inject("gpu03", xid=79)
    assert fleet.health().exit_code == 2


def test_an_application_xid_keeps_the_node_ok_but_says_why(fleet: Fleet) -> None:
    fleet.inject("gpu02", gpu=0, xid=13)
    result = fleet.health("gpu02", "-o", "wide")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].split()[-1] == "RULE"
    assert "blamed on the job" in result.stdout
    assert result.stdout.splitlines()[1].split()[-1] == "xid_application"


def test_yaml_is_the_same_document_as_json(fleet: Fleet) -> None:
    fleet.inject("gpu02", gpu=0, xid=43)
    as_yaml = yaml.safe_load(fleet.health("-o", "yaml").stdout)
    as_json = json.loads(fleet.health("-o", "json").stdout)
    for doc in (as_yaml, as_json):
        for node in doc["nodes"]:
            node.pop("taken_at")
    assert as_yaml == as_json


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "thresholds:\n  temprature: {limit_c: 80}\n",
            "rules.yaml:2: thresholds.temprature: unknown key 'temprature'\n"
            "hint: did you mean 'temperature'?\n",
        ),
        (
            "xid_classes:\n  application: {xids: [13, 79]}\n",
            "rules.yaml:2: xid_classes.application.xids[1]: XID 79 is also in the class "
            "'hardware'\n",
        ),
    ],
)
def test_a_bad_rules_file_exits_2_naming_the_line_and_polls_nothing(
    fleet: Fleet, tmp_path: Path, text: str, error: str
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    transport = fleet.transport()
    fleet.transport = lambda: transport  # type: ignore[method-assign]
    result = fleet.health("--rules", str(rules))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {tmp_path}/{error.splitlines()[0]}")
    assert result.stderr.endswith(error.split("\n", 1)[1] or "\n")
    assert "Traceback" not in result.output
    assert transport.calls == []


def test_an_unknown_node_name_is_a_usage_error(fleet: Fleet) -> None:
    result = fleet.health("gpu09")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: unknown node 'gpu09'")
