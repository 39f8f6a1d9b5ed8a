"""`gpuctl consolidate`: the plan document on a saved snapshot and a store, the table, --for,
--apply (asks, window, stale plan, migrations), and exit codes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.config.jobspec import spec_from_data
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import Cordon, Event, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.model import (
    FleetSnapshot,
    GpuProcess,
    GpuSnapshot,
    NodeFacts,
    NodeSnapshot,
    NodeState,
    Observation,
    Reach,
    fleet_to_dict,
)
from gpuctl.ops.parts import FleetLink
from gpuctl.testing.drainkit import Kit
from gpuctl.testing.fakes import FakeTransport

GIB = 1024
CARD = 80 * GIB


def _snapshot(used: dict[str, list[int]]) -> FleetSnapshot:
    nodes = []
    for name, per_card in used.items():
        gpus = tuple(
            GpuSnapshot(
                index=i,
                uuid=f"GPU-{name}-{i}",
                model="NVIDIA H100 80GB HBM3",
                mem_total_mib=CARD,
                mem_used_mib=u,
            )
            for i, u in enumerate(per_card)
        )
        obs = Observation(gpus=gpus, facts=NodeFacts(hostname=name, cpu_count=32))
        nodes.append(NodeSnapshot(name, Reach.OK, NodeState.READY, observation=obs))
    return FleetSnapshot(taken_at=1.0, nodes=tuple(nodes))


def _run_job(store: Any, name: str, node: str, card: int, *, started: float, **spec: Any) -> None:
    body = {"name": name, "command": ["python", "t.py"], "resources": {"mem_per_gpu": "20GiB"}}
    body.update(spec)
    job = Job(
        id=f"{name}-000001",
        name=name,
        spec=spec_from_data(body),
        state=JobState.QUEUED,
        priority=0,
        tier="standard",
        submitted_at=started - 10,
    )
    store.add_job(job, Event(started - 10, "t", "submit", "submit", job.id))
    inc = Incarnation(
        job.id, 1, node, (card,), (f"GPU-{node}-{card}",), 20 * GIB, False,
        IncarnationState.LAUNCHING, started, f".gpuctl/runs/{job.id}/1",
    )  # fmt: skip
    event = Event(started, "gpuctl", "launch", "launch", job.id, node)
    store.begin_launch(inc, capacity_mib={(node, card): CARD}, event=event)
    store.update_incarnation(job.id, 1, state=IncarnationState.RUNNING, pid=42)


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[Path, Path]:
    """Two nodes with one 20 GiB job each (started two hours ago): a saved snapshot, a store."""
    snap = tmp_path / "fleet.json"
    snap.write_text(json.dumps(fleet_to_dict(_snapshot({"gpu-01": [0, 0], "gpu-02": [0, 0]}))))
    state = tmp_path / "state"
    store = open_store(state, write=True)
    started = time.time() - 7200
    _run_job(store, "a", "gpu-01", 0, started=started)
    _run_job(store, "b", "gpu-02", 1, started=started, disruptible=False)
    store.close()
    return snap, state


def _invoke(state: Path, *args: str, obj: AppContext | None = None, **kw: Any) -> Any:
    return CliRunner().invoke(
        app, ["--state-dir", str(state), "consolidate", *args], obj=obj or AppContext(), **kw
    )


def test_the_plan_document_says_what_moves_what_it_frees_and_what_it_costs(
    fleet: tuple[Path, Path],
) -> None:
    snap, state = fleet
    result = _invoke(state, "--snapshot", str(snap), "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["kind"] == "consolidation-plan" and len(doc["version"]) == 16
    (move,) = doc["moves"]
    assert move["job"] == "a-000001"  # b is not disruptible
    assert (move["from"], move["to"]) == (
        {"node": "gpu-01", "cards": [0]},
        {"node": "gpu-02", "cards": [1]},
    )
    assert move["mib_per_card"] == 20 * GIB and move["checkpoint_age_s"] is None
    assert doc["before"]["whole_free_nodes"] == 0 and doc["after"]["whole_free_nodes"] == 1
    assert doc["frees"]["whole_cards"] == 1 and doc["frees"]["whole_nodes"] == 1
    assert doc["after"]["stranded_gib"] < doc["before"]["stranded_gib"]
    assert doc["cost"] == {"moves": 1, "max_checkpoint_age_s": None, "moves_without_checkpoint": 1}
    assert doc["pinned"] == [{"job": "b-000001", "node": "gpu-02", "reason": "disruptible: false"}]
    assert doc["target"] is None
    assert result.stderr == ""


def test_the_table_shows_the_moves_and_the_figures(fleet: tuple[Path, Path]) -> None:
    snap, state = fleet
    result = _invoke(state, "--snapshot", str(snap))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("consolidation plan · fleet version ")
    assert lines[1].split() == ["JOB", "TIER", "FROM", "TO", "MEM/CARD", "CHECKPOINT", "AGE"]
    assert lines[2].split()[:3] == ["a-000001", "standard", "gpu-01"]
    assert any(line.split()[:5] == ["whole", "free", "nodes", "0", "1"] for line in lines)
    assert "not moved: b-000001: disruptible: false" in result.stdout


def test_for_a_job_makes_room_with_the_fewest_moves_or_exits_3(
    fleet: tuple[Path, Path], tmp_path: Path
) -> None:
    snap, state = fleet
    two = tmp_path / "two.yaml"
    two.write_text("name: big\nresources: {gpus: 2, mem_per_gpu: whole}\n")
    result = _invoke(state, "--snapshot", str(snap), "--for", str(two), "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["target"]["fits"] and doc["target"]["node"] == "gpu-01"
    assert [m["job"] for m in doc["moves"]] == ["a-000001"]
    four = tmp_path / "four.yaml"
    four.write_text("name: huge\nresources: {gpus: 4}\n")
    result = _invoke(state, "--snapshot", str(snap), "--for", str(four), "-o", "json")
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    assert not doc["target"]["fits"] and doc["moves"] == []
    assert "2 node(s): too few usable cards" in doc["target"]["reason"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-moves", "-1"], "error: --max-moves must be 0 or more and --parallel 1 or more"),
        (["--window", "25:00-01:00"], "error: --window: cannot read '25:00-01:00'"),
        (["--apply"], "error: --apply works on the live fleet, not on a --snapshot"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    fleet: tuple[Path, Path], args: list[str], message: str
) -> None:
    snap, state = fleet
    result = _invoke(state, "--snapshot", str(snap), *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0] == message
    assert result.stdout == ""


def test_apply_dry_run_shows_the_plan_and_changes_nothing(fleet: tuple[Path, Path]) -> None:
    snap, state = fleet
    result = _invoke(state, "--snapshot", str(snap), "--apply", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "a-000001" in result.stdout
    assert result.stderr.startswith("dry run: nothing changed")


# --- --apply on a scripted fleet -------------------------------------------------------------


@pytest.fixture
def kit(tmp_path: Path) -> Kit:
    """Jobs a (n1) and b (n2) running apart for an hour; `gpuctl consolidate --apply` drives
    them through the kit's control loop."""
    store = open_store(tmp_path / "state", write=True)
    k = Kit.make(store, ("n1", "n2"), health=AutoDrainPolicy(enabled=False))
    for name, node, other in (("a", "n1", "n2"), ("b", "n2", "n1")):
        store.cordon(Cordon(other, "t", "t", "operator", 0.0), Event(0.0, "t", "cordon", "c"))
        k.submit(name)
        k.step()
        store.uncordon(other, Event(0.0, "t", "uncordon", "u"))
        assert k.inc(k.store.jobs()[-1].id).node == node
    k.clock.advance(3600)
    (tmp_path / "fleet.yaml").write_text(
        "nodes:\n  - {name: n1, host: 127.0.0.1, port: 2201}\n"
        "  - {name: n2, host: 127.0.0.1, port: 2202}\n"
    )
    return k


def _apply(kit: Kit, *args: str, **kw: Any) -> Any:
    """`gpuctl consolidate --apply` over the kit: its store's folder, its nodes as the inventory,
    its clock (a wait moves it on) and its scripted fleet and job runner."""
    state: Path = kit.store.state_dir  # type: ignore[attr-defined]
    ctx = AppContext(
        clock=kit.clock,
        transport_factory=lambda: FakeTransport({}),
        fleet_link=lambda transport, clock: FleetLink(kit.fleet, kit.runner, transport),
    )
    inventory = str(state.parent / "fleet.yaml")
    argv = ["-i", inventory, "--state-dir", str(state), "consolidate", "--apply", *args]
    return CliRunner().invoke(app, argv, obj=ctx, **kw)


def _at_local(kit: Kit, hour: int, minute: int) -> None:
    """The kit's clock moved on to the next `hour:minute` local time."""
    now = time.localtime(kit.clock.now())
    to = (hour * 60 + minute - (now.tm_hour * 60 + now.tm_min)) % (24 * 60)
    kit.clock.advance(to * 60 - now.tm_sec)


def test_apply_asks_and_a_no_changes_nothing(kit: Kit) -> None:
    result = _apply(kit, input="n\n")
    assert result.exit_code == 1, result.output
    assert "move 1 job(s) as planned? [y/N]" in result.stderr
    assert "nothing changed" in result.stderr
    assert all(i.n == 1 for j in kit.store.jobs() for i in kit.store.incarnations(j.id))


def test_apply_yes_moves_the_job_and_reports_each_move(kit: Kit) -> None:
    result = _apply(kit, "--yes", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["complete"] and doc["moved"] == 1
    (r,) = doc["results"]
    assert r["outcome"] == "moved"
    move = doc["plan"]["moves"][0]
    assert (r["to_node"], r["to_cards"]) == (move["to"]["node"], move["to"]["cards"])
    assert kit.inc(r["job"]).node == move["to"]["node"]
    assert "consolidation plan" in result.stderr  # the plan went to stderr: stdout is JSON


def test_apply_outside_the_window_refuses_with_exit_1(kit: Kit) -> None:
    _at_local(kit, 12, 0)
    result = _apply(kit, "--yes", "--window", "22:00-04:00")
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-2] == (
        "error: outside the maintenance window 22:00-04:00 (local time now 12:00): nothing applied"
    )
    assert all(i.n == 1 for j in kit.store.jobs() for i in kit.store.incarnations(j.id))


def test_apply_refuses_a_plan_the_fleet_moved_away_from(kit: Kit) -> None:
    polls = kit.fleet.polls

    def ghost_appears() -> None:
        if kit.fleet.polls > polls:  # after the plan's gather: someone else's process
            kit.cluster.node("n1").ghosts[:] = [GpuProcess(7, "GPU-n1-1", 4096)]

    kit.fleet.before_poll = ghost_appears
    result = _apply(kit, "--yes")
    assert result.exit_code == 1, result.output
    assert "error: stale plan: recompute" in result.stderr
    assert "hint: run `gpuctl consolidate` again" in result.stderr


def test_apply_without_an_answer_or_yes_is_a_usage_error_and_moves_nothing(kit: Kit) -> None:
    result = _apply(kit)  # no terminal: stdin at its end
    assert result.exit_code == 2, result.output
    assert "move 1 job(s) as planned? [y/N]" in result.stderr
    assert result.stderr.endswith(
        "error: no answer (no terminal): nothing changed\n"
        "hint: pass --yes to apply without a terminal\n"
    )
    assert all(i.n == 1 for j in kit.store.jobs() for i in kit.store.incarnations(j.id))
