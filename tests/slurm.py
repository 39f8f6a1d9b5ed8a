"""A real Slurm for the tests: Debian 12's munged, slurmctld and slurmd (22.05.8), all state in a
temporary folder, on loopback, ports chosen free.

- munged runs with its own key and socket (`AuthInfo=socket=...`), as the unprivileged system
  user `gpuctl-slurm` when the tests run as root; slurmctld runs as that user (`SlurmUser`).
- One slurmd per lab node, started with `slurmd -N <node>`: Debian's build runs several slurmd on
  one host (each node its own `Port=`, all with this host's `NodeHostName`). slurmd runs as root
  (it starts jobs as their users); jobs are submitted as `gpuctl-slurm`.
- GPUs are GRES `gpu:<type>:<n>` on character device files the harness makes (`mknod`, major 195
  like nvidia's; nothing opens them), `AutoDetect=off`. NVML comes from the lab's fake nvidia-smi.
- cgroup/v1 where the host mounts v1 controllers (cgroup/v2 otherwise); proctrack/pgid, no task
  plugin, no accounting (slurmdbd) and no slurmrestd.

Missing binaries fail the tests with the command that installs them (`make deps`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

SLURM_USER = "gpuctl-slurm"
BINARIES = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch")
START_DEADLINE_S = 30.0
GPU_TYPE = "h100"


def require_binaries() -> None:
    missing = [b for b in BINARIES if not Path(b).exists()]
    if missing:
        pytest.fail(
            f"Slurm is not installed ({', '.join(missing)} missing): run `make deps` (it installs "
            "Debian's slurmctld, slurmd, slurm-client and munge)",
            pytrace=False,
        )


def _user() -> pwd.struct_passwd | None:
    """The unprivileged user the daemons run as (created when missing); None: not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SLURM_USER)
    except KeyError:
        subprocess.run(
            ["/usr/sbin/useradd", "--system", "--user-group", "--no-create-home", SLURM_USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SLURM_USER)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class SlurmCluster:
    """A running cluster: its folder, `slurm.conf`, node names, and the daemons' pids."""

    dir: Path
    nodes: tuple[str, ...]
    procs: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, as_user: bool = False, check: bool = True) -> str:
        """A Slurm command against this cluster (as `gpuctl-slurm` with `as_user`)."""
        prefix = ["runuser", "-u", SLURM_USER, "--"] if as_user and os.geteuid() == 0 else []
        done = subprocess.run(
            [*prefix, *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            cwd=self.dir,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def sbatch(self, *options: str) -> str:
        """Submit a job as `gpuctl-slurm`; its id."""
        out = self.run("sbatch", "--parsable", "-o", "/dev/null", *options, as_user=True)
        return out.strip().split(";")[0]

    def node_state(self, name: str) -> str:
        return self.run("sinfo", "-h", "-N", "-n", name, "-o", "%T").strip()

    def job_state(self, job_id: str) -> str:
        return self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).strip()

    def log(self, name: str) -> str:
        path = self.dir / "log" / name
        return path.read_text(errors="replace") if path.exists() else ""


def _write_configs(root: Path, nodes: Sequence[str], gpus: int, cpus: int) -> None:
    user = _user()
    host = socket.gethostname()
    ctld_port, slurmd_ports = free_port(), [free_port() for _ in nodes]
    cgroup = "cgroup/v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "cgroup/v1"
    lines = [
        "ClusterName=gpuctltest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmUser={user.pw_name if user else pwd.getpwuid(os.geteuid()).pw_name}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'run' / 'munge.sock'}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run'}/slurmd-%n.pid",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log'}/slurmd-%n.log",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=2",
        "MpiDefault=none",
        "SlurmdTimeout=30",
    ]
    gres = ["AutoDetect=off"]
    dev = root / "dev"
    for name, port in zip(nodes, slurmd_ports, strict=True):
        lines.append(
            f"NodeName={name} NodeAddr=127.0.0.1 NodeHostName={host} Port={port} CPUs={cpus} "
            f"RealMemory=1000 Gres=gpu:{GPU_TYPE}:{gpus} Feature=lab,{GPU_TYPE} State=UNKNOWN"
        )
        (dev / name).mkdir(parents=True)
        for i in range(gpus):
            path = dev / name / f"nvidia{i}"
            if os.geteuid() == 0:
                os.mknod(path, 0o666 | 0o020000, os.makedev(195, i))  # a character device
            else:
                path.touch()  # slurmd logs that it is not a device, and still counts it
        gres.append(
            f"NodeName={name} Name=gpu Type={GPU_TYPE} File={dev / name}/nvidia[0-{gpus - 1}]"
        )
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    (root / "slurm.conf").write_text("\n".join(lines) + "\n")
    (root / "gres.conf").write_text("\n".join(gres) + "\n")
    (root / "cgroup.conf").write_text(f"CgroupPlugin={cgroup}\nIgnoreSystemd=yes\n")


def _wait(what: str, check: object, deadline_s: float, cluster: SlurmCluster) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if callable(check) and check():
            return
        time.sleep(0.2)
    logs = [f"{n}:\n{cluster.log(n)[-1500:]}" for n in ("slurmctld.log", "munged.log")]
    logs += [f"slurmd {n}:\n{cluster.log(f'slurmd-{n}.log')[-1500:]}" for n in cluster.nodes]
    raise AssertionError(f"Slurm: {what} within {deadline_s:g}s\n" + "\n".join(logs))


@contextlib.contextmanager
def slurm_cluster(
    nodes: Sequence[str], *, gpus: int = 4, parent: Path = Path("/tmp")
) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and one slurmd per node in a fresh folder under `parent`; stop
    them (jobs cancelled, job steps killed) and remove the folder after."""
    require_binaries()
    root = Path(tempfile.mkdtemp(prefix="gpuctl-slurm-", dir=parent))
    cluster = SlurmCluster(root, tuple(nodes))
    try:
        root.chmod(0o755)
        user = _user()
        for sub, mode in (("etc", 0o700), ("run", 0o755), ("state", 0o700), ("log", 0o1777)):
            (root / sub).mkdir(mode=mode)
            (root / sub).chmod(mode)
        (root / "spool").mkdir()
        for n in nodes:
            (root / "spool" / n).mkdir()
        key = root / "etc" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        if user is not None:
            for path in (root / "etc", key, root / "run", root / "state"):
                os.chown(path, user.pw_uid, user.pw_gid)
        _write_configs(root, nodes, gpus, os.cpu_count() or 1)  # slurmd checks the count
        as_user = ["runuser", "-u", SLURM_USER, "--"] if user is not None else []
        munged = subprocess.Popen(
            [
                *as_user,
                "/usr/sbin/munged",
                "--foreground",
                f"--key-file={key}",
                f"--socket={root / 'run' / 'munge.sock'}",
                f"--pid-file={root / 'run' / 'munged.pid'}",
                f"--log-file={root / 'log' / 'munged.log'}",
                f"--seed-file={root / 'etc' / 'munged.seed'}",
                "--num-threads=2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        cluster.procs.append(munged)
        _wait("munged up", (root / "run" / "munge.sock").exists, 10, cluster)
        ctld = subprocess.Popen(
            [*as_user, "/usr/sbin/slurmctld", "-D", "-i"],
            env=cluster.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        cluster.procs.append(ctld)
        _wait("slurmctld answers", lambda: _answers(cluster), START_DEADLINE_S, cluster)
        for n in nodes:
            slurmd = subprocess.Popen(
                ["/usr/sbin/slurmd", "-D", "-N", n],
                env=cluster.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            cluster.procs.append(slurmd)
        _wait("every node idle", lambda: _all_idle(cluster), START_DEADLINE_S, cluster)
        yield cluster
    finally:
        _stop(cluster)
        shutil.rmtree(root, ignore_errors=True)


def _answers(cluster: SlurmCluster) -> bool:
    done = subprocess.run(
        ["scontrol", "ping"], env=cluster.env, capture_output=True, text=True, check=False
    )
    return "UP" in done.stdout


def _all_idle(cluster: SlurmCluster) -> bool:
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=False,
    )
    states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
    return len(states) == len(cluster.nodes) and all(s == "idle" for s in states.values())


def _stop(cluster: SlurmCluster) -> None:
    """Cancel every job, stop the daemons this harness started (by pid), then kill what is left
    of the job steps (slurmstepd outlives slurmd) by their spool folder under this cluster."""
    with contextlib.suppress(Exception):
        subprocess.run(
            ["scancel", "--full", "--user", SLURM_USER],
            env=cluster.env,
            capture_output=True,
            timeout=10,
            check=False,
        )
    for proc in reversed(cluster.procs):
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
    for proc in reversed(cluster.procs):
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pid in _steps(cluster.dir):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL) if _is_leader(pid) else os.kill(pid, signal.SIGKILL)


def _steps(root: Path) -> list[int]:
    """Pids of processes whose command line or working folder is under `root` (job steps)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if (
            str(root) in cmd
            or cwd.startswith(str(root))
            or ("slurmstepd" in cmd and _ours(entry, root))
        ):
            out.append(int(entry.name))
    return out


def _ours(entry: Path, root: Path) -> bool:
    try:
        environ = (entry / "environ").read_bytes()
    except OSError:
        return False
    return str(root).encode() in environ


def _is_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False
