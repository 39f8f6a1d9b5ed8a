"""The fault tests' rig: a lab fleet, a state store, and the control loop run pass by pass in this
process (or `gpuctl` run as a subprocess), with the views a test needs to judge what happened:
the store, each incarnation's log on its node, and the job processes that really run.

Every wait polls with a deadline (`Rig.until`, `wait_for`); nothing sleeps to assert. Every test
ends with `Rig.check()`: the shared invariant checker (`gpuctl.ops.invariants`) on the store.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.protocols import Store
from gpuctl.adapters.ssh import SshTransport
from gpuctl.adapters.store import open_store
from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.jobs.model import Event, Incarnation, Job
from gpuctl.core.model import Inventory
from gpuctl.ops import jobs as service
from gpuctl.ops.gather import Gatherer
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.loop import PassReport, Reconciler, ReconcileSettings
from gpuctl.testing import waiting
from gpuctl.testing.lab import LabFleet

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
STEP = re.compile(r"^step (\d+) loss (\S+) incarnation (\d+)$", re.M)
T = TypeVar("T")


wait_for = functools.partial(waiting.wait_for, timeout_s=20.0, every_s=0.05)


def refuses(host: str, port: int) -> bool:
    """True when nothing listens on host:port. A connection to a free port in the ephemeral
    range can land on itself (the kernel picks that very port as its source, and TCP's
    simultaneous open connects it): such a connection is no listener, so it is tried again."""
    for _ in range(10):
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                if s.getsockname() != s.getpeername():
                    return False
        except ConnectionRefusedError:
            return True
    return False


def shared_dir(lab: LabFleet, name: str = "shared") -> Path:
    """A folder every lab node (one lab user, this machine's filesystem) can write."""
    folder = lab.dir / name
    folder.mkdir(mode=0o755, exist_ok=True)
    if os.geteuid() == 0:
        pw = pwd.getpwnam(lab.lab.user)
        os.chown(folder, pw.pw_uid, pw.pw_gid)
    return folder


def steps(log: str) -> list[tuple[int, str]]:
    """`examples/train.py`'s step lines: (step, loss) in order."""
    return [(int(m.group(1)), m.group(2)) for m in STEP.finditer(log)]


def train_losses(upto: int) -> dict[int, str]:
    """The loss `examples/train.py` logs at each step 1..upto, as it logs it: the same whether a
    run was interrupted and resumed or not (so a resumed log can be checked step by step)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpuctl_example_train", EXAMPLES / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    math = train.PlainMath(train.initial_weights())
    return {step: f"{math.step():.4f}" for step in range(1, upto + 1)}


def train_command(*, every: int = 5, step_s: float = 0.05, total: int = 100000) -> str:
    return (
        f"[{PYTHON}, train.py, --steps, '{total}', --checkpoint-every, '{every}',"
        f" --step-seconds, '{step_s}']"
    )


def committed_steps(folder: Path, incarnation: int | None = None) -> list[int]:
    """Steps with a `COMMITTED` marker in a checkpoint folder (of one incarnation, if given)."""
    import json

    found = []
    for marker in folder.glob("step-*/COMMITTED"):
        data = json.loads(marker.read_text())
        if incarnation is None or data.get("incarnation") == incarnation:
            found.append(int(data["step"]))
    return sorted(found)


# --- the processes that really run -------------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.startswith(b"GPUCTL_"):
            out[key.decode()] = value.decode("utf-8", "replace")
    return out


def _live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def job_processes(lab: LabFleet) -> dict[tuple[str, int], set[int]]:
    """Every live process of `lab`'s nodes that carries a job's contract environment, by
    (job id, incarnation): what really runs, whatever the store says."""
    mine = str(lab.dir) + "/"
    found: dict[tuple[str, int], set[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        job, inc = env.get("GPUCTL_JOB_ID"), env.get("GPUCTL_INCARNATION")
        if not (job and inc and inc.isdigit()):
            continue
        if env.get("GPUCTL_LAB_STATE", "").startswith(mine) and _live(pid):
            found.setdefault((job, int(inc)), set()).add(pid)
    return found


def running_copies(lab: LabFleet, job_id: str) -> list[int]:
    """The incarnations of `job_id` with a live process on some node of `lab`."""
    return sorted(n for (job, n) in job_processes(lab) if job == job_id)


def kill_job_processes(lab: LabFleet) -> None:
    """SIGKILL every job process on `lab`'s nodes (a test's clean-up)."""
    for pids in job_processes(lab).values():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class InvariantsBroken(AssertionError):
    """`check_invariants` found problems in the store."""


# --- the rig -----------------------------------------------------------------------------------


class Rig:
    """A lab, a store in `tmp/state`, and the control loop over them, in this process."""

    def __init__(
        self,
        lab: LabFleet,
        tmp: Path,
        transport: SshTransport,
        settings: ReconcileSettings,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.lab = lab
        self.tmp = tmp
        self.state_dir = tmp / "state"
        self.store: Store = open_store(self.state_dir, write=True)
        # short deadlines: a partitioned node's open connection stalls until its command's deadline
        self.inventory = Inventory(nodes=lab.specs(connect_timeout_s=1.0, command_timeout_s=4.0))
        self.specs = self.inventory.by_name()
        self.runner = SshJobRunner(transport)
        self.shared = shared_dir(lab)
        self.loop = Reconciler(
            self.store,
            Gatherer(transport),
            self.runner,
            self.inventory,
            SystemClock(),
            settings,
            environ=environ,
            state_dir=str(self.state_dir),
        )
        self.reports: list[PassReport] = []

    # jobs

    def submit(self, name: str, body: str, env: Mapping[str, str] | None = None) -> Job:
        """Queue the job spec `name: NAME` + `body` (YAML), as `gpuctl submit` does."""
        spec = self.tmp / f"{name}.yaml"
        spec.write_text(f"name: {name}\n{body}")
        (job,) = service.submit(
            self.store, load_specs([spec]), actor="test", clock=SystemClock(), env=env or {}
        )
        return job

    def train(self, name: str, *, sync: str = "shared", every: int = 5, extra: str = "") -> Job:
        """`examples/train.py` on an 8 GiB slice, a step every 0.05 s, a checkpoint every
        `every` steps; checkpoints on the shared folder, or on the node (`sync: pull`)."""
        folder = f"{self.shared}/{{job_id}}" if sync == "shared" else "~/ckpt/{job_id}"
        return self.submit(
            name,
            f"command: {train_command(every=every)}\n"
            f"workdir: {EXAMPLES}\n"
            "resources: {gpus: 1, mem_per_gpu: 8GiB}\n"
            f"checkpoint: {{dir: '{folder}', sync: {sync}}}\n"
            "env: {PYTHONDONTWRITEBYTECODE: '1'}\n"
            "grace_s: 3\n" + extra,
        )

    def job(self, job_id: str) -> Job:
        found = self.store.job(job_id)
        assert found is not None, job_id
        return found

    def incs(self, job_id: str) -> list[Incarnation]:
        return self.store.incarnations(job_id)

    def inc(self, job_id: str, n: int) -> Incarnation:
        return next(i for i in self.incs(job_id) if i.n == n)

    def events(
        self, job_id: str | None = None, kind: str | None = None, *, node: str | None = None
    ) -> list[Event]:
        kinds = None if kind is None else [kind]
        found = self.store.events(job_id=job_id, kinds=kinds)
        return [e for e in found if node is None or e.node == node]

    def history(self, job_id: str | None = None) -> str:
        """What the store's audit log says, for assertion messages."""
        return "\n".join(f"{e.kind}: {e.message}" for e in self.store.events(job_id=job_id))

    # the loop

    def run_pass(self) -> PassReport:
        report = self.loop.run_once()
        self.reports.append(report)
        return report

    def until(self, probe: Callable[[], T], what: str, timeout_s: float = 30.0) -> T:
        """Pass after pass until `probe` is truthy; fails with the audit log at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.run_pass()
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s:g}s\n{self.history()}")
            time.sleep(0.05)

    def running(self, job_id: str, n: int) -> bool:
        found = self.store.job(job_id)
        inc = [i for i in self.incs(job_id) if i.n == n]
        return (
            found is not None
            and found.incarnation == n
            and found.state == "running"
            and bool(inc)
            and inc[0].state == "running"
        )

    # nodes

    def log(self, job_id: str, n: int) -> str:
        """Incarnation `n`'s log, read from its node's files (a dead node's too)."""
        inc = self.inc(job_id, n)
        home = self.lab.lab.node_dir(inc.node) / "home"
        path = home / ".gpuctl" / "runs" / job_id / str(n) / "log"
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def node_home(self, node: str) -> Path:
        return self.lab.lab.node_dir(node) / "home"

    def kill_incarnation(self, job_id: str, n: int) -> None:
        """SIGKILL the incarnation's process group on its node (the job crashes hard)."""
        pgid = self.inc(job_id, n).pid
        assert pgid is not None
        os.killpg(pgid, signal.SIGKILL)

    def check(self) -> None:
        """The shared invariants hold (no job lost, one live incarnation at most, no card
        double-booked, each restart resumed from the last committed checkpoint)."""
        problems = check_invariants(self.store, capacity_mib=self.store.card_capacities())
        if problems:
            raise InvariantsBroken("\n".join(problems) + "\n" + self.history())

    def copies(self, job_id: str) -> list[int]:
        return running_copies(self.lab, job_id)

    def close(self) -> None:
        kill_job_processes(self.lab)
        self.store.close()


@contextlib.contextmanager
def rig(
    lab: LabFleet,
    tmp: Path,
    *,
    grace_s: float = 1.5,
    environ: Mapping[str, str] | None = None,
    **settings: object,
) -> Iterator[Rig]:
    """A `Rig` over `lab`; every job process is killed after, however the test ends."""
    merged: dict[str, object] = {"grace_s": grace_s, "checkpoint_scan_s": 0.0, **settings}
    with SshTransport(own_known_hosts=tmp / "own_known_hosts", system_known_hosts=()) as ssh:
        r = Rig(lab, tmp, ssh, ReconcileSettings(**merged), environ)  # type: ignore[arg-type]
        try:
            yield r
        finally:
            r.close()


# --- gpuctl as a subprocess ----------------------------------------------------------------------

CLI = "import sys; from gpuctl.cli.main import run; sys.argv[0] = 'gpuctl'; run()"


def gpuctl_argv(state_dir: Path, inventory: Path | None, *args: str) -> list[str]:
    argv = [sys.executable, "-c", CLI, "--state-dir", str(state_dir)]
    if inventory is not None:
        argv += ["-i", str(inventory)]
    return [*argv, *args]


def gpuctl(
    state_dir: Path,
    inventory: Path | None,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run `gpuctl --state-dir STATE [-i INVENTORY] ARGS...` and wait for it."""
    return subprocess.run(
        gpuctl_argv(state_dir, inventory, *args),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
        check=False,
    )


# --- job scripts ---------------------------------------------------------------------------------

SLOW_SAVE = """\
# A job that checkpoints every 5 steps with gpuctl.checkpoint; incarnation 1 hangs in the middle
# of writing the checkpoint of step $SLOW_AT (its files half written), so a test can kill it there.
import json, os, sys, time
sys.path.insert(0, os.environ["REPO"])
from gpuctl.checkpoint import Checkpointer

ckpt = Checkpointer(every=5)
loaded = ckpt.latest()
step = json.loads(loaded.read("state.json"))["step"] if loaded else 0
print(f"resumed from step {step}" if loaded else "starting fresh", flush=True)
slow_at = int(os.environ["SLOW_AT"])
while True:
    time.sleep(0.05)
    step += 1
    print(f"step {step} loss 0 incarnation {ckpt.incarnation}", flush=True)
    if ckpt.should_checkpoint(step):
        def write(folder, step=step):
            (folder / "state.json").write_text(json.dumps({"step": step}))
            if step == slow_at and ckpt.incarnation == 1:
                (folder / "weights.bin").write_bytes(b"half")
                print(f"writing checkpoint {step}", flush=True)
                time.sleep(600)
        ckpt.save(step, write)
"""
