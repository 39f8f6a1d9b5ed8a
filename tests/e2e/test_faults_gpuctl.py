"""gpuctl's own faults on a lab fleet: `gpuctl reconcile` SIGKILLed at seeded random points, two
control loops at once, and a corrupt state database."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.ssh import SshTransport
from gpuctl.adapters.store import open_store
from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.core.model import Inventory
from gpuctl.ops import jobs as service
from gpuctl.ops.gather import Gatherer
from gpuctl.ops.invariants import LIVE, check_database, check_invariants
from gpuctl.ops.jobs import ACTIVE
from gpuctl.ops.loop import Pass, Reconciler, ReconcileSettings, run_pass
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import (
    EXAMPLES,
    PYTHON,
    gpuctl,
    gpuctl_argv,
    job_processes,
    kill_job_processes,
    shared_dir,
    train_command,
    wait_for,
)

pytestmark = pytest.mark.e2e

SEED = 1604
ITERATIONS = 20
SLEEPER = f"[{PYTHON}, -c, 'import time; time.sleep(300)']"


def submit(state: Path, tmp: Path, name: str, body: str) -> str:
    spec = tmp / f"{name}.yaml"
    spec.write_text(f"name: {name}\n{body}")
    with open_store(state, write=True) as store:
        (job,) = service.submit(store, load_specs([spec]), actor="test", clock=SystemClock())
    return job.id


def train_spec(ckpt: Path, total: int, every: int = 5) -> str:
    return (
        f"command: {train_command(every=every, total=total)}\n"
        f"workdir: {EXAMPLES}\n"
        "resources: {gpus: 1, mem_per_gpu: 4GiB}\n"
        f"checkpoint: {{dir: '{ckpt}/{{job_id}}', sync: shared}}\n"
        "env: {PYTHONDONTWRITEBYTECODE: '1'}\n"
        "grace_s: 2\n"
    )


def settle(lab: LabFleet, state: Path, tmp: Path) -> None:
    """Control-loop passes (launches confirmed or failed within 1 s) until nothing is in flight:
    no incarnation launching, no lost one waiting to be fenced, no short job still to finish."""
    inventory = Inventory(nodes=lab.specs(connect_timeout_s=1.0, command_timeout_s=4.0))
    settings = ReconcileSettings(grace_s=1.0, launch_settle_s=1.0, checkpoint_scan_s=0.0)
    with (
        SshTransport(own_known_hosts=tmp / "kh", system_known_hosts=()) as ssh,
        open_store(state, write=True) as store,
    ):
        loop = Reconciler(
            store, Gatherer(ssh), SshJobRunner(ssh), inventory, SystemClock(), settings
        )

        def quiet() -> bool:
            loop.run_once()
            busy = [
                i
                for i in store.incarnations(holding=True)
                if i.state in (IncarnationState.LAUNCHING, IncarnationState.LOST)
            ]
            short = [j for j in store.jobs(ACTIVE) if j.name.startswith("short-")]
            return not busy and not [j for j in short if j.state is not JobState.HELD]

        assert wait_for(lambda: quiet() and quiet(), timeout_s=30, every_s=0.2)


def test_gpuctl_sigkilled_at_random_points_of_a_pass_loses_no_job_and_leaves_no_duplicate(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    state, inventory = tmp_path / "state", own_lab.lab.inventory_path
    ckpt = shared_dir(own_lab)
    for i in range(3):
        submit(state, tmp_path, f"long-{i}", train_spec(ckpt, total=100000))
    reconcile = gpuctl_argv(state, inventory, "reconcile", "--grace", "1", "-o", "json")
    lock = state / "loop.lock"
    interrupted = 0  # passes killed after they had written something
    try:
        for _ in range(2):  # the first launches the long jobs; the second is a usual pass
            done = subprocess.run(reconcile, capture_output=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
        pass_s = json.loads(done.stdout)["duration_s"]  # from the loop lock to the end
        for i in range(ITERATIONS):
            if i % 3 == 0:  # short jobs keep launches and exits in every stretch of passes
                submit(state, tmp_path, f"short-{i}", train_spec(ckpt, total=6, every=3))
            if i == 8:
                own_lab.kill("lab-02")  # failovers under fire
            if i == 14:
                own_lab.revive("lab-02")  # and fencing
            events = check_database(state).events or 0  # the submit above included
            loop = subprocess.Popen(reconcile, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # the pass begins when it holds the loop lock (the lock file then names its pid)
            assert wait_for(lambda p=str(loop.pid): lock.read_text().strip() == p, timeout_s=30)
            time.sleep(rng.uniform(0.25, 1.25) * pass_s)
            loop.kill()
            code = loop.wait(timeout=10)
            report = check_database(state)
            assert not report.problems, f"after kill {i}: {report.problems}"
            interrupted += code == -signal.SIGKILL and (report.events or 0) > events
        assert interrupted >= 5, interrupted  # kills landed between the writes of a pass

        checked = gpuctl(state, inventory, "db", "check")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        settle(own_lab, state, tmp_path)
        with open_store(state, write=False) as store:
            assert check_invariants(store, capacity_mib=store.card_capacities()) == []
            jobs = {j.id: j for j in store.jobs()}
            live = {(i.job_id, i.n) for i in store.incarnations() if i.state in LIVE}
            running = {(j.id, j.incarnation) for j in jobs.values() if j.state is JobState.RUNNING}
            history = "\n".join(f"{e.kind}: {e.message}" for e in store.events())
        really = set(job_processes(own_lab))
        assert len({job for job, _ in really}) == len(really), really  # no job runs twice
        assert really <= live, (really - live, history)  # no orphan: each copy is the store's
        assert running <= really, (running - really, history)  # no job lost: each one runs
        assert {j.name for j in jobs.values() if j.state is JobState.RUNNING} >= {
            "long-0",
            "long-1",
            "long-2",
        }
    finally:
        kill_job_processes(own_lab)


def whole_card_jobs(state: Path, tmp: Path, count: int) -> list[str]:
    body = f"command: {SLEEPER}\nresources: {{gpus: 1, mem_per_gpu: whole}}\ntier: spot\n"
    return [submit(state, tmp, f"whole-{i}", body) for i in range(count)]


def assert_each_card_held_once(lab: LabFleet, state: Path, ids: list[str], cards: int) -> None:
    with open_store(state, write=False) as store:
        assert check_invariants(store, capacity_mib=store.card_capacities()) == []
        holders = [(i.node, c) for i in store.incarnations(holding=True) for c in i.cards]
        history = "\n".join(f"{e.kind}: {e.message}" for e in store.events())
        assert len(holders) == len(set(holders)) == cards, history
        for job_id in ids:
            assert sum(i.state in LIVE for i in store.incarnations(job_id)) <= 1
    really = job_processes(lab)
    assert len(really) == cards and len({job for job, _ in really}) == cards


def test_two_gpuctl_reconciles_at_once_never_double_book_a_card(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    state, inventory = tmp_path / "state", own_lab.lab.inventory_path
    ids = whole_card_jobs(state, tmp_path, 6)  # for the lab's 4 cards
    try:
        both = [
            subprocess.Popen(
                gpuctl_argv(state, inventory, "reconcile", "--wait", "30"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=60) for p in both]
        assert [p.returncode for p in both] == [0, 0], outs  # the second waited its turn
        assert_each_card_held_once(own_lab, state, ids, cards=4)
    finally:
        kill_job_processes(own_lab)


class GatedStore:
    """A store whose first `begin_launch` waits until the other pass reaches its own: both
    passes then claim cards from the same view of the fleet."""

    def __init__(self, inner: Any, barrier: threading.Barrier) -> None:
        self.inner = inner
        self.barrier = barrier
        self.gated = False

    def begin_launch(self, *args: Any, **kwargs: Any) -> Any:
        if not self.gated:
            self.gated = True
            self.barrier.wait()
        return self.inner.begin_launch(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_two_passes_that_skip_the_loop_lock_are_kept_apart_by_the_store(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    """The loop lock is a file lock on one host; the store's own check is what keeps two hosts
    on one store (or a lock that failed) from double-booking."""
    state = tmp_path / "state"
    ids = whole_card_jobs(state, tmp_path, 6)
    open_store(state, write=True).close()
    settings = ReconcileSettings(grace_s=5.0, checkpoint_scan_s=0.0)
    inventory = Inventory(nodes=own_lab.specs(connect_timeout_s=1.0, command_timeout_s=4.0))
    barrier = threading.Barrier(2, timeout=30)
    reports: list[Any] = []

    def one_pass(k: int) -> None:
        with (
            SshTransport(own_known_hosts=tmp_path / f"kh{k}", system_known_hosts=()) as ssh,
            open_store(state, write=True) as raw,
        ):
            loop = Reconciler(
                GatedStore(raw, barrier),  # type: ignore[arg-type]
                Gatherer(ssh),
                SshJobRunner(ssh),
                inventory,
                SystemClock(),
                settings,
            )
            reports.append(run_pass(Pass(loop, None)))  # a pass without the loop lock

    try:
        threads = [threading.Thread(target=one_pass, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(reports) == 2
        refused = [a.message for r in reports for a in r.actions if a.outcome == "skipped"]
        assert refused, [a.message for r in reports for a in r.actions]  # a claim was refused
        assert_each_card_held_once(own_lab, state, ids, cards=4)
    finally:
        kill_job_processes(own_lab)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_corrupt_database_makes_every_mutating_command_refuse_and_is_left_as_it_is(
    lab: LabFleet, tmp_path: Path
) -> None:
    state, inventory = tmp_path / "state", lab.lab.inventory_path
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: sleeper\ncommand: {SLEEPER}\nresources: {{}}\n")
    assert gpuctl(state, inventory, "submit", str(spec)).returncode == 0
    db = state / "state.db"
    raw = bytearray(db.read_bytes())
    raw[4096 * 3 : 4096 * 3 + 8] = b"\xff" * 8  # a table's root page: SQLite's check sees it
    db.write_bytes(bytes(raw))
    before = digest(state)

    for args in (
        ("submit", "--replace", str(spec)),
        ("cancel", "sleeper", "--yes"),
        ("reconcile",),
        ("reconcile", "--watch", "--interval", "1"),
    ):
        done = gpuctl(state, inventory, *args, timeout_s=30)
        assert done.returncode == 6, (args, done.stdout, done.stderr)
        assert "hint: run `gpuctl db check`" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    checked = gpuctl(state, inventory, "db", "check")
    assert checked.returncode == 6 and "corrupt" in checked.stdout + checked.stderr
    assert digest(state) == before  # nothing repaired, replaced or started empty

    db.unlink()  # and a database that vanished where one existed
    gone = gpuctl(state, inventory, "submit", str(spec))
    assert gone.returncode == 6 and "missing" in gone.stderr, gone.stderr
    assert not db.exists()
