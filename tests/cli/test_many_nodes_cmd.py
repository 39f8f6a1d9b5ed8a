"""`cordon`, `uncordon`, `drain` and `nodes list` over several nodes: hostlist ranges and label
selectors, one plan and one question for the lot, node lists folded, each node's outcome in
`-o json`. Nodes are local shells (the lab's node tools, no sshd) running real job processes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.config.inventory import load_inventory
from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.jobs.model import IncarnationState
from gpuctl.ops import jobs as service
from gpuctl.testing.fakes import ShellTransport, shell_fleet

NODES = ("gpu01", "gpu02", "gpu03")
POOLS = {"gpu01": "train", "gpu02": "train", "gpu03": "infer"}
PATIENT = "trap '' USR1; trap 'exit 0' TERM; while :; do sleep 0.2; done"
Fleet = tuple[Path, ShellTransport]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    inventory, transport = shell_fleet(tmp_path, NODES)
    text = inventory.read_text()
    for node, pool in POOLS.items():
        text = text.replace(f"name: {node},", f"name: {node}, labels: {{pool: {pool}}},")
    inventory.write_text(text)
    yield inventory, transport
    state = tmp_path / "state"
    if (state / "state.db").exists():
        specs = load_inventory(inventory).by_name()
        with open_store(state, write=False) as store:
            for inc in store.incarnations():
                SshJobRunner(transport).signal(specs[inc.node], inc.job_id, inc.n, "KILL")


def gpuctl(fleet: Fleet, state: Path, *args: str, answer: str = "") -> Result:
    inventory, transport = fleet
    ctx = AppContext(transport_factory=lambda: transport, env={**os.environ, "USER": "alice"})
    argv = ["-i", str(inventory), "--state-dir", str(state), *args]
    return CliRunner().invoke(app, argv, obj=ctx, input=answer)


def test_cordon_of_a_range_asks_once_and_folds_the_nodes(fleet: Fleet, tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = gpuctl(fleet, state, "cordon", "gpu[01-03]", "--reason", "psu swap", answer="y\n")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("[y/N]") == 1
    assert "cordon gpu[01-03] (3 nodes; no new work lands there" in result.stderr
    assert result.stdout == "gpu[01-03] cordoned by alice: psu swap\n"
    with open_store(state, write=False) as store:
        assert sorted(c.node for c in store.cordons()) == list(NODES)
    lifted = gpuctl(fleet, state, "uncordon", "gpu01", "gpu03", "--yes", "-o", "json")
    assert lifted.exit_code == 0, lifted.output
    doc = json.loads(lifted.stdout)
    assert doc["complete"] is True
    assert [(n["node"], n["outcome"]) for n in doc["nodes"]] == [
        ("gpu01", "uncordoned"),
        ("gpu03", "uncordoned"),
    ]
    with open_store(state, write=False) as store:
        assert [c.node for c in store.cordons()] == ["gpu02"]


def test_a_label_selector_picks_the_nodes_and_json_lists_each(fleet: Fleet, tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = gpuctl(fleet, state, "cordon", "-l", "pool=train", "--reason", "r", "-y", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(n["node"], n["outcome"], n["ok"]) for n in doc["nodes"]] == [
        ("gpu01", "cordoned", True),
        ("gpu02", "cordoned", True),
    ]
    listed = gpuctl(fleet, state, "nodes", "list", "-l", "pool!=train", "-o", "json")
    assert listed.exit_code == 0, listed.output
    assert [n["name"] for n in json.loads(listed.stdout)["nodes"]] == ["gpu03"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-l", "pool=none"), "error: no node of the inventory matches -l pool=none\n"),
        (("gpu[07-09]",), "error: no node of the inventory matches gpu[07-09]\n"),
        ((), "error: name the nodes: NODE..., a range such as gpu[01-04], or -l key=value\n"),
    ],
)
def test_a_selector_matching_no_node_is_one_line_and_exit_2(
    fleet: Fleet, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = gpuctl(fleet, tmp_path / "state", "drain", *args, "--reason", "r", "--yes")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0] + "\n" == message
    assert "Traceback" not in result.output and result.stdout == ""


def test_a_drain_of_two_nodes_is_one_plan_and_never_moves_a_job_onto_the_other(
    fleet: Fleet, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    for i in range(2):
        spec = tmp_path / f"job{i}.yaml"
        spec.write_text(
            f"name: patient{i}\ncommand: [sh, -c, {json.dumps(PATIENT)}]\n"
            "resources: {gpus: 1, mem_per_gpu: whole}\n"
        )
        with open_store(state, write=True) as store:
            service.submit(store, load_specs([spec]), actor="test", clock=SystemClock())
    assert gpuctl(fleet, state, "reconcile").exit_code == 0
    with open_store(state, write=False) as store:
        holding = {i.node for i in store.incarnations()}
    # keep the last free node by name: a plan ignoring the other drained node would pick that one
    keep = max(set(NODES) - holding)
    drained = sorted(set(NODES) - {keep})
    args = ["drain", *drained, "--reason", "rack move", "--grace", "5", "--checkpoint-wait", "0.2"]
    planned = json.loads(gpuctl(fleet, state, *args, "--dry-run", "-o", "json").stdout)
    assert [p["node"] for p in planned["plans"]] == drained
    assert {m["to_node"] for p in planned["plans"] for m in p["moves"]} == {keep}
    result = gpuctl(fleet, state, *args, "-o", "json", answer="y\n")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("[y/N]") == 1
    doc = json.loads(result.stdout)
    assert (doc["complete"], doc["moved"], doc["jobs"]) == (True, 2, 2)
    assert [n["node"] for n in doc["nodes"]] == drained
    assert all(n["outcome"] == "drained" for n in doc["nodes"])
    with open_store(state, write=False) as store:
        assert sorted(c.node for c in store.cordons()) == drained
        live = [i for i in store.incarnations() if i.state is IncarnationState.RUNNING]
    assert [i.node for i in live] == [keep, keep]
