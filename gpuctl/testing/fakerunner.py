"""A scripted fleet for control-loop tests: nodes, their job processes and their checkpoints.

`FakeCluster` holds the truth; `FakeRunner` (a `JobRunner`) and `FakeFleet` (what the loop
gathers) read and change it. A test scripts node behaviour on the cluster: a job exits
(`finish`), a node stops answering while its jobs keep running (`partition`), a node dies with its
jobs (`kill_node`), a node answers again (`heal`), a process uses GPU memory (`use`), a job writes
a committed checkpoint (`commit`). `ManualClock` is a clock a test advances.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gpuctl.core.jobs.model import (
    CheckpointMarker,
    CommitSeen,
    Fenced,
    JobProcess,
    LaunchRequest,
    RunStatus,
)
from gpuctl.core.model import (
    FleetSnapshot,
    GpuProcess,
    GpuSnapshot,
    Inventory,
    NodeFacts,
    NodeSnapshot,
    NodeSpec,
    NodeState,
    Observation,
    Reach,
)
from gpuctl.errors import GpuctlError, Unreachable

GIB = 1024


class ManualClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def sleep(self, seconds: float) -> None:
        """A wait on this clock moves it on (`gpuctl.ops.parts.sleep_of`): a migration driven
        by a test polls without waiting in real time."""
        self.advance(seconds)


@dataclasses.dataclass
class FakeRun:
    """One incarnation's process on a node."""

    request: LaunchRequest
    pid: int
    run_dir: str
    started_at: float
    alive: bool = True
    exit_code: int | None = None
    used_mib: int | None = None  # GPU memory per granted card; None: not on the GPU yet
    on_term: str = "exit"  # "exit" (checkpoint and exit 0 within the grace) or "ignore"
    signals: list[str] = dataclasses.field(default_factory=list)
    listed: bool = True  # its run dir is there (False: deleted, the process may live on)

    @property
    def key(self) -> tuple[str, int]:
        return (self.request.job_id, self.request.incarnation)

    def status(self) -> RunStatus:
        return RunStatus(
            job_id=self.request.job_id,
            incarnation=self.request.incarnation,
            pid=self.pid,
            alive=self.alive,
            exit_code=self.exit_code,
            run_dir=self.run_dir,
        )


@dataclasses.dataclass
class FakeNode:
    name: str
    gpus: int = 2
    mem_mib: int = 80 * GIB
    answering: bool = True
    runs: dict[tuple[str, int], FakeRun] = dataclasses.field(default_factory=dict)
    ghosts: list[GpuProcess] = dataclasses.field(default_factory=list)
    checkpoints: dict[str, list[CheckpointMarker]] = dataclasses.field(default_factory=dict)
    clock_offset_s: float = 0.0  # its clock minus the cluster's (what the probe reports)
    claimed: set[tuple[str, int]] = dataclasses.field(default_factory=set)  # fenced, never ran

    def uuid(self, index: int) -> str:
        return f"GPU-{self.name}-{index}"

    def spec(self) -> NodeSpec:
        return NodeSpec(name=self.name, host="127.0.0.1", labels={"fake": "true"})


class FakeCluster:
    """The nodes and what runs on them. `shared_checkpoints`: checkpoint dirs every node sees."""

    def __init__(self, nodes: Iterable[FakeNode], *, clock: ManualClock | None = None) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.clock = clock or ManualClock()
        self.shared_checkpoints: dict[str, list[CheckpointMarker]] = {}
        self.pushed: list[tuple[str, str, str]] = []  # (node, local_dir, remote_path)
        self.pulled: list[tuple[str, str, str]] = []  # (node, remote_path, local_dir)
        self._next_pid = 1000
        self.lock = threading.RLock()

    @classmethod
    def of(cls, *names: str, gpus: int = 2, clock: ManualClock | None = None) -> FakeCluster:
        return cls((FakeNode(n, gpus=gpus) for n in names), clock=clock)

    def inventory(self) -> Inventory:
        return Inventory(nodes=tuple(n.spec() for n in self.nodes.values()))

    def node(self, name: str) -> FakeNode:
        return self.nodes[name]

    def new_pid(self) -> int:
        with self.lock:
            self._next_pid += 1
            return self._next_pid

    # --- what a test scripts -----------------------------------------------------------------

    def runs(self, job_id: str | None = None, *, alive: bool | None = None) -> list[FakeRun]:
        """Every run on every node (optionally of one job, alive or not), by node then key."""
        out = []
        for name in sorted(self.nodes):
            for key in sorted(self.nodes[name].runs):
                run = self.nodes[name].runs[key]
                if (job_id is None or run.key[0] == job_id) and (
                    alive is None or run.alive == alive
                ):
                    out.append(run)
        return out

    def where(self, job_id: str, incarnation: int) -> str:
        for name, node in self.nodes.items():
            if (job_id, incarnation) in node.runs:
                return name
        raise KeyError((job_id, incarnation))

    def run(self, job_id: str, incarnation: int) -> FakeRun:
        return self.nodes[self.where(job_id, incarnation)].runs[(job_id, incarnation)]

    def finish(self, job_id: str, incarnation: int, exit_code: int) -> None:
        run = self.run(job_id, incarnation)
        run.alive, run.exit_code = False, exit_code

    def lose_run_dir(self, job_id: str, incarnation: int) -> None:
        """The incarnation's run dir is deleted on its node; its process runs on."""
        self.run(job_id, incarnation).listed = False

    def use(self, job_id: str, incarnation: int, mib: int) -> None:
        self.run(job_id, incarnation).used_mib = mib

    def partition(self, name: str) -> None:
        """The node stops answering; its jobs keep running."""
        self.nodes[name].answering = False

    def kill_node(self, name: str) -> None:
        """The node dies with its jobs (their exit status is never written)."""
        node = self.nodes[name]
        node.answering = False
        for run in node.runs.values():
            run.alive = False

    def heal(self, name: str) -> None:
        self.nodes[name].answering = True

    def commit(
        self,
        checkpoint_dir: str,
        *,
        step: int,
        incarnation: int,
        committed_at: float,
        node: str | None = None,
        valid: bool = True,
    ) -> CheckpointMarker:
        """A committed checkpoint in `checkpoint_dir`: on shared storage, or on `node` only."""
        marker = CheckpointMarker(
            path=f"{checkpoint_dir}/step-{step:08d}",
            incarnation=incarnation,
            step=step,
            committed_at=committed_at,
            valid=valid,
            problem=None if valid else "checksum mismatch: state.json",
        )
        where = self.shared_checkpoints if node is None else self.nodes[node].checkpoints
        where.setdefault(checkpoint_dir, []).append(marker)
        return marker


class FakeRunner:
    """A `JobRunner` over a `FakeCluster`. A node that does not answer raises `Unreachable`.

    `launch_error`: raised by the next launch (then cleared), to script a refused launch;
    `crash_after_launch`: the launch happens on the node, then this exception is raised (gpuctl
    died or the connection dropped before it learnt the outcome).
    """

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.launches: list[tuple[str, LaunchRequest]] = []
        self.signals: list[tuple[str, str, int, str]] = []
        self.launch_error: Exception | None = None
        self.crash_after_launch: BaseException | None = None
        self.on_term: str = "exit"
        self.fences: list[tuple[str, str, int]] = []  # (node, job id, incarnation)
        self.unkillable: set[tuple[str, int]] = set()  # (job id, incarnation) a fence cannot kill
        self.watch_commits = True  # observe reports each alive run's newest commit
        self.checkpoint_reads: list[tuple[str, str]] = []  # (node, checkpoint dir) read

    def _node(self, spec: NodeSpec) -> FakeNode:
        node = self.cluster.nodes[spec.name]
        if not node.answering:
            raise Unreachable(f"{spec.name}: no route to host")
        return node

    def launch(self, node: NodeSpec, request: LaunchRequest) -> RunStatus:
        with self.cluster.lock:
            target = self._node(node)
            if self.launch_error is not None:
                error, self.launch_error = self.launch_error, None
                raise error
            key = (request.job_id, request.incarnation)
            if key in target.runs or key in target.claimed:
                raise GpuctlError(
                    f"{node.name}: incarnation {request.incarnation} of {request.job_id} exists"
                )
            self.launches.append((node.name, request))
            run = FakeRun(
                request=request,
                pid=self.cluster.new_pid(),
                run_dir=f".gpuctl/runs/{request.job_id}/{request.incarnation}",
                started_at=self.cluster.clock.now(),
                on_term=self.on_term,
            )
            target.runs[run.key] = run
            if self.crash_after_launch is not None:
                crash, self.crash_after_launch = self.crash_after_launch, None
                raise crash
            return run.status()

    def observe(self, node: NodeSpec) -> list[RunStatus]:
        """Every listed run; an alive one with its newest commit as the node's observe sees it
        (the most recently written marker, valid or not), unless `watch_commits` is off (a
        run launched before gpuctl recorded checkpoint dirs)."""
        with self.cluster.lock:
            target = self._node(node)
            out = []
            for _, r in sorted(target.runs.items()):
                if not r.listed:
                    continue
                status = r.status()
                if r.alive and self.watch_commits:
                    status = dataclasses.replace(status, commit=self._newest(target, r))
                out.append(status)
            return out

    def _newest(self, target: FakeNode, run: FakeRun) -> CommitSeen:
        folder = run.request.checkpoint_dir
        found = [
            *self.cluster.shared_checkpoints.get(folder, []),
            *target.checkpoints.get(folder, []),
        ]
        dated = [m for m in found if m.step is not None and m.committed_at is not None]
        if not dated:
            return CommitSeen(None, None)
        newest = max(dated, key=lambda m: (m.committed_at or 0.0, m.step or 0))
        return CommitSeen(newest.step, newest.committed_at)

    def signal(self, node: NodeSpec, job_id: str, incarnation: int, signal: str) -> bool:
        with self.cluster.lock:
            target = self._node(node)
            self.signals.append((node.name, job_id, incarnation, signal))
            run = target.runs.get((job_id, incarnation))
            if run is None or not run.alive or not run.listed:
                return False
            run.signals.append(signal)
            if signal == "KILL" and (job_id, incarnation) in self.unkillable:
                return True  # delivered; the process is stuck in the kernel
            if signal == "KILL":
                run.alive, run.exit_code = False, 137
            elif signal == "TERM" and run.on_term == "exit":
                run.alive, run.exit_code = False, 0
            return True

    def fence(self, node: NodeSpec, job_id: str, incarnation: int) -> Fenced:
        """Kill the incarnation's process, claim its launch (a later launch of it is refused);
        an incarnation in `unkillable` survives (a process stuck in the kernel)."""
        with self.cluster.lock:
            target = self._node(node)
            self.fences.append((node.name, job_id, incarnation))
            key = (job_id, incarnation)
            run = target.runs.get(key)
            if run is None:
                target.claimed.add(key)
                return Fenced(killed=0, remaining=0)
            if not run.alive:
                return Fenced(killed=0, remaining=0)
            self.signals.append((node.name, job_id, incarnation, "KILL"))
            if key in self.unkillable:
                return Fenced(killed=1, remaining=1)
            run.signals.append("KILL")
            run.alive, run.exit_code = False, 137 if run.exit_code is None else run.exit_code
            return Fenced(killed=1, remaining=0)

    def processes(self, node: NodeSpec) -> list[JobProcess]:
        with self.cluster.lock:
            target = self._node(node)
            return [
                JobProcess(r.request.job_id, r.request.incarnation, r.pid)
                for _, r in sorted(target.runs.items())
                if r.alive
            ]

    def logs(
        self,
        node: NodeSpec,
        job_id: str,
        incarnation: int,
        *,
        offset: int = 0,
        limit: int = 1 << 20,
    ) -> tuple[bytes, int]:
        self._node(node)
        return b"", offset

    def checkpoints(self, node: NodeSpec, checkpoint_dir: str) -> list[CheckpointMarker]:
        with self.cluster.lock:
            target = self._node(node)
            self.checkpoint_reads.append((node.name, checkpoint_dir))
            found = [
                *self.cluster.shared_checkpoints.get(checkpoint_dir, []),
                *target.checkpoints.get(checkpoint_dir, []),
            ]
            return sorted(found, key=lambda m: m.path)

    def pull_checkpoint(self, node: NodeSpec, remote_path: str, local_dir: str) -> None:
        with self.cluster.lock:
            target = self._node(node)
            marker = _find(target.checkpoints.values(), remote_path)
            folder = Path(local_dir)
            folder.mkdir(parents=True, exist_ok=True)
            state = json.dumps({"step": marker.step, "from": remote_path}).encode()
            (folder / "state.json").write_bytes(state)
            (folder / "COMMITTED").write_text(  # a real committed checkpoint: gpuctl verifies it
                json.dumps(
                    {
                        "format": 1,
                        "job_id": "",
                        "incarnation": marker.incarnation,
                        "step": marker.step,
                        "committed_at": marker.committed_at,
                        "files": {"state.json": hashlib.sha256(state).hexdigest()},
                    }
                ),
                encoding="utf-8",
            )
            self.cluster.pulled.append((node.name, remote_path, local_dir))

    def push_checkpoint(self, node: NodeSpec, local_dir: str, remote_path: str) -> None:
        with self.cluster.lock:
            target = self._node(node)
            meta = json.loads((Path(local_dir) / "COMMITTED").read_text(encoding="utf-8"))
            marker = CheckpointMarker(
                path=remote_path,
                incarnation=meta["incarnation"],
                step=meta["step"],
                committed_at=None,
                valid=True,
            )
            parent = remote_path.rsplit("/", 1)[0]
            target.checkpoints.setdefault(parent, []).append(marker)
            self.cluster.pushed.append((node.name, local_dir, remote_path))


def _find(groups: Iterable[Sequence[CheckpointMarker]], path: str) -> CheckpointMarker:
    for group in groups:
        for m in group:
            if m.path == path:
                return m
    raise GpuctlError(f"no checkpoint at {path}")


class FakeFleet:
    """What a gather of the cluster returns: GPUs, their used memory and the processes on them
    (each live run with `used_mib` set, on each card it was granted, plus the node's ghosts)."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.polls = 0
        self.before_poll: Callable[[], None] | None = None

    def gather(self, nodes: Inventory | Iterable[NodeSpec]) -> FleetSnapshot:
        if self.before_poll is not None:
            self.before_poll()
        specs = nodes.nodes if isinstance(nodes, Inventory) else tuple(nodes)
        with self.cluster.lock:
            self.polls += 1
            now = self.cluster.clock.now()
            return FleetSnapshot(taken_at=now, nodes=tuple(self._node(s, now) for s in specs))

    def _node(self, spec: NodeSpec, now: float) -> NodeSnapshot:
        node = self.cluster.nodes[spec.name]
        if not node.answering:
            return NodeSnapshot(
                name=node.name,
                reach=Reach.UNREACHABLE,
                state=NodeState.DOWN,
                error="no route to host",
                taken_at=now,
                labels=dict(spec.labels),
            )
        procs: list[GpuProcess] = list(node.ghosts)
        for run in node.runs.values():
            if not run.alive or run.used_mib is None:
                continue
            for token in run.request.cuda_visible_devices.split(","):
                if token:
                    procs.append(GpuProcess(run.pid, node.uuid(int(token)), run.used_mib))
        used = dict.fromkeys(range(node.gpus), 0)
        for p in procs:
            index = int(str(p.gpu_uuid).rsplit("-", 1)[1])
            used[index] += p.used_mib or 0
        gpus = tuple(
            GpuSnapshot(
                index=i,
                uuid=node.uuid(i),
                model="NVIDIA H100 80GB HBM3",
                mem_total_mib=node.mem_mib,
                mem_used_mib=min(node.mem_mib, used[i]),
                util_pct=0,
            )
            for i in range(node.gpus)
        )
        obs = Observation(
            gpus=gpus,
            processes=tuple(procs),
            facts=NodeFacts(hostname=node.name, clock_s=now + node.clock_offset_s),
        )
        return NodeSnapshot(
            name=node.name,
            reach=Reach.OK,
            state=NodeState.READY,
            observation=obs,
            latency_s=0.0,
            taken_at=now,
            labels=dict(spec.labels),
        )
