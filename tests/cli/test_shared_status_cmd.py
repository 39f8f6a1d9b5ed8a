"""`gpuctl status` reads the fleet the control loop published into the store while it is fresh,
saying how old it is, and polls the nodes only with --live or when none is fresh."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.core.model import FleetSnapshot, NodeSnapshot, NodeState, Reach
from gpuctl.core.shared import PublishedFleet, encode
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.fakes import FakeTransport

NODES = ("gpu01", "gpu02", "gpu03")
NOW = 1_800_000_000.0


def _setup(tmp_path: Path, age_s: float) -> tuple[Path, Path]:
    tmp_path.mkdir(exist_ok=True)
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        "nodes:\n"
        + "".join(
            f"  - {{name: {n}, host: 127.0.0.1, port: {2201 + i}}}\n" for i, n in enumerate(NODES)
        )
    )
    state = tmp_path / "state"
    at = NOW - age_s
    seen = FleetSnapshot(
        at, tuple(NodeSnapshot(n, Reach.OK, NodeState.READY, taken_at=at) for n in NODES)
    )
    with open_store(state, write=True) as store:
        store.publish_snapshot(PublishedFleet(at, at, "gpuctl", 5.0, 3, encode(seen)))
    return inventory, state


def _status(inventory: Path, state: Path, transport: FakeTransport, *args: str) -> Result:
    ctx = AppContext(
        transport_factory=lambda: transport, env={"USER": "alice"}, clock=ManualClock(NOW)
    )
    return CliRunner().invoke(
        app, ["-i", str(inventory), "--state-dir", str(state), "status", *args], obj=ctx
    )


def test_status_shows_the_controller_s_fresh_poll_and_asks_no_node(tmp_path: Path) -> None:
    inventory, state = _setup(tmp_path, age_s=4.0)
    transport = FakeTransport({})
    result = _status(inventory, state, transport, "-o", "json")
    assert result.exit_code == 0, result.output
    assert transport.calls == []
    assert [n["name"] for n in json.loads(result.stdout)["nodes"]] == list(NODES)
    assert "fleet as the controller saw it 4s ago (--live polls the nodes)" in result.stderr


def test_status_live_or_a_stale_poll_asks_the_nodes(tmp_path: Path) -> None:
    inventory, state = _setup(tmp_path, age_s=4.0)
    transport = FakeTransport({})
    live = _status(inventory, state, transport, "--live")
    assert {name for name, _ in transport.calls} == set(NODES)
    assert "controller saw it" not in live.stderr
    stale_inventory, stale_state = _setup(tmp_path / "stale", age_s=60.0)
    stale = FakeTransport({})
    result = _status(stale_inventory, stale_state, stale)
    assert {name for name, _ in stale.calls} == set(NODES)
    assert "controller saw it" not in result.stderr
