"""Cordon, drain and health draining on a lab fleet of real sshd, with real job processes:
uncorrectable ECC drains a node (its job moves from a fresh checkpoint, its log continues step by
step), unreadable GPUs cordon without touching jobs, a job that ignores signals is killed after
the grace, a cordon racing a placement wins, and gpuctl never lifts a person's cordon."""

from __future__ import annotations

import functools
import json
import os
import pwd
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.protocols import Store
from gpuctl.adapters.ssh import SshTransport
from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import EndReason, Incarnation, IncarnationState, JobState
from gpuctl.core.model import Inventory
from gpuctl.ops import jobs as service
from gpuctl.ops.gather import Gatherer
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.loop import Reconciler, ReconcileSettings
from gpuctl.ops.moves import nodeops
from gpuctl.testing import waiting
from gpuctl.testing.lab import LabFleet

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
T = TypeVar("T")


wait_for = functools.partial(waiting.wait_for, timeout_s=40.0, every_s=0.3)


class Lab:
    """One lab fleet with a store, the control loop and the job runner over one transport."""

    def __init__(self, lab: LabFleet, tmp: Path, transport: SshTransport, **health: Any) -> None:
        self.lab, self.tmp = lab, tmp
        self.state = tmp / "state"
        self.store: Store = open_store(self.state, write=True)
        self.inventory = Inventory(nodes=lab.specs(connect_timeout_s=2.0, command_timeout_s=15.0))
        self.specs = self.inventory.by_name()
        self.runner = SshJobRunner(transport)
        policy = AutoDrainPolicy(**health)
        self.loop = Reconciler(
            self.store,
            Gatherer(transport),
            self.runner,
            self.inventory,
            SystemClock(),
            ReconcileSettings(grace_s=30.0, checkpoint_scan_s=0.0, health=policy),
            state_dir=str(self.state),
        )

    def shared(self) -> Path:
        folder = self.lab.dir / "shared"
        folder.mkdir(mode=0o755, exist_ok=True)
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self.lab.lab.user)
            os.chown(folder, pw.pw_uid, pw.pw_gid)
        return folder

    def submit(self, name: str, command: str, *, extra: str = "") -> str:
        spec = self.tmp / f"{name}.yaml"
        spec.write_text(
            f"name: {name}\ncommand: {command}\nworkdir: {REPO / 'examples'}\n"
            "resources: {gpus: 1, mem_per_gpu: 8GiB}\n"
            f"checkpoint: {{dir: '{self.shared()}/{{job_id}}', sync: shared}}\n"
            "env: {PYTHONDONTWRITEBYTECODE: '1'}\n" + extra
        )
        (job,) = service.submit(self.store, load_specs([spec]), actor="t", clock=SystemClock())
        return job.id

    def train(self) -> str:
        return self.submit(
            "train",
            f"[{PYTHON}, train.py, --steps, '100000', --checkpoint-every, '40', "
            "--step-seconds, '0.05']",
            extra="grace_s: 10\n",
        )

    def incs(self, job_id: str) -> list[Incarnation]:
        return self.store.incarnations(job_id)

    def log(self, job_id: str, n: int) -> str:
        inc = self.incs(job_id)[n - 1]
        data, _ = self.runner.logs(self.specs[inc.node], job_id, n)
        return data.decode("utf-8", "replace")

    def kinds(self, job_id: str) -> list[str]:
        return [e.kind for e in self.store.events(job_id=job_id)]

    def cli(self, *args: str) -> Result:
        def transport() -> SshTransport:
            return SshTransport(own_known_hosts=self.tmp / "kh", system_known_hosts=())

        ctx = AppContext(
            transport_factory=transport,  # type: ignore[arg-type]
            env={**os.environ, "USER": "alice"},
        )
        argv = ["-i", str(self.lab.lab.inventory_path), "--state-dir", str(self.state), *args]
        return CliRunner().invoke(app, argv, obj=ctx)

    def stop(self) -> None:
        for inc in self.store.incarnations():
            try:
                self.runner.signal(self.specs[inc.node], inc.job_id, inc.n, "KILL")
            except Exception:  # a node that is gone has nothing left to stop
                continue
        self.store.close()


@pytest.fixture
def lab(own_lab: LabFleet, tmp_path: Path) -> Iterator[Callable[..., Lab]]:
    made: list[Lab] = []
    with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:

        def make(**health: Any) -> Lab:
            made.append(Lab(own_lab, tmp_path, transport, **health))
            return made[-1]

        try:
            yield make
        finally:
            for one in made:
                one.stop()


def test_uncorrectable_ecc_cordons_the_node_and_moves_its_job_from_a_fresh_checkpoint(
    lab: Callable[..., Lab],
) -> None:
    t = lab(drain_after_passes=2)
    job_id = t.train()
    t.loop.run_once()
    (first,) = t.incs(job_id)
    assert first.state is IncarnationState.RUNNING, t.kinds(job_id)
    assert wait_for(lambda: "step 20 " in t.log(job_id, 1)), t.log(job_id, 1)
    t.lab.inject(first.node, gpu=0, ecc_uncorrected=1)
    t.loop.run_once()  # the next pass cordons it
    (cordon,) = t.store.cordons()
    assert (cordon.node, cordon.source, cordon.operator) == (first.node, "health", "gpuctl")
    assert "uncorrectable ECC" in cordon.reason

    def moved() -> bool:
        t.loop.run_once()
        job = t.store.job(job_id)
        incs = t.incs(job_id)
        return (
            job is not None
            and job.incarnation == 2
            and incs[-1].state is IncarnationState.RUNNING
            and not t.store.reservations()
        )

    assert wait_for(moved, timeout_s=60), [e.message for e in t.store.events(job_id=job_id)]
    old, new = t.incs(job_id)
    assert new.node != first.node
    assert (old.state, old.end_reason) == (IncarnationState.EXITED, EndReason.DRAINED)
    (asked,) = t.store.events(job_id=job_id, kinds=["checkpoint_request"])
    baseline = asked.data["baseline_step"]
    assert new.resume_step is not None
    assert baseline is None or new.resume_step > int(baseline)  # fresher than before SIGUSR1
    drain = t.store.events(kinds=["drain"])[-1]
    assert drain.data["source"] == "health" and "ECC" in str(drain.data["reason"])
    assert drain.node == first.node

    old_log = t.log(job_id, 1)
    assert "(SIGUSR1)" in old_log and "stopping at step" in old_log

    def resumed() -> str:
        text = t.log(job_id, 2)
        return text if re.search(r"^step \d+ ", text, re.M) else ""

    text = wait_for(resumed)
    assert f"resumed from step {new.resume_step} (incarnation 1)" in text
    steps = [int(s) for s in re.findall(r"^step (\d+) ", text, re.M)]
    assert steps[0] == new.resume_step + 1  # no step lost, none repeated
    last_old = max(int(s) for s in re.findall(r"^step (\d+) ", old_log, re.M))
    assert new.resume_step == last_old  # it resumed from where the old copy stopped
    assert check_invariants(t.store) == []


def test_unreadable_or_hung_nvidia_smi_cordons_and_leaves_the_job_running(
    lab: Callable[..., Lab],
) -> None:
    t = lab(drain_after_passes=1)
    job_id = t.submit("sleeper", "[sh, -c, 'while :; do sleep 0.2; done']")
    t.loop.run_once()
    (inc,) = t.incs(job_id)
    other = next(n for n in t.specs if n != inc.node)
    t.lab.inject(inc.node, garbage=True)
    t.lab.inject(other, hang=True)
    for _ in range(2):
        report = t.loop.run_once()
    cordons = {c.node: c for c in t.store.cordons()}
    assert set(cordons) == {inc.node, other}
    assert all(c.source == "health" and "unreadable" in c.reason for c in cordons.values())
    verdicts = {n.name: n.health for n in report.nodes}
    assert verdicts == {inc.node: "unknown", other: "unknown"}
    (still,) = t.incs(job_id)
    assert (still.n, still.state) == (1, IncarnationState.RUNNING)
    kinds = t.kinds(job_id)
    assert not {"checkpoint_request", "stop", "kill", "reserve"} & set(kinds), kinds
    runs = t.runner.observe(t.specs[inc.node])
    assert [(r.job_id, r.alive) for r in runs] == [(job_id, True)]


def test_draining_a_node_whose_job_ignores_signals_ends_within_the_waits_and_the_kill(
    lab: Callable[..., Lab],
) -> None:
    t = lab(enabled=False)
    job_id = t.submit(
        "stubborn", """[bash, -c, "trap '' TERM USR1; while :; do sleep 0.1; done"]"""
    )
    launched = t.cli("reconcile")
    assert launched.exit_code == 0, launched.output
    (inc,) = t.incs(job_id)
    started = time.monotonic()
    args = ["drain", inc.node, "--reason", "ignores us", "--grace", "2", "--checkpoint-wait", "1"]
    result = t.cli(*args, "--yes", "-o", "json")
    took = time.monotonic() - started
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["moved"], doc["complete"]) == (1, True)
    events = {e.kind: e for e in t.store.events(job_id=job_id)}
    waited = events["kill"].at - events["checkpoint_request"].at
    assert 1.0 + 2.0 <= waited <= 1.0 + 2.0 + 2.5  # the waits, plus at most a poll or two
    assert took < 30.0, took
    old, new = t.incs(job_id)
    assert (old.state, old.end_reason) == (IncarnationState.KILLED, EndReason.DRAINED)
    assert new.node != inc.node and new.resume_step is None  # it never checkpointed
    runs = {(r.job_id, r.incarnation): r.alive for r in t.runner.observe(t.specs[inc.node])}
    assert runs.get((job_id, 1)) is False


def test_a_cordon_that_commits_while_a_placement_is_under_way_wins(
    lab: Callable[..., Lab],
) -> None:
    t = lab(enabled=False)
    job_id = t.submit("late", "[sh, -c, 'while :; do sleep 0.2; done']")
    inner = t.store
    cordoned: list[str] = []

    class CordonFirst:
        """The store as a placement sees it, with an operator's cordon committing just before
        the placement writes its intent."""

        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def begin_launch(self, inc: Incarnation, **kw: Any) -> Any:
            if not cordoned:
                nodeops.cordon(inner, inc.node, reason="race", operator="bob", clock=SystemClock())
                cordoned.append(inc.node)
            return inner.begin_launch(inc, **kw)

    t.loop.store = CordonFirst()  # type: ignore[assignment]
    report = t.loop.run_once()
    assert cordoned and any("cordoned" in a.message for a in report.of("launch"))
    assert t.incs(job_id) == [] and t.store.job(job_id).state is JobState.QUEUED  # type: ignore[union-attr]
    assert t.runner.observe(t.specs[cordoned[0]]) == []  # nothing started there
    t.loop.run_once()
    (inc,) = t.incs(job_id)
    assert inc.node != cordoned[0] and inc.state is IncarnationState.RUNNING
    assert t.runner.observe(t.specs[cordoned[0]]) == []


class AheadClock(SystemClock):
    """The system clock, moved ahead on demand (a cool-down passes without waiting for it)."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def now(self) -> float:
        return super().now() + self.ahead_s


def test_gpuctl_lifts_its_own_health_cordon_after_the_cool_down_never_a_person_s(
    lab: Callable[..., Lab],
) -> None:
    t = lab()  # the default cool-down: 10 minutes healthy
    clock = AheadClock()
    t.loop.clock = clock
    a, b = sorted(t.specs)
    person = t.cli("cordon", a, "--reason", "RMA pending", "--yes")
    assert person.exit_code == 0, person.output
    for name in (a, b):
        t.lab.inject(name, garbage=True)
    t.loop.run_once()
    assert {c.node: c.source for c in t.store.cordons()} == {a: "operator", b: "health"}
    for name in (a, b):
        t.lab.inject(name, clear=True)
    t.loop.run_once()  # healthy again: the cool-down starts
    clock.ahead_s += 300
    t.loop.run_once()
    assert {c.node for c in t.store.cordons()} == {a, b}  # five minutes: not yet
    clock.ahead_s += 301
    t.loop.run_once()
    assert {c.node for c in t.store.cordons()} == {a}
    clock.ahead_s += 3600
    t.loop.run_once()
    ((node, operator, reason),) = [(c.node, c.operator, c.reason) for c in t.store.cordons()]
    assert (node, operator, reason) == (a, "alice", "RMA pending")
    (event,) = t.store.events(kinds=["uncordon"])
    assert (event.node, event.actor) == (b, "gpuctl")
