"""Fakes for drain, migration and health-draining tests, over `gpuctl.testing.fakerunner`.

- `CheckpointingRunner`: a `FakeRunner` whose jobs keep the checkpoint contract: SIGUSR1 commits a
  checkpoint (10 steps after the newest), SIGTERM commits one and exits 0; a job launched while
  `ignore_signals` is set traps TERM and USR1 (`trap '' TERM USR1`) and dies only by SIGKILL.
- `FaultyFleet`: a `FakeFleet` whose nodes can be given GPU faults as the probe would report them
  (uncorrectable ECC, a hot GPU, an XID, unreadable GPUs).
- `LoopKit`: a control loop over a scripted fleet with a clock the test advances; `Kit` is one
  over the two above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar, Generic, TypeVar

from gpuctl.adapters.protocols import Store
from gpuctl.config.jobspec import spec_from_data
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import Event, Incarnation, Job, JobState, LaunchRequest, RunStatus
from gpuctl.core.jobs.restarts import RestartPolicy
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSnapshot, NodeSpec, XidEvent
from gpuctl.core.placement.model import Settings
from gpuctl.ops.loop import PassReport, Reconciler, ReconcileSettings
from gpuctl.testing.fakerunner import FakeCluster, FakeFleet, FakeRunner, ManualClock

GIB = 1024
CKPT = "/shared/ckpt"


class CheckpointingRunner(FakeRunner):
    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(cluster)
        self.ignore_signals = False
        self.ignoring: set[tuple[str, int]] = set()

    def launch(self, node: NodeSpec, request: LaunchRequest) -> RunStatus:
        status = super().launch(node, request)
        if self.ignore_signals:
            self.ignoring.add((request.job_id, request.incarnation))
            self.cluster.run(request.job_id, request.incarnation).on_term = "ignore"
        return status

    def signal(self, node: NodeSpec, job_id: str, incarnation: int, signal: str) -> bool:
        with self.cluster.lock:
            run = self.cluster.nodes[node.name].runs.get((job_id, incarnation))
            keeps = (
                run is not None
                and run.alive
                and (job_id, incarnation) not in self.ignoring
                and self.cluster.nodes[node.name].answering
            )
            if keeps and signal in ("USR1", "TERM"):
                self.checkpoint(job_id, incarnation)
            return super().signal(node, job_id, incarnation, signal)

    def checkpoint(self, job_id: str, incarnation: int) -> int:
        """The job commits a checkpoint now (10 steps after its newest); its step."""
        folder = f"{CKPT}/{job_id}"
        steps = [m.step or 0 for m in self.cluster.shared_checkpoints.get(folder, [])]
        step = max(steps, default=0) + 10
        self.cluster.commit(
            folder, step=step, incarnation=incarnation, committed_at=self.cluster.clock.now()
        )
        return step


class FaultyFleet(FakeFleet):
    """`faults[node]`: `ecc` (uncorrectable ECC errors on GPU 0), `temp_c` (GPU 0),
    `xid` (an XID on GPU 0), `garbage` (the GPU query unreadable)."""

    def __init__(self, cluster: FakeCluster) -> None:
        super().__init__(cluster)
        self.faults: dict[str, dict[str, Any]] = {}

    def gather(self, nodes: Inventory | Iterable[NodeSpec]) -> FleetSnapshot:
        snap = super().gather(nodes)
        return dataclasses.replace(snap, nodes=tuple(self._fault(n) for n in snap.nodes))

    def _fault(self, node: NodeSnapshot) -> NodeSnapshot:
        faults = self.faults.get(node.name)
        obs = node.observation
        if not faults or obs is None:
            return node
        if faults.get("garbage"):
            obs = dataclasses.replace(
                obs, gpus=(), nvml_ok=False, notes=("nvidia-smi printed garbage",)
            )
            return dataclasses.replace(node, observation=obs)
        gpus = list(obs.gpus)
        first = gpus[0]
        if "ecc" in faults:
            first = dataclasses.replace(first, ecc_volatile_uncorrected=faults["ecc"])
        if "temp_c" in faults:
            first = dataclasses.replace(first, temp_c=faults["temp_c"])
        gpus[0] = first
        xids = obs.xids
        if "xid" in faults:
            xids = (XidEvent(xid=faults["xid"], at="100.5", message="injected"),)
        return dataclasses.replace(
            node, observation=dataclasses.replace(obs, gpus=tuple(gpus), xids=xids)
        )


R = TypeVar("R", bound=FakeRunner)
F = TypeVar("F", bound=FakeFleet)


@dataclasses.dataclass
class LoopKit(Generic[R, F]):
    """A control loop over a scripted fleet with a clock the test advances, and the steps tests
    take with it: submit a job (a spec with test defaults), run a pass, read a job or one of its
    incarnations back."""

    store: Store
    clock: ManualClock
    cluster: FakeCluster
    runner: R
    fleet: F
    loop: Reconciler
    n: int = 0

    SPEC: ClassVar[dict[str, Any]] = {}  # what a kit adds to every submitted spec

    def submit(self, name: str, **spec: Any) -> Job:
        body: dict[str, Any] = {
            "name": name,
            "command": ["python", "train.py"],
            "resources": {"gpus": 1, "mem_per_gpu": "20GiB"},
            "checkpoint": {"dir": f"{CKPT}/{{job_id}}", "sync": "shared"},
            **self.SPEC,
        }
        body.update(spec)
        self.n += 1
        now = self.clock.now()
        job = Job(
            id=f"{name}-{self.n:06x}",
            name=name,
            spec=spec_from_data(body),
            state=JobState.QUEUED,
            priority=int(body.get("priority", 0)),
            tier=str(body.get("tier", "standard")),
            submitted_at=now,
            updated_at=now,
        )
        self.store.add_job(job, Event(now, "test", "submit", f"submitted {job.id}", job.id))
        self.clock.advance(1)
        return job

    def step(self, advance_s: float = 5.0) -> PassReport:
        self.clock.advance(advance_s)
        return self.loop.run_once()

    def job(self, job_id: str) -> Job:
        found = self.store.job(job_id)
        assert found is not None
        return found

    def inc(self, job_id: str, n: int | None = None) -> Incarnation:
        incs = self.store.incarnations(job_id)
        return incs[-1] if n is None else next(i for i in incs if i.n == n)


@dataclasses.dataclass
class Kit(LoopKit[CheckpointingRunner, FaultyFleet]):
    """The loop with jobs that keep the checkpoint contract and nodes that can be given faults."""

    SPEC: ClassVar[dict[str, Any]] = {"grace_s": 20}

    @classmethod
    def make(
        cls,
        store: Store,
        nodes: tuple[str, ...] = ("n1", "n2", "n3"),
        *,
        gpus: int = 2,
        health: AutoDrainPolicy | None = None,
        grace_s: float = 30.0,
    ) -> Kit:
        clock = ManualClock()
        cluster = FakeCluster.of(*nodes, gpus=gpus, clock=clock)
        runner, fleet = CheckpointingRunner(cluster), FaultyFleet(cluster)
        settings = ReconcileSettings(
            placement=Settings(policy="best-fit", band_max=1.0, headroom=0.0),
            grace_s=grace_s,
            restarts=RestartPolicy(),
            checkpoint_scan_s=0.0,
            health=health or AutoDrainPolicy(),
        )
        loop = Reconciler(store, fleet, runner, cluster.inventory(), clock, settings)
        return cls(store, clock, cluster, runner, fleet, loop)

    def kinds(self, job_id: str | None = None) -> list[str]:
        return [e.kind for e in self.store.events(job_id=job_id)]

    def signals(self, job_id: str) -> list[str]:
        return [s[3] for s in self.runner.signals if s[1] == job_id]
