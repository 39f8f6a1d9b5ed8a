"""Each example playbook (`playbooks/*.yaml`) run with `gpuctl playbook run` against a lab fleet of
real sshd with real job processes, and the state it leaves: the jobs, the cordons, the nodes, the
events. Small labs (two nodes of two cards), short graces; the night window is overridden with
`--window always`; node-maintenance names a lab node instead of `gpu01`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.protocols import Store
from gpuctl.adapters.ssh import SshTransport
from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.core.jobs.model import IncarnationState, Job, JobState
from gpuctl.core.model import Inventory
from gpuctl.testing.lab import LabFleet

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "playbooks"
# checkpoints nothing on SIGUSR1, exits 0 on SIGTERM: a migration is a clean restart
PATIENT = "trap '' USR1; trap 'exit 0' TERM; while :; do sleep 0.2; done"


class Fleet:
    """A lab fleet, its state folder, and gpuctl's CLI over an SSH transport."""

    def __init__(self, lab: LabFleet, tmp: Path) -> None:
        self.lab, self.tmp = lab, tmp
        self.state = tmp / "state"
        self.inventory = Inventory(nodes=lab.specs())

    def cli(self, *args: str) -> Result:
        def transport() -> SshTransport:
            return SshTransport(own_known_hosts=self.tmp / "kh", system_known_hosts=())

        ctx = AppContext(transport_factory=transport, env={**os.environ, "USER": "alice"})  # type: ignore[arg-type]
        argv = ["-i", str(self.lab.lab.inventory_path), "--state-dir", str(self.state), *args]
        return CliRunner().invoke(app, argv, obj=ctx)

    def playbook(self, name: str, *args: str) -> tuple[Result, dict[str, Any]]:
        result = self.cli(
            "playbook", "run", str(EXAMPLES / f"{name}.yaml"), "--yes", "-o", "json", *args
        )
        assert result.exit_code in (0, 1), result.output
        return result, json.loads(result.stdout)

    def submit(
        self, name: str, resources: str, *, tier: str = "standard", priority: int = 0
    ) -> str:
        spec = self.tmp / f"{name}.yaml"
        spec.write_text(
            f'name: {name}\ncommand: [bash, -c, "{PATIENT}"]\nresources: {resources}\n'
            f"tier: {tier}\npriority: {priority}\ngrace_s: 2\nmin_runtime_between_moves: 0\n"
        )
        result = self.cli("submit", str(spec), "-o", "json")
        assert result.exit_code == 0, result.output
        job_id: str = json.loads(result.stdout)[0]["id"]
        return job_id

    def reconcile(self, passes: int = 1) -> None:
        for _ in range(passes):
            result = self.cli("reconcile")
            assert result.exit_code == 0, result.output

    def store(self) -> Store:
        return open_store(self.state, write=False)

    def job(self, ref: str) -> Job:
        with self.store() as store:
            found = store.job(ref)
        assert found is not None
        return found

    def running_on(self, job_id: str) -> tuple[int, str, tuple[int, ...]]:
        with self.store() as store:
            incs = [i for i in store.incarnations(job_id) if i.state is IncarnationState.RUNNING]
        assert len(incs) == 1, incs
        return incs[0].n, incs[0].node, incs[0].cards

    def cordons(self) -> dict[str, str]:
        with self.store() as store:
            return {c.node: c.reason for c in store.cordons()}

    def events(self, kind: str) -> list[Any]:
        with self.store() as store:
            return store.events(kinds=[kind])

    def stop(self) -> None:
        if not (self.state / "state.db").exists():
            return
        with SshTransport(own_known_hosts=self.tmp / "kh", system_known_hosts=()) as transport:
            runner = SshJobRunner(transport)
            specs = self.inventory.by_name()
            with self.store() as store:
                for inc in store.incarnations():
                    try:
                        runner.signal(specs[inc.node], inc.job_id, inc.n, "KILL")
                    except Exception:  # a node that is gone has nothing left to stop
                        continue


@pytest.fixture
def fleet(own_lab: LabFleet, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(own_lab, tmp_path)
    try:
        yield made
    finally:
        made.stop()


def steps(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["title"]: s for s in doc["steps"]}


def test_nightly_consolidation_pairs_slices_on_fewer_cards_when_fragmented(fleet: Fleet) -> None:
    jobs = [fleet.submit(name, "{gpus: 1, mem_per_gpu: 32GiB}") for name in "abcd"]
    fleet.reconcile()
    cards = {fleet.running_on(j)[1:] for j in jobs}
    assert len(cards) == 4, cards  # placed one per card: every card partly used
    result, doc = fleet.playbook("nightly-consolidation", "--window", "always")
    assert result.exit_code == 0 and doc["outcome"] == "ok", doc
    by_step = steps(doc)
    consolidate = by_step["consolidate when fragmented"]
    assert consolidate["outcome"] == "changed", consolidate
    assert consolidate["message"].startswith("2 of 2 move(s) done; fragmentation ")
    after = {j: fleet.running_on(j) for j in jobs}
    assert len({place[1:] for place in after.values()}) == 2, after  # two cards free now
    assert sorted(n for n, _, _ in after.values()) == [1, 1, 2, 2]  # two jobs moved
    before_pct, after_pct = (
        by_step[t]["data"]["numbers"]["fragmentation_pct"]
        for t in ("numbers before", "numbers after")
    )
    assert before_pct > 20 and after_pct < before_pct
    assert fleet.cordons() == {}
    (moved,) = [e for e in fleet.events("playbook.step") if e.data["step"]["kind"] == "consolidate"]
    assert (moved.outcome, moved.actor) == ("changed", "alice")


def test_the_night_window_keeps_nightly_consolidation_from_running_by_day(fleet: Fleet) -> None:
    result, doc = fleet.playbook("nightly-consolidation", "--window", "00:00-00:01")
    assert result.exit_code == 0 and doc["outcome"] == "outside_window"
    assert doc["message"] == "outside the window 00:00-00:01: nothing done"
    assert fleet.events("playbook.start") == []


def test_health_sweep_drains_the_unhealthy_node_and_reports(fleet: Fleet) -> None:
    job = fleet.submit("train", "{gpus: 1, mem_per_gpu: whole}")
    fleet.reconcile()
    _, sick, _ = fleet.running_on(job)
    healthy = next(n for n in fleet.lab.names if n != sick)
    fleet.lab.inject(sick, gpu=0, ecc_uncorrected=2)
    result, doc = fleet.playbook("health-sweep")
    assert result.exit_code == 0 and doc["outcome"] == "ok", doc
    by_step = steps(doc)
    verdicts = {n["node"]: n["message"].split(":")[0] for n in by_step["judge every node"]["nodes"]}
    assert verdicts == {sick: "unhealthy", healthy: "healthy"}
    drained = {n["node"]: n["outcome"] for n in by_step["drain the unhealthy"]["nodes"]}
    assert drained == {sick: "changed", healthy: "skipped"}
    assert fleet.cordons() == {sick: "health sweep: unhealthy"}
    n, node, _ = fleet.running_on(job)
    assert (n, node) == (2, healthy)
    report = by_step["report"]["data"]
    assert report["numbers"]["nodes_cordoned"] == 1
    assert {x["node"]: x["state"] for x in report["nodes"]} == {sick: "cordoned", healthy: "ready"}


def test_node_maintenance_drains_runs_the_privileged_command_checks_health_and_uncordons(
    fleet: Fleet,
) -> None:
    job = fleet.submit("serve", "{gpus: 1, mem_per_gpu: whole}")
    fleet.reconcile()
    _, node, _ = fleet.running_on(job)
    other = next(n for n in fleet.lab.names if n != node)
    log = fleet.lab.dir / "privileged.log"
    bin_dir = fleet.lab.lab.node_dir(node) / "bin"  # first on the node's PATH
    stub = '#!/bin/sh\necho "{name} $*" >> {log}\n'
    (bin_dir / "sudo").write_text(
        stub.format(name="sudo", log=log) + '[ "$1" = -n ] && shift\nexec "$@"\n'
    )
    (bin_dir / "systemctl").write_text(stub.format(name="systemctl", log=log))
    for tool in ("sudo", "systemctl"):
        (bin_dir / tool).chmod(0o755)
    log.touch(mode=0o666)
    log.chmod(0o666)
    playbook = fleet.tmp / "node-maintenance.yaml"
    playbook.write_text((EXAMPLES / "node-maintenance.yaml").read_text().replace("gpu01", node))
    result = fleet.cli("playbook", "run", str(playbook), "--yes", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [s["outcome"] for s in doc["steps"]] == ["changed", "changed", "ok", "changed", "ok"]
    assert log.read_text().splitlines() == [
        "sudo -n systemctl restart nvidia-persistenced",
        "systemctl restart nvidia-persistenced",
    ]
    n, now_on, _ = fleet.running_on(job)
    assert (n, now_on) == (2, other)
    assert fleet.cordons() == {}  # back in service
    (drain,) = fleet.events("drain")
    assert (drain.node, drain.actor) == (node, "alice")
    kinds = [e.data["step"]["kind"] for e in fleet.events("playbook.step")]
    assert kinds == ["drain", "run", "health", "uncordon", "assert"]


def test_spot_rebalance_admits_spot_work_under_the_band_and_stops_it_over_the_band(
    fleet: Fleet,
) -> None:
    result, doc = fleet.playbook("spot-rebalance")
    assert result.exit_code == 0 and [s["outcome"] for s in doc["steps"]] == [
        "skipped",
        "changed",
        "changed",
        "ok",
    ]
    filler = fleet.job("spot-filler")
    assert filler.tier == "spot" and filler.state is JobState.RUNNING
    standard = [fleet.submit(f"train{i}", "{gpus: 1, mem_per_gpu: whole}") for i in range(2)]
    spot = [
        fleet.submit(f"sweep{i}", "{gpus: 1, mem_per_gpu: 32GiB}", tier="spot", priority=p)
        for i, p in enumerate((-5, 0, 0))
    ]
    fleet.reconcile()
    assert {fleet.job(j).state for j in (*standard, *spot)} == {JobState.RUNNING}
    result, doc = fleet.playbook("spot-rebalance")  # 85.2 % of 4 x 81,559 MiB: over the band
    assert result.exit_code == 0, doc
    cancel, submit, _, _ = doc["steps"]
    assert cancel["outcome"] == "changed", cancel
    assert cancel["data"]["jobs"] == [filler.id, spot[0]]  # the lowest priority, down to 80 %
    assert submit["outcome"] == "skipped"
    fleet.reconcile()
    assert fleet.job(filler.id).state is JobState.CANCELLED
    assert fleet.job(spot[0]).state is JobState.CANCELLED
    assert {fleet.job(j).state for j in (*standard, *spot[1:])} == {JobState.RUNNING}
    _, doc = fleet.playbook("fleet-report")
    assert (
        60 <= steps(doc)["the numbers and every node"]["data"]["numbers"]["utilization_pct"] <= 80
    )


def test_fleet_report_flags_the_node_that_needs_a_person_and_changes_nothing(
    fleet: Fleet,
) -> None:
    broken, fine = fleet.lab.names
    fleet.lab.inject(broken, garbage=True)
    result, doc = fleet.playbook("fleet-report")
    assert result.exit_code == 0 and doc["outcome"] == "ok", doc
    assert doc["failed_nodes"] == [broken]
    flagged = {n["node"]: n for n in steps(doc)["nodes that need a person"]["nodes"]}
    assert flagged[broken]["outcome"] == "failed"
    assert flagged[broken]["message"].startswith("needs a person: node.health in")
    assert flagged[fine]["outcome"] == "ok"
    assert steps(doc)["failover can land"]["outcome"] == "ok"
    assert fleet.cordons() == {}
    with fleet.store() as store:
        assert store.jobs() == [] and store.reservations() == []
        kinds = {e.kind for e in store.events()}
    assert kinds == {"playbook.start", "playbook.step", "playbook.end"}
