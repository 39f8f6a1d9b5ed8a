"""Playbook runs. Over a scripted fleet (`drainkit.Kit`): results per node, events, `when`, serial
batches, failure accounting, windows, resume and retry, the step kinds. Over local-shell nodes with
the real CLI and SQLite store: the dry run changes nothing (store, nodes and state folder compared
before and after); two runs at once (the second refused, naming the holder); a run SIGKILLed in a
subprocess is resumed and skips the steps it had done."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.protocols import ExecResult
from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.cli.playbook import render_plan
from gpuctl.config.health_rules import load_rules
from gpuctl.config.playbook import load_playbook
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import JobState
from gpuctl.core.model import NodeSnapshot
from gpuctl.core.playbook import Playbook
from gpuctl.core.playbook.run import Journal
from gpuctl.errors import StateError
from gpuctl.ops import playbook as service
from gpuctl.ops.playbook import JournalFile, LockHeld, PlaybookLock, RunReport, Services
from gpuctl.testing import waiting
from gpuctl.testing.drainkit import Kit
from gpuctl.testing.fakes import FakeTransport
from gpuctl.testing.memstore import MemoryStore

EXAMPLES = Path(__file__).parents[3] / "playbooks"
WHOLE = {"gpus": 1, "mem_per_gpu": "whole"}
OFF = AutoDrainPolicy(enabled=False)
NOON = 12 * 60


class Samples:
    """A health history that keeps nothing (one-sample checks need no past)."""

    def record(self, nodes: Sequence[NodeSnapshot]) -> dict[str, tuple[NodeSnapshot, ...]]:
        return {}


def ok(text: str = "") -> ExecResult:
    return ExecResult(0, text.encode(), b"", 0.01)


def fail(code: int, why: str) -> ExecResult:
    return ExecResult(code, b"", why.encode(), 0.01)


class Bench:
    """A Kit fleet, services over it, and playbooks written to a folder."""

    def __init__(self, tmp: Path, nodes: tuple[str, ...] = ("n1", "n2", "n3"), gpus: int = 2):
        self.tmp = tmp
        self.kit = Kit.make(MemoryStore(), nodes, gpus=gpus, health=OFF)
        self.store = self.kit.store
        self.transport = FakeTransport({n: ok() for n in nodes})
        self.minute = NOON

    def services(self) -> Services:
        return Services(
            loop=self.kit.loop,
            gatherer=self.kit.fleet,
            transport=self.transport,
            history=Samples(),
            rules=load_rules(None),
            operator="alice",
            sleep=self.kit.clock.advance,
            minute_of_day=lambda: self.minute,
        )

    def playbook(self, text: str, name: str = "pb") -> Playbook:
        path = self.tmp / f"{name}.yaml"
        path.write_text(text)
        return load_playbook(path, inventory=self.kit.loop.inventory)

    def run(self, playbook: Playbook, **kw: Any) -> RunReport:
        return service.run(playbook, self.services(), state_dir=self.tmp / "state", **kw)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.store.events() if e.kind.startswith("playbook.")]

    def cordoned(self) -> set[str]:
        return {c.node for c in self.store.cordons()}


@pytest.fixture
def bench(tmp_path: Path) -> Bench:
    return Bench(tmp_path)


def outcomes(report: RunReport) -> list[tuple[str, str, dict[str, str]]]:
    return [(s.key, s.outcome, {n.node: n.outcome for n in s.nodes}) for s in report.steps]


def test_a_run_gives_each_step_a_result_per_node_and_records_each_as_an_event(
    bench: Bench,
) -> None:
    pb = bench.playbook(
        "name: pb\ntargets: all\nsteps:\n"
        "  - cordon: {reason: kernel update}\n    when: node.name != 'n1'\n"
        "  - assert: node.cordoned\n    when: node.name != 'n1'\n"
        "  - status:\n"
    )
    seen: list[str] = []
    report = bench.run(pb, on_step=lambda r: seen.append(r.key))
    assert report.outcome == "ok" and seen == ["b1.s1", "b1.s2", "b1.s3"]
    assert outcomes(report)[:2] == [
        ("b1.s1", "changed", {"n1": "skipped", "n2": "changed", "n3": "changed"}),
        ("b1.s2", "ok", {"n1": "skipped", "n2": "ok", "n3": "ok"}),
    ]
    skipped = report.steps[0].nodes[0]
    assert skipped.message == "when: node.name != 'n1' (node.name = \"n1\"): false"
    assert bench.cordoned() == {"n2", "n3"}
    assert {c.operator for c in bench.store.cordons()} == {"alice"}
    assert bench.kinds() == ["playbook.start", *["playbook.step"] * 3, "playbook.end"]
    events = [e for e in bench.store.events() if e.kind == "playbook.step"]
    assert [e.outcome for e in events] == ["changed", "ok", "ok"]
    assert all(e.actor == "alice" and e.data["run_id"] == report.run_id for e in events)
    assert events[0].data["step"]["nodes"][1] == {
        "node": "n2",
        "outcome": "changed",
        "message": "cordoned",
    }
    journal = JournalFile(bench.tmp / "state", "pb").load()
    assert journal is not None and journal.status == "done"


def test_failed_nodes_beyond_max_fail_percentage_stop_the_run_before_the_next_step(
    bench: Bench,
) -> None:
    bench.transport.script = {"n1": ok(), "n2": fail(3, "disk full"), "n3": ok()}
    text = (
        "name: pb\ntargets: all\nsettings: {{max_fail_percentage: {pct}}}\nsteps:\n"
        "  - run: [fstrim, /]\n  - cordon: {{reason: after trim}}\n"
    )
    report = bench.run(bench.playbook(text.format(pct=0)))
    assert report.outcome == "failed"
    assert report.message == "1 of 3 target(s) failed (33% > max_fail_percentage 0%): n2"
    assert outcomes(report) == [
        ("b1.s1", "failed", {"n1": "changed", "n2": "failed", "n3": "changed"})
    ]
    assert report.steps[0].nodes[1].message == "exit 3: disk full"
    assert bench.cordoned() == set()  # the next step never started
    assert bench.store.events(kinds=["playbook.end"])[-1].outcome == "failed"

    other = Bench(bench.tmp / "other")
    other.transport.script = dict(bench.transport.script)
    (other.tmp).mkdir()
    report = other.run(other.playbook(text.format(pct=50)))
    assert report.outcome == "ok" and report.failed_nodes == ("n2",)
    assert other.cordoned() == {"n1", "n3"}  # a failed node takes no part in later steps
    assert "1 of 3 target(s) failed (within max_fail_percentage): n2" in report.message


def test_a_run_names_its_failed_nodes_and_its_plan_its_targets_as_hostlists(bench: Bench) -> None:
    names = [f"n{i}" for i in (1, 2, 3)]
    bench.transport.script = {"n1": fail(3, "disk full"), "n2": fail(3, "disk full"), "n3": ok()}
    pb = bench.playbook(
        "name: pb\ntargets: all\nsettings: {max_fail_percentage: 0}\nsteps:\n"
        "  - health:\n  - run: [fstrim, /]\n"
    )
    plan = service.plan_run(pb, bench.services())
    assert plan.targets == tuple(names)
    assert "targets: n[1-3] (batches of 3)" in render_plan(plan)
    assert plan.steps[0].detail == ("would poll n[1-3] and judge their health",)
    report = bench.run(pb)
    assert report.message == "2 of 3 target(s) failed (67% > max_fail_percentage 0%): n[1-2]"


def test_serial_runs_every_step_for_one_batch_before_the_next(bench: Bench) -> None:
    pb = bench.playbook(
        "name: pb\ntargets: all\nsettings: {serial: 2}\nsteps:\n"
        "  - run: [echo, first]\n  - run: [echo, second]\n"
    )
    report = bench.run(pb)
    assert [s.key for s in report.steps] == ["b1.s1", "b1.s2", "b2.s1", "b2.s2"]
    order = [(node, cmd.split()[-1]) for node, cmd in bench.transport.calls]
    assert order[:4] == sorted(order[:4], key=lambda c: (c[1] != "first", c[0]))
    assert order[4:] == [("n3", "first"), ("n3", "second")]


def test_a_run_command_is_quoted_and_privileged_ones_go_through_sudo_n(bench: Bench) -> None:
    pb = bench.playbook(
        "name: pb\ntargets: {names: [n1]}\nprivileged: [[systemctl, restart]]\nsteps:\n"
        "  - run: {argv: [systemctl, restart, 'a b; rm -rf /'], sudo: true}\n"
        "  - run: [sh, -c, 'echo $HOME']\n"
    )
    bench.run(pb)
    assert bench.transport.calls == [
        ("n1", "sudo -n systemctl restart 'a b; rm -rf /'"),
        ("n1", "sh -c 'echo $HOME'"),
    ]


def test_the_health_sweep_drains_the_unhealthy_node_only(bench: Bench) -> None:
    jobs = [bench.kit.submit(f"j{i}", resources=WHOLE) for i in range(2)]
    bench.kit.step()
    sick = bench.kit.inc(jobs[0].id).node
    bench.kit.fleet.faults[sick] = {"ecc": 4}
    report = bench.run(load_playbook(EXAMPLES / "health-sweep.yaml"))
    assert report.outcome == "ok", report.message
    health, drain, _ = report.steps
    assert {n.node: n.message.split(":")[0] for n in health.nodes}[sick] == "unhealthy"
    assert {n.node: n.outcome for n in drain.nodes}[sick] == "changed"
    assert bench.cordoned() == {sick}
    (cordon,) = bench.store.cordons()
    assert cordon.reason == "health sweep: unhealthy"
    moved = bench.kit.inc(jobs[0].id)
    assert moved.n == 2 and moved.node != sick
    assert bench.kit.job(jobs[1].id).state is JobState.RUNNING


def test_a_drain_that_leaves_jobs_behind_fails_its_node(tmp_path: Path) -> None:
    small = Bench(tmp_path, ("n1", "n2"), gpus=1)
    a = small.kit.submit("a", resources=WHOLE)
    small.kit.submit("b", resources=WHOLE)
    small.kit.step()
    node = small.kit.inc(a.id).node
    pb = small.playbook(
        f"name: pb\ntargets: {{names: [{node}]}}\nsteps:\n  - drain: {{reason: r}}\n"
    )
    report = small.run(pb)
    assert report.outcome == "failed" and report.failed_nodes == (node,)
    assert "0 of 1 job(s) moved; stays" in report.steps[0].nodes[0].message
    assert small.cordoned() == {node}


def test_a_wait_that_never_comes_true_fails_after_its_timeout(bench: Bench) -> None:
    bench.kit.submit("huge", resources={"gpus": 4, "mem_per_gpu": "whole"})  # never fits
    pb = bench.playbook(
        "name: pb\ntargets: all\nsteps:\n"
        "  - wait: {until: queue_waiting == 0, timeout_s: 30, interval_s: 10, reconcile: true}\n"
        "  - status:\n"
    )
    report = bench.run(pb)
    assert report.outcome == "failed" and len(report.steps) == 1
    assert report.steps[0].message == (
        "timed out after 30s: queue_waiting == 0 (queue_waiting = 1): false"
    )


def test_spot_rebalance_cancels_spot_work_down_to_the_band_and_admits_it_below(
    bench: Bench,
) -> None:
    for i in range(4):
        bench.kit.submit(f"train{i}", resources=WHOLE)  # 4 of 6 cards: 66.7 %
    spot = [
        bench.kit.submit(
            f"spot{i}", tier="spot", priority=i, resources={"gpus": 1, "mem_per_gpu": "40GiB"}
        )
        for i in range(3)
    ]  # + 120 GiB of 480: 91.7 %
    bench.kit.step()
    assert all(bench.kit.job(j.id).state is JobState.RUNNING for j in spot)
    report = bench.run(load_playbook(EXAMPLES / "spot-rebalance.yaml"))
    cancel, submit, _, _ = report.steps
    assert (cancel.outcome, submit.outcome) == ("changed", "skipped")
    assert cancel.data["jobs"] == [spot[0].id, spot[1].id]  # lowest priority first, to <= 80 %
    states = {j.name: bench.kit.job(j.id).state for j in spot}
    assert states == {
        "spot0": JobState.CANCELLED,
        "spot1": JobState.CANCELLED,
        "spot2": JobState.RUNNING,
    }


def test_spot_rebalance_admits_spot_work_under_the_band_once(bench: Bench) -> None:
    first = bench.run(load_playbook(EXAMPLES / "spot-rebalance.yaml"))
    assert [s.outcome for s in first.steps] == ["skipped", "changed", "changed", "ok"]
    filler = bench.store.job("spot-filler")
    assert filler is not None and filler.tier == "spot" and filler.state is JobState.RUNNING
    again = bench.run(load_playbook(EXAMPLES / "spot-rebalance.yaml"))
    assert again.steps[1].outcome == "ok"  # a job whose name is active is left as it is
    assert again.steps[1].message.startswith(f"active already: spot-filler ({filler.id}, running")
    assert len(bench.store.jobs()) == 1


def test_outside_its_window_a_run_does_nothing(bench: Bench) -> None:
    pb = bench.playbook(
        "name: pb\ntargets: all\nsettings: {window: '22:00-04:00'}\n"
        "steps:\n  - cordon: {reason: x}\n"
    )
    report = bench.run(pb)
    assert (report.outcome, report.message) == (
        "outside_window",
        "outside the window 22:00-04:00: nothing done",
    )
    assert bench.kinds() == [] and bench.cordoned() == set()
    assert JournalFile(bench.tmp / "state", "pb").load() is None
    assert bench.run(pb, override_window=True, window=None).outcome == "ok"
    assert bench.cordoned() == {"n1", "n2", "n3"}


def test_a_window_that_closes_mid_run_stops_it_and_the_next_run_resumes(bench: Bench) -> None:
    pb = bench.playbook(
        "name: pb\ntargets: all\nsettings: {window: '22:00-04:00'}\nsteps:\n"
        "  - cordon: {reason: x}\n  - uncordon:\n"
    )
    clock = iter([23 * 60, 23 * 60, 4 * 60])
    bench.minute = 23 * 60
    services = bench.services()
    services.minute_of_day = lambda: next(clock)
    report = service.run(pb, services, state_dir=bench.tmp / "state")
    assert report.outcome == "stopped" and [s.key for s in report.steps] == ["b1.s1"]
    assert "closed before step 2" in report.message
    notes: list[str] = []
    bench.minute = 23 * 60
    resumed = bench.run(pb, notice=notes.append)
    assert resumed.resumed and resumed.outcome == "ok"
    assert [(s.key, s.earlier) for s in resumed.steps] == [("b1.s1", True), ("b1.s2", False)]
    assert notes == [
        f"resuming run {report.run_id} (it was interrupted): 1 step(s) done are skipped"
    ]
    assert bench.cordoned() == set()


def test_resume_retries_the_failed_step_of_a_run_that_stopped(bench: Bench) -> None:
    bench.transport.script = {"n1": ok(), "n2": fail(1, "no"), "n3": ok()}
    pb = bench.playbook(
        "name: pb\ntargets: all\nsteps:\n  - cordon: {reason: x}\n  - run: [fix]\n  - uncordon:\n"
    )
    assert bench.run(pb).outcome == "failed"
    again = bench.run(pb)  # a run that ended is not resumed by itself: it starts afresh
    assert (again.resumed, again.outcome) == (False, "failed")
    assert again.steps[0].nodes[0].message == "cordoned already by alice: x"
    bench.transport.script["n2"] = ok()
    retried = bench.run(pb, resume=True)
    assert retried.resumed and retried.outcome == "ok"
    assert [(s.key, s.earlier) for s in retried.steps] == [
        ("b1.s1", True),
        ("b1.s2", False),
        ("b1.s3", False),
    ]
    assert bench.cordoned() == set()
    with pytest.raises(StateError, match=r"nothing to resume for playbook pb: run .* ended"):
        bench.run(pb, resume=True)


def test_a_changed_playbook_is_not_resumed(bench: Bench) -> None:
    state = bench.tmp / "state"
    pb = bench.playbook("name: pb\ntargets: all\nsteps:\n  - status:\n")
    journal = Journal(
        "old", "pb", "0" * 64, 1.0, "alice", (("n1", "n2", "n3"),), 3, done={"b1.s1": "ok"}
    )
    JournalFile(state, "pb").save(journal)
    with pytest.raises(StateError, match=r"cannot resume run old: .*pb.yaml changed"):
        bench.run(pb, resume=True)
    notes: list[str] = []
    report = bench.run(pb, notice=notes.append)
    assert not report.resumed and report.steps[0].earlier is False
    assert notes == ["run old was interrupted, but the playbook changed since: starting afresh"]


def test_a_second_run_while_one_holds_the_lock_is_refused_naming_the_holder(
    bench: Bench,
) -> None:
    pb = bench.playbook("name: pb\ntargets: all\nsteps:\n  - status:\n")
    with (
        PlaybookLock(bench.tmp / "state", "pb", now=lambda: 0.0),
        pytest.raises(LockHeld) as caught,
    ):
        bench.run(pb)
    assert f"held by pid {os.getpid()} on {socket.gethostname()} since 1970-01-01" in str(
        caught.value
    )
    assert caught.value.exit_code == 6
    assert bench.run(pb).outcome == "ok"  # released on the way out


def test_a_dry_run_plan_says_what_each_step_would_do_and_changes_nothing(bench: Bench) -> None:
    job = bench.kit.submit("a", resources=WHOLE)
    bench.kit.step()
    node = bench.kit.inc(job.id).node
    pb = bench.playbook(
        f"name: pb\ntargets: {{names: [{node}]}}\nsteps:\n"
        "  - drain: {reason: r}\n  - run: [reboot]\n  - consolidate: {max_moves: 2}\n"
        "    when: fragmentation_pct > 99\n"
    )
    before = (len(bench.store.events()), bench.store.cordons(), bench.store.incarnations())
    plan = service.plan_run(pb, bench.services())
    assert (len(bench.store.events()), bench.store.cordons(), bench.store.incarnations()) == before
    assert not (bench.tmp / "state").exists()
    drain, run, consolidate = plan.steps
    assert drain.detail[0].startswith(f"{node}: would cordon and move 1 job(s): {job.id} -> ")
    assert run.detail == (f"{node}: would run reboot",)
    assert consolidate.when is not None and consolidate.when.endswith(": false")
    assert plan.targets == (node,) and plan.inside_window


# --- the CLI over local-shell nodes and the SQLite store -------------------------------------

DRIVER = """
import json, os, sys
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.testing.fakes import ShellTransport
envs = json.loads(os.environ["PB_ENVS"])
ctx = AppContext(transport_factory=lambda: ShellTransport(envs), env={**os.environ, "USER": "bob"})
app(args=sys.argv[1:], obj=ctx, prog_name="gpuctl")
"""


class Shells:
    """Two local-shell nodes (the lab's node tools, no sshd), an inventory, and the CLI. Their
    names are this module's own: the fake nvidia-smi counts every process of this machine that
    claims a node's name, so tests elsewhere must not share them."""

    def __init__(self, tmp: Path) -> None:
        from gpuctl.lab import node_tools, nodestate

        self.tmp = tmp
        node_tools.install_node_tools(tmp / "bin", python="/usr/bin/python3")
        self.envs: dict[str, dict[str, str]] = {}
        lines = ["nodes:"]
        for i, name in enumerate(("pb01", "pb02")):
            state = tmp / name / "state.json"
            state.parent.mkdir()
            nodestate.write_state(
                state,
                nodestate.new_node_state(
                    name, gpus=2, model="NVIDIA H100 80GB HBM3", mem_gib=80, node_index=i
                ),
            )
            home = tmp / name / "home"
            home.mkdir()
            self.envs[name] = {
                "PATH": f"{tmp / 'bin'}:/usr/bin:/bin",
                "GPUCTL_LAB_STATE": str(state),
                "GPUCTL_LAB_NODE": name,
                "HOME": str(home),
            }
            lines.append(f"  - {{name: {name}, host: 127.0.0.1, port: {2201 + i}, gpus: 2}}")
        self.inventory = tmp / "fleet.yaml"
        self.inventory.write_text("\n".join(lines) + "\n")
        self.state = tmp / "state"

    def argv(self, *args: str) -> list[str]:
        return ["-i", str(self.inventory), "--state-dir", str(self.state), *args]

    def cli(self, *args: str, answer: str = "") -> Result:
        from gpuctl.testing.fakes import ShellTransport

        transport = ShellTransport(self.envs)
        ctx = AppContext(transport_factory=lambda: transport, env={**os.environ, "USER": "alice"})
        return CliRunner().invoke(app, self.argv(*args), obj=ctx, input=answer)

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        driver = self.tmp / "driver.py"
        driver.write_text(DRIVER)
        env = {**os.environ, "PB_ENVS": json.dumps(self.envs)}
        with (self.tmp / "driver.log").open("ab") as log:  # the child keeps its own copy
            return subprocess.Popen(
                [sys.executable, str(driver), *self.argv(*args)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a SIGKILL takes its children too
            )

    def journal(self, name: str) -> dict[str, Any] | None:
        path = self.state / "playbooks" / f"{name}.journal.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return data

    def home(self, node: str) -> Path:
        return Path(self.envs[node]["HOME"])

    def stop_jobs(self) -> None:
        """Kill every job process the tests launched on the nodes."""
        from gpuctl.adapters.node import SshJobRunner
        from gpuctl.config.inventory import load_inventory
        from gpuctl.testing.fakes import ShellTransport

        if not (self.state / "state.db").exists():
            return
        specs = load_inventory(self.inventory).by_name()
        runner = SshJobRunner(ShellTransport(self.envs))
        with open_store(self.state, write=False) as store:
            for inc in store.incarnations():
                runner.signal(specs[inc.node], inc.job_id, inc.n, "KILL")


@pytest.fixture
def shells(tmp_path: Path) -> Iterator[Shells]:
    made = Shells(tmp_path)
    yield made
    made.stop_jobs()


wait_for = functools.partial(waiting.wait_for, timeout_s=60.0, every_s=0.1)


def store_dump(state: Path) -> dict[str, Any]:
    with open_store(state, write=False) as store:
        return {
            "jobs": store.jobs(),
            "incarnations": store.incarnations(),
            "events": store.events(),
            "cordons": store.cordons(),
            "reservations": store.reservations(),
        }


def folder_dump(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "bin" not in p.parts and not p.name.startswith("state.db")
    }


def test_the_dry_run_changes_neither_the_store_nor_the_nodes_nor_the_state_folder(
    shells: Shells,
) -> None:
    job = shells.tmp / "job.yaml"
    job.write_text(
        "name: sleeper\ncommand: [sh, -c, 'while :; do sleep 0.2; done']\n"
        "resources: {gpus: 1, mem_per_gpu: whole}\n"
    )
    assert shells.cli("submit", str(job)).exit_code == 0
    assert shells.cli("reconcile").exit_code == 0

    def settled() -> bool:  # the job's wrapper writes its files (pid, then started) on its own
        runs = [d for n in shells.envs for d in (shells.home(n) / ".gpuctl/runs").glob("*/*")]
        return bool(runs) and all(
            (d / "started").exists() and not any(d.glob("*.tmp")) for d in runs
        )

    assert waiting.wait_for(settled, timeout_s=10.0, every_s=0.02)
    pb = shells.tmp / "pb.yaml"
    pb.write_text(
        "name: everything\ntargets: all\nsteps:\n"
        "  - cordon: {reason: dry}\n  - drain: {reason: dry}\n"
        "  - run: [sh, -c, 'touch $HOME/touched']\n  - health:\n"
        "  - consolidate: {max_moves: 2}\n  - submit: [job.yaml]\n  - cancel: [sleeper]\n"
        "  - reconcile: 2\n  - uncordon:\n"
    )
    store_before, files_before = store_dump(shells.state), folder_dump(shells.tmp)
    result = shells.cli("playbook", "run", str(pb), "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stderr == "dry run: nothing changed\n"
    assert "[b1.s2] drain: cordon and move every job off" in result.stdout
    assert "would cordon and move 1 job(s): sleeper-" in result.stdout
    assert "pb01: would run sh -c 'touch $HOME/touched'" in result.stdout
    assert "sleeper: active already as sleeper-" in result.stdout
    assert "would cancel sleeper-" in result.stdout
    assert store_dump(shells.state) == store_before
    assert folder_dump(shells.tmp) == files_before
    assert not (shells.state / "playbooks").exists()
    assert not any((shells.home(n) / "touched").exists() for n in shells.envs)
    doc = json.loads(shells.cli("playbook", "run", str(pb), "--dry-run", "-o", "json").stdout)
    assert doc["dry_run"] is True and len(doc["plan"]["steps"]) == 9


def test_two_runs_at_once_the_second_is_refused_naming_the_holder(shells: Shells) -> None:
    go = shells.tmp / "go"
    pb = shells.tmp / "pb.yaml"
    pb.write_text(
        "name: slow\ntargets: {names: [pb01]}\nsteps:\n"
        f"  - run: {{argv: [sh, -c, 'while [ ! -e {go} ]; do sleep 0.1; done'], timeout_s: 60}}\n"
    )
    first = shells.spawn("playbook", "run", str(pb), "--yes")
    try:
        assert wait_for(lambda: (shells.journal("slow") or {}).get("current") == "b1.s1")
        second = shells.cli("playbook", "run", str(pb), "--yes")
        assert second.exit_code == 6, second.output
        assert second.stderr.startswith(
            "error: playbook slow is running already: its lock "
            f"({shells.state / 'playbooks' / 'slow.lock'}) is held by pid {first.pid} on "
            f"{socket.gethostname()} since "
        )
        go.touch()
        assert first.wait(timeout=60) == 0
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert shells.cli("playbook", "run", str(pb), "--yes").exit_code == 0


def test_after_a_sigkill_the_next_run_takes_the_lock_over_and_resumes(shells: Shells) -> None:
    go = shells.tmp / "go"
    pb = shells.tmp / "pb.yaml"
    pb.write_text(
        "name: maint\ntargets: {names: [pb02]}\nsteps:\n"
        "  - cordon: {reason: maintenance}\n"
        "  - run: [sh, -c, 'echo once >> $HOME/first']\n"
        f"  - run: [sh, -c, 'echo again >> $HOME/second; until [ -e {go} ]; do sleep 0.1; done']\n"
        "  - uncordon:\n"
    )
    crashed = shells.spawn("playbook", "run", str(pb), "--yes")
    try:
        assert wait_for(lambda: (shells.home("pb02") / "second").exists())
    finally:
        os.killpg(crashed.pid, signal.SIGKILL)  # the run and its step's shell, at once
        crashed.wait()
    run_id = (shells.journal("maint") or {})["run_id"]
    dry = shells.cli("playbook", "run", str(pb), "--dry-run")
    assert f"resumes the interrupted run {run_id}: the steps it did are skipped" in dry.stdout
    assert (
        "[b1.s2] run: run sh -c 'echo once >> $HOME/first' (timeout 60s) [done earlier: changed"
        in dry.stdout
    )
    go.touch()
    result = shells.cli("playbook", "run", str(pb), "--yes")
    assert result.exit_code == 0, result.output
    notes = result.stderr.splitlines()
    assert notes[0].startswith(
        f"took over the lock of playbook maint from pid {crashed.pid} on {socket.gethostname()}"
    )
    assert notes[0].endswith("that run is gone (crashed or killed)")
    assert notes[1] == f"resuming run {run_id} (it was interrupted): 2 step(s) done are skipped"
    assert "[b1.s1] cordon: changed: done by the interrupted run: skipped" not in result.stdout
    assert (shells.home("pb02") / "first").read_text() == "once\n"  # not run again
    assert (shells.home("pb02") / "second").read_text() == "again\nagain\n"  # cut short: again
    dump = store_dump(shells.state)
    assert dump["cordons"] == []
    steps = [e for e in dump["events"] if e.kind == "playbook.step"]
    assert [(e.data["step"]["key"], e.actor) for e in steps] == [
        ("b1.s1", "bob"),
        ("b1.s2", "bob"),
        ("b1.s3", "alice"),
        ("b1.s4", "alice"),
    ]
    assert "playbook.resume" in [e.kind for e in dump["events"]]
    assert "playbook maint (resumed): ok: 4 step(s) done" in result.stdout


def test_check_says_valid_or_names_file_line_and_field_with_exit_2(shells: Shells) -> None:
    good = shells.tmp / "good.yaml"
    good.write_text("name: good\ntargets: {names: [pb01]}\nsteps:\n  - cordon: {reason: x}\n")
    result = shells.cli("playbook", "check", str(good))
    assert result.exit_code == 0, result.output
    assert (
        result.stdout == f"{good}: ok: playbook good, 1 step(s)\n  1. cordon: cordon (reason: x)\n"
    )
    doc = json.loads(shells.cli("playbook", "check", str(good), "-o", "json").stdout)
    assert doc["valid"] is True and doc["targets_checked"] is True
    bad = shells.tmp / "bad.yaml"
    bad.write_text("name: bad\ntargets: {names: [pb09]}\nsteps:\n  - cordon: {reason: x}\n")
    result = shells.cli("playbook", "check", str(bad))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        f"error: {bad}:2: targets.names[0]: undefined target: 'pb09' is no node of the inventory\n"
        "hint: did you mean 'pb02'?\n"
    )
    runner = CliRunner().invoke(app, ["playbook", "check", str(bad)], obj=AppContext(env={}))
    assert runner.exit_code == 0  # no inventory: the targets cannot be checked, and it says so
    assert runner.stderr == "note: no inventory given: targets not checked against one\n"


def test_a_run_shows_its_plan_and_asks_and_no_changes_nothing(shells: Shells) -> None:
    pb = shells.tmp / "pb.yaml"
    pb.write_text("name: ask\ntargets: all\nsteps:\n  - cordon: {reason: x}\n")
    result = shells.cli("playbook", "run", str(pb), answer="n\n")
    assert result.exit_code == 1
    assert "[b1.s1] cordon: cordon (reason: x)" in result.stdout
    assert result.stderr == "run playbook ask as planned? [y/N]: nothing changed\n"
    assert shells.journal("ask") is None
    assert store_dump(shells.state)["events"] == []
    result = shells.cli("playbook", "run", str(pb), answer="y\n")
    assert result.exit_code == 0, result.output
    assert "    pb01  changed  cordoned\n    pb02  changed  cordoned\n" in result.stdout
    assert result.stdout.endswith("playbook ask: ok: 1 step(s) done\n")


def test_a_run_without_an_answer_or_yes_shows_its_plan_and_exits_2_as_every_confirming_verb(
    shells: Shells,
) -> None:
    pb = shells.tmp / "pb.yaml"
    pb.write_text("name: ask\ntargets: all\nsteps:\n  - cordon: {reason: x}\n")
    result = shells.cli("playbook", "run", str(pb))  # no terminal: stdin at its end
    assert result.exit_code == 2, result.output
    assert "[b1.s1] cordon: cordon (reason: x)" in result.stdout
    assert result.stderr == (
        "run playbook ask as planned? [y/N]: \n"
        "error: no answer (no terminal): nothing changed\n"
        "hint: pass --yes to apply without a terminal\n"
    )
    assert shells.journal("ask") is None
    assert store_dump(shells.state)["events"] == []


def test_a_step_failing_beyond_the_threshold_exits_1(shells: Shells) -> None:
    pb = shells.tmp / "pb.yaml"
    pb.write_text(
        "name: fails\ntargets: {names: [pb02]}\nsteps:\n  - run: [sh, -c, 'echo no >&2; exit 4']\n"
    )
    result = shells.cli("playbook", "run", str(pb), "--yes")
    assert result.exit_code == 1
    assert "    pb02  failed   exit 4: no\n" in result.stdout
    assert result.stdout.endswith(
        "playbook fails: failed: 1 of 1 target(s) failed (100% > max_fail_percentage 0%): pb02\n"
    )
