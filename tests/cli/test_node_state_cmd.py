"""Node states as an operator reads them after a cordon, a drain or a health cordon: `gpuctl
status`, `nodes list`, `nodes show` and their `-o json` say cordoned or draining with the reason,
who and when, as the dashboard does; `nodes list --state` shows the nodes in those states.
Nodes are local shells (the lab's node tools, no sshd) running real job processes."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from gpuctl.adapters.store import open_store
from gpuctl.core.jobs.model import Cordon, Event
from gpuctl.lab import nodestate
from gpuctl.testing.fakes import ShellTransport, shell_fleet
from tests.cli.test_nodeops_cmd import NODES, gpuctl, running, stop_all

Fleet = tuple[Path, ShellTransport]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    inventory, transport = shell_fleet(tmp_path, NODES)
    yield inventory, transport
    stop_all(tmp_path / "state", inventory, transport)


def rows(stdout: str) -> dict[str, str]:
    """Table rows by node name."""
    return {line.split()[0]: line for line in stdout.splitlines() if line.startswith("gpu0")}


def listed(fleet: Fleet, state: Path, *args: str) -> dict[str, dict[str, Any]]:
    result = gpuctl(fleet, state, *args, "-o", "json")
    assert result.exit_code == 0, result.output
    return {n["name"]: n for n in json.loads(result.stdout)["nodes"]}


def test_a_drained_node_is_cordoned_in_status_nodes_list_show_and_their_json(
    fleet: Fleet, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    running(fleet, state, tmp_path)
    with open_store(state, write=False) as store:
        (inc,) = store.incarnations()
    drained, other = inc.node, next(n for n in NODES if n != inc.node)
    args = ["drain", drained, "--reason", "bios update", "--grace", "5", "--checkpoint-wait", "0.2"]
    done = gpuctl(fleet, state, *args, "--yes")
    assert f"{drained}: 1 of 1 job(s) moved; cordoned" in done.stdout, done.output

    for command in (["status"], ["nodes", "list"]):
        result = gpuctl(fleet, state, *command)
        assert result.exit_code == 0, result.output
        row, rest = rows(result.stdout)[drained], rows(result.stdout)[other]
        assert row.split()[1] == "cordoned" and rest.split()[1] == "ready"
        assert "cordoned by alice " in row and row.endswith(": bios update")
        nodes = listed(fleet, state, *command)
        assert nodes[other]["state"] == "ready" and nodes[other]["state_reason"] is None
        doc = nodes[drained]
        assert (doc["state"], doc["state_reason"], doc["state_by"], doc["state_source"]) == (
            "cordoned",
            "bios update",
            "alice",
            "operator",
        )
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["state_since"])
        assert doc["reach"] == "ok"

    shown = gpuctl(fleet, state, "nodes", "show", drained)
    assert shown.exit_code == 0, shown.output
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert "state cordoned (ok)" in lines and "reason bios update" in lines
    assert "by alice (operator)" in lines
    doc = json.loads(gpuctl(fleet, state, "nodes", "show", drained, "-o", "json").stdout)
    assert (doc["state"], doc["state_by"]) == ("cordoned", "alice")


def test_a_node_whose_drain_left_a_job_behind_is_draining(fleet: Fleet, tmp_path: Path) -> None:
    state = tmp_path / "state"
    running(fleet, state, tmp_path, n=3)  # three whole cards of four: one can move, one stays
    with open_store(state, write=False) as store:
        full = next(n for n in NODES if len(store.incarnations(node=n, holding=True)) == 2)
    args = ["drain", full, "--reason", "r", "--grace", "5", "--checkpoint-wait", "0.2"]
    assert gpuctl(fleet, state, *args, "--yes").exit_code == 3  # a job left behind
    assert listed(fleet, state, "status")[full]["state"] == "draining"
    result = gpuctl(fleet, state, "nodes", "list", "--state", "draining")
    assert result.exit_code == 0, result.output
    assert list(rows(result.stdout)) == [full]
    assert rows(result.stdout)[full].split()[1] == "draining"


def test_a_node_the_control_loop_cordoned_for_health_says_so(fleet: Fleet, tmp_path: Path) -> None:
    _, transport = fleet
    state = tmp_path / "state"
    nodestate.inject(Path(transport.envs["gpu02"]["GPUCTL_LAB_STATE"]), gpu=1, ecc_uncorrected=3)
    assert gpuctl(fleet, state, "reconcile").exit_code == 0
    doc = listed(fleet, state, "status")["gpu02"]
    assert (doc["state"], doc["state_by"], doc["state_source"]) == ("cordoned", "gpuctl", "health")
    assert "ECC" in doc["state_reason"]
    row = rows(gpuctl(fleet, state, "nodes", "list").stdout)["gpu02"]
    assert row.split()[1] == "cordoned" and "cordoned by gpuctl (health) " in row


def test_a_cordon_says_since_when_in_local_time_with_its_zone_and_how_long_ago(
    fleet: Fleet, tmp_path: Path, in_india: ZoneInfo
) -> None:
    state = tmp_path / "state"
    at = float(int(time.time()) - 248)  # 4m08s before the commands below
    with open_store(state, write=True) as store:
        cordon = Cordon("gpu01", "maintenance", "bob", "operator", at)
        store.cordon(cordon, Event(at, "bob", "cordon", "cordoned: maintenance", None, "gpu01"))
    local = dt.datetime.fromtimestamp(at, in_india).strftime("%Y-%m-%d %H:%M:%S +05:30")
    ago = r"4m(0[89]|[1-5]\d)s ago"  # as long as the commands take, under a minute

    shown = gpuctl(fleet, state, "nodes", "show", "gpu01")
    assert shown.exit_code == 0, shown.output
    assert re.search(rf"^since +{re.escape(local)} \({ago}\)$", shown.stdout, re.M), shown.stdout
    row = rows(gpuctl(fleet, state, "nodes", "list").stdout)["gpu01"]
    assert re.search(rf"cordoned by bob {ago}: maintenance$", row), row
    doc = json.loads(gpuctl(fleet, state, "nodes", "show", "gpu01", "-o", "json").stdout)
    utc = dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (doc["state"], doc["state_since"], doc["taken_at"][-1]) == ("cordoned", utc, "Z")


def test_nodes_list_state_shows_only_the_nodes_in_those_states(
    fleet: Fleet, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    done = gpuctl(fleet, state, "cordon", "gpu01", "--reason", "fan noise", "--yes")
    assert done.exit_code == 0, done.output
    cordoned = gpuctl(fleet, state, "nodes", "list", "--state", "cordoned")
    assert cordoned.exit_code == 0, cordoned.output
    assert list(rows(cordoned.stdout)) == ["gpu01"]
    assert list(listed(fleet, state, "nodes", "list", "--state", "ready,down")) == ["gpu02"]
    assert list(listed(fleet, state, "nodes", "list", "-t", "cordoned", "-t", "ready")) == [
        "gpu01",
        "gpu02",
    ]
    bad = gpuctl(fleet, state, "nodes", "list", "--state", "sick")
    assert bad.exit_code == 2 and bad.stdout == ""
    assert "--state: unknown node state 'sick'" in bad.stderr
    assert "ready, cordoned, draining, down, unknown" in bad.stderr


def test_without_a_store_nodes_are_ready_and_a_broken_one_is_said_on_stderr(
    fleet: Fleet, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    assert {n["state"] for n in listed(fleet, state, "nodes", "list").values()} == {"ready"}
    assert not (state / "state.db").exists()  # read-only: nothing created
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "state.db").write_bytes(b"not a database" * 100)
    result = gpuctl(fleet, broken, "nodes", "list")
    assert result.exit_code == 0, result.output
    assert "warning: cordons unavailable: " in result.stderr
    assert [r.split()[1] for r in rows(result.stdout).values()] == ["ready", "ready"]
