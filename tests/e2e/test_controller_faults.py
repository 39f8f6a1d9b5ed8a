"""Issue 12, point 5: faults on real processes. Two `gpuctl controller run` subprocesses (two
state dirs, one database on the real PostgreSQL of tests/pg.py) over a lab fleet of real sshd:

- the leader SIGKILLed at seeded moments of a pass (the test hook's named points, one per round:
  `gpuctl.ops.controller_pause`): the standby leads within the lease and one pass, no job is lost
  or started twice (each job writes a line to a shared file when it starts), and the fleet check
  (`db check --fleet`'s) is clean after each kill;
- the leader SIGSTOPped past its lease, anywhere or inside a write transaction, then SIGCONTed:
  the standby leads meanwhile, and the old leader's next write is refused: it steps down in one
  line;
- PostgreSQL restarted in the middle of a pass: the controller retries with back-off and goes on,
  nothing half-written;
- PostgreSQL unreachable at start, or holding a newer schema: `controller run` exits 6 in one line.

`GPUCTL_CONTROLLER_SEED` and `GPUCTL_CONTROLLER_ROUNDS` change the kills (default 20 rounds);
`GPUCTL_CONTROLLER_REPORT=FILE` writes the points and takeover times of a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.ssh import SshTransport
from gpuctl.adapters.store import schema
from gpuctl.adapters.store.postgres import PostgresStore, open_url
from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.jobs.model import JobState
from gpuctl.core.model import Inventory
from gpuctl.errors import ExitCode
from gpuctl.ops import jobs as service
from gpuctl.ops.controller_pause import POINTS
from gpuctl.ops.fleetcheck import check_fleet
from gpuctl.testing import waiting
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import gpuctl, gpuctl_argv, job_processes, kill_job_processes, shared_dir
from tests.pg import Server

pytestmark = pytest.mark.e2e

LEASE_S = 3.0
RENEW_S = 1.0
INTERVAL_S = 1.0
# a standby leads within the lease and one pass of the dead leader's; the margin is for a
# loaded test machine (a process scheduled late, a pass slowed down)
TAKEOVER_BOUND_S = LEASE_S + INTERVAL_S + 4.0
DEADLINE_S = 40.0
LEADING = re.compile(r"^leading \(token (\d+),", re.M)
HOLDER = re.compile(r"^controller (\S+) starting", re.M)


def until(
    probe: Callable[[], object], what: str | Callable[[], str], timeout_s: float = DEADLINE_S
) -> None:
    """Poll `probe` until it is truthy; fail saying `what` at the deadline."""
    if not waiting.wait_for(probe, timeout_s=timeout_s, every_s=0.02):
        raise AssertionError(f"not within {timeout_s:g}s: {what() if callable(what) else what}")


class Ctl:
    """One `gpuctl controller run` subprocess; its stderr goes to a file the test reads."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        url: str,
        inventory: Path,
        pause: str | None = None,
        resume: Path | None = None,
        lease_s: float = LEASE_S,
    ) -> None:
        self.name = name
        self.err = tmp / f"{name}.err"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCTL_TEST_")}
        env["GPUCTL_STATE_URL"] = url
        if pause is not None:
            env["GPUCTL_TEST_PAUSE_AT"] = pause
        if resume is not None:
            env["GPUCTL_TEST_RESUME"] = str(resume)
        argv = gpuctl_argv(tmp / f"state-{name}", inventory, "controller", "run")
        argv += ["--lease", str(lease_s), "--renew", str(RENEW_S)]
        argv += ["--interval", str(INTERVAL_S)]
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env
            )

    def text(self) -> str:
        return self.err.read_text(errors="replace")

    def said(self, needle: str) -> bool:
        return needle in self.text()

    def wait_said(self, needle: str, what: str, timeout_s: float = DEADLINE_S) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None and not self.said(needle):
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.text()}")
            return self.said(needle)

        until(seen, lambda: f"{what}\n{self.text()}", timeout_s)

    def is_(self, holder: str) -> bool:
        match = HOLDER.search(self.text())
        return match is not None and match.group(1) == holder

    def token(self) -> int | None:
        found = LEADING.findall(self.text())
        return int(found[-1]) if found else None

    @property
    def holder(self) -> str:
        self.wait_said(" starting (lease", f"{self.name} starting")
        match = HOLDER.search(self.text())
        assert match is not None, self.text()
        return match.group(1)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.kill()


class Fleet:
    """The lab, the database, what the test submits and what really ran."""

    def __init__(self, lab: LabFleet, tmp: Path, url: str, transport: SshTransport) -> None:
        self.lab, self.tmp, self.url = lab, tmp, url
        self.inventory_path = lab.lab.inventory_path
        self.inventory = Inventory(nodes=lab.specs(connect_timeout_s=2.0, command_timeout_s=8.0))
        self.runner = SshJobRunner(transport)
        self.starts = shared_dir(lab) / "starts"
        self.store: PostgresStore = open_url(url, write=True)
        self.ctls: list[Ctl] = []
        self.submitted: list[str] = []

    def controller(
        self, pause: str | None = None, *, resume: Path | None = None, lease_s: float = LEASE_S
    ) -> Ctl:
        name = f"ctl{len(self.ctls)}"
        ctl = Ctl(self.tmp, name, self.url, self.inventory_path, pause, resume, lease_s)
        self.ctls.append(ctl)
        return ctl

    def submit(self, seconds: float = 2.0) -> str:
        """A job that says it started (its id and incarnation, a line in a shared file), then
        sleeps `seconds` and exits 0."""
        name = f"j{len(self.submitted)}"
        spec = self.tmp / f"{name}.yaml"
        line = f'echo "$GPUCTL_JOB_ID $GPUCTL_INCARNATION" >> {self.starts}; exec sleep {seconds}'
        spec.write_text(
            f"name: {name}\n"
            f"command: [sh, -c, {json.dumps(line)}]\n"
            "resources: {gpus: 1, mem_per_gpu: 1GiB}\n"
        )
        (job,) = service.submit(self.store, load_specs([spec]), actor="test", clock=SystemClock())
        self.submitted.append(job.id)
        return job.id

    def started(self) -> Counter[str]:
        """How many times each job started on a node (whatever the store says)."""
        try:
            lines = self.starts.read_text().split()
        except FileNotFoundError:
            return Counter()
        return Counter(lines[0::2])

    def never_twice(self, where: str) -> None:
        twice = {job: n for job, n in self.started().items() if n > 1}
        assert not twice, f"{where}: started more than once: {twice}\n{self.history()}"
        live: dict[str, list[int]] = {}
        for job, inc in job_processes(self.lab):
            live.setdefault(job, []).append(inc)
        copies = {job: incs for job, incs in live.items() if len(incs) > 1}
        assert not copies, f"{where}: live copies {copies}\n{self.history()}"

    def fleet_clean(self, where: str, store: PostgresStore | None = None) -> None:
        found = check_fleet(store or self.store, self.inventory, self.runner)
        assert found.clean, f"{where}: {found.problems} {found.unreadable}\n{self.history()}"

    def leader(self) -> Ctl | None:
        """The controller holding the live lease (from the store)."""
        lease = self.store.lease()
        if lease is None or not lease.live:
            return None
        return next((c for c in self.ctls if c.proc.poll() is None and c.is_(lease.holder)), None)

    def paused_leader(self, points: dict[str, str], start: Callable[[], Ctl], where: str) -> Ctl:
        """The leader, once it stopped at its point, with a standby ready beside it (another
        live controller that registered and is not stopped at a point: one is started when
        none is left, the lease having gone by itself to the one that was to stand by)."""
        found: list[Ctl] = []

        def ready() -> bool:
            leader = self.leader()
            others = [
                c
                for c in self.ctls
                if c is not leader and c.proc.poll() is None and not c.said("paused at")
            ]
            if leader is not None and not others:
                others.append(start())
            found[:] = [leader] if leader is not None else []
            return (
                leader is not None
                and leader.said(f"paused at {points[leader.name]}")
                and any(c.said("standby:") for c in others)
            )

        until(ready, lambda: f"{where}: the leader stopping at its point\n{self.outputs()}")
        return found[0]

    def led_after(self, token: int) -> bool:
        lease = self.store.lease()
        return lease is not None and lease.live and lease.token > token

    def outputs(self) -> str:
        return "\n".join(f"--- {c.name}:\n{c.text()}" for c in self.ctls[-4:])

    def history(self) -> str:
        events = self.store.events()
        return "\n".join(f"{e.actor} {e.kind}: {e.message}" for e in events[-40:])

    def close(self) -> None:
        for ctl in self.ctls:
            ctl.stop()
        kill_job_processes(self.lab)
        self.store.close()


@pytest.fixture
def fleet(own_lab: LabFleet, tmp_path: Path, pg_url: str) -> Iterator[Fleet]:
    with SshTransport(own_known_hosts=tmp_path / "own_known_hosts", system_known_hosts=()) as ssh:
        f = Fleet(own_lab, tmp_path, pg_url, ssh)
        try:
            yield f
        finally:
            f.close()


def plan_kills(seed: int, rounds: int) -> list[str]:
    """A pause point per round, each point as often as the others, in a seeded order. Inside a
    transaction is left to its own test: stopped there, a leader's renewals wait behind it and
    its lease runs out before it is killed."""
    rng = random.Random(seed)
    kinds = [p for p in POINTS if p != "in_transaction"]
    points = [kinds[i % len(kinds)] for i in range(rounds)]
    rng.shuffle(points)
    return points


def test_the_standby_leads_within_the_lease_after_each_kill_and_no_job_runs_twice(
    fleet: Fleet,
) -> None:
    """Each controller is started with the next point of the plan: once it leads, it stops
    there and is killed. Who leads is read from the store: a leader starved past its lease on a
    loaded machine loses it by itself, and the round kills whoever took it."""
    seed = int(os.environ.get("GPUCTL_CONTROLLER_SEED", "12"))
    rounds = int(os.environ.get("GPUCTL_CONTROLLER_ROUNDS", "20"))
    plan = plan_kills(seed, rounds)
    points: dict[str, str] = {}  # controller name -> its point ("": none, it runs on)

    def start() -> Ctl:
        k = len(fleet.ctls)
        ctl = fleet.controller(f"{plan[k]}@1" if k < rounds else None)
        points[ctl.name] = plan[k] if k < rounds else ""
        return ctl

    start().wait_said("leading (token 1,", "the first controller leading")
    start()
    fleet.submit()
    killed_at: list[str] = []
    takeovers: list[float] = []
    for i in range(rounds):
        where = f"round {i + 1} of {rounds} (seed {seed}, killed so far at {killed_at})"
        leader = fleet.paused_leader(points, start, where)
        point = points[leader.name]
        where = f"{where}: {leader.name} at {point}"
        fleet.never_twice(where)
        fleet.fleet_clean(where)
        lease = fleet.store.lease()
        assert lease is not None

        leader.kill()
        killed = time.monotonic()
        killed_at.append(point)
        fleet.submit()  # work for the new leader's first passes
        until(
            lambda lease=lease: fleet.led_after(lease.token),
            lambda where=where: f"{where}: a standby leading\n{fleet.outputs()}",
        )
        takeovers.append(time.monotonic() - killed)
        assert takeovers[-1] <= TAKEOVER_BOUND_S, f"{where}: took {takeovers[-1]:.1f}s"
        if len(fleet.ctls) < rounds + 1:
            start()

    # the last leader runs on without a pause: every job submitted ends, each started once
    last = [c for c in fleet.ctls if not points[c.name]] or [start()]
    for ctl in fleet.ctls:
        if points[ctl.name]:
            ctl.stop()
    until(lambda: fleet.leader() in last, lambda: f"the last controller leading\n{fleet.outputs()}")

    def all_done() -> bool:
        jobs = fleet.store.jobs()
        return len(jobs) == len(fleet.submitted) and all(
            j.state is JobState.SUCCEEDED for j in jobs
        )

    until(all_done, lambda: f"every job done\n{fleet.history()}", 60.0)
    assert fleet.started() == Counter(dict.fromkeys(fleet.submitted, 1)), fleet.history()
    for ctl in fleet.ctls:
        if ctl.proc.poll() is None:
            ctl.signal(signal.SIGTERM)
            ctl.proc.wait(timeout=30)
    checked = gpuctl(
        fleet.tmp / "checker",
        fleet.inventory_path,
        "db",
        "check",
        "--fleet",
        env={"GPUCTL_STATE_URL": fleet.url},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    if "GPUCTL_CONTROLLER_REPORT" in os.environ:
        Path(os.environ["GPUCTL_CONTROLLER_REPORT"]).write_text(
            json.dumps({"seed": seed, "killed_at": killed_at, "takeover_s": takeovers}) + "\n"
        )


def test_a_leader_stopped_past_its_lease_is_refused_its_next_write_and_steps_down(
    fleet: Fleet,
) -> None:
    old = fleet.controller()
    old.wait_said("leading (token 1,", "the first controller leading")
    new = fleet.controller()
    new.wait_said("standby:", "a standby")
    old.signal(signal.SIGSTOP)
    job = fleet.submit(30.0)  # for the new leader: the stopped one must never start it
    new.wait_said("leading (token 2,", "the standby leading")
    fleet.fleet_clean("the standby leading")
    until(lambda: fleet.started()[job] == 1, "the job started by the new leader")
    old.signal(signal.SIGCONT)
    line = f"lost the lease to {new.holder} (token 2 > 1): stepping down"
    old.wait_said(line, "the old leader stepping down")
    old.wait_said(f"standby: {new.holder} leads (token 2)", "the old leader standing by")
    assert old.text().count("stepping down") == 1, old.text()
    fleet.never_twice("after SIGCONT")
    fleet.fleet_clean("after SIGCONT")


def test_a_leader_stopped_inside_a_transaction_does_not_keep_the_standby_out(
    fleet: Fleet,
) -> None:
    resume = fleet.tmp / "resume"
    old = fleet.controller("in_transaction@1", resume=resume)
    old.wait_said("leading (token 1,", "the first controller leading")
    new = fleet.controller()
    new.wait_said("standby:", "a standby")
    job = fleet.submit(30.0)
    old.wait_said("paused at in_transaction", "the leader inside its launch's transaction")
    old.signal(signal.SIGSTOP)  # the lease's row and the job's stay locked by its transaction
    stopped = time.monotonic()
    new.wait_said("leading (token 2,", "the standby leading", timeout_s=TAKEOVER_BOUND_S + 5)
    assert time.monotonic() - stopped <= TAKEOVER_BOUND_S, new.text()
    until(lambda: fleet.started()[job] == 1, "the job started by the new leader")
    resume.touch()
    old.signal(signal.SIGCONT)
    old.wait_said("stepping down", "the old leader stepping down")
    assert f"lost the lease to {new.holder} (token 2 > 1): stepping down" in old.text()
    fleet.never_twice("after SIGCONT")
    fleet.fleet_clean("after SIGCONT")
    assert fleet.started() == Counter({job: 1})


def test_postgresql_restarted_mid_pass_the_controller_backs_off_and_goes_on(
    fleet: Fleet, pg_server: Server
) -> None:
    resume = fleet.tmp / "resume"
    # a lease long enough to outlast the restart: the controller keeps it throughout
    ctl = fleet.controller("in_transaction@1", resume=resume, lease_s=15.0)
    ctl.wait_said("leading (token 1,", "the controller leading")
    job = fleet.submit(30.0)
    ctl.wait_said("paused at in_transaction", "the launch's intent being written")
    pg_server.restart()  # the launch's transaction dies with the server's sessions
    resume.touch()
    ctl.wait_said("the store failed:", "the controller told the store failed")
    told = next(line for line in ctl.text().splitlines() if "the store failed:" in line)
    assert "lost the connection to the state store" in told and "trying again in" in told
    fleet.store.close()
    with open_url(fleet.url, write=False) as store:

        def running() -> bool:
            found = store.job(job)
            return found is not None and found.state is JobState.RUNNING

        until(running, lambda: f"the job running\n{ctl.text()}")
        until(lambda: fleet.started()[job] == 1, "the job started on its node")
        assert fleet.started() == Counter({job: 1})
        assert len(store.incarnations(job)) == 1  # the intent rolled back, written once more
        fleet.never_twice("after the restart")
        fleet.fleet_clean("after the restart", store)
        lease = store.lease()
        assert lease is not None and lease.live and lease.token == 1, ctl.text()
    assert ctl.proc.poll() is None and "Traceback" not in ctl.text()
    assert "stepping down" not in ctl.text()
    fleet.store = open_url(fleet.url, write=True)  # closed by the fixture


def _inventory(tmp: Path) -> Path:
    path = tmp / "inventory.yaml"
    path.write_text("nodes:\n  - {name: n1, host: 127.0.0.1, port: 1}\n")
    return path


def test_postgresql_unreachable_at_start_exits_6_naming_the_host_never_the_password(
    tmp_path: Path,
) -> None:
    passfile = tmp_path / "pgpass"
    passfile.write_text("127.0.0.1:1:*:gpuctl:hunter2-secret\n")
    passfile.chmod(0o600)
    done = gpuctl(
        tmp_path / "state",
        _inventory(tmp_path),
        "controller",
        "run",
        env={
            "GPUCTL_STATE_URL": "postgresql://gpuctl@127.0.0.1:1/gpuctl",
            "PGPASSFILE": str(passfile),
        },
        timeout_s=60,
    )
    assert done.returncode == ExitCode.STATE, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("error: PostgreSQL at 127.0.0.1:1/gpuctl: cannot connect"), done.stderr
    assert "hunter2" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_a_newer_schema_in_the_database_is_refused(pg_url: str, tmp_path: Path) -> None:
    open_url(pg_url, write=True).close()
    newer = schema.latest_version() + 1
    with open_url(pg_url, write=True) as store:
        store._pg.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(newer),))
    done = gpuctl(
        tmp_path / "state",
        _inventory(tmp_path),
        "controller",
        "run",
        env={"GPUCTL_STATE_URL": pg_url},
        timeout_s=60,
    )
    assert done.returncode == ExitCode.STATE, done.stderr
    assert f"schema version {newer} is newer than this gpuctl knows" in done.stderr.splitlines()[0]
    assert "Traceback" not in done.stderr
