"""Dashboard test kit: a scripted snapshot source, a memory store, a manual clock, screen text."""

from __future__ import annotations

import asyncio
import contextlib
import html
import inspect
import re
from collections.abc import Callable, Iterator, Sequence

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.config.health_rules import load_rules
from gpuctl.config.jobspec import spec_from_data
from gpuctl.config.jobspec_files import LoadedSpec
from gpuctl.core.jobs.model import (
    Checkpoint,
    EndReason,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
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
from gpuctl.ops import jobs
from gpuctl.ops.actions import FleetActions
from gpuctl.ops.dashboard import Services
from gpuctl.testing.fakerunner import FakeCluster, FakeRunner, ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.tui.app import DashApp

MIB = 81_559  # an H100 80GB as nvidia-smi reports it


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests (Pilot) in a fresh event loop; no asyncio plugin needed."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


def node(
    name: str,
    *,
    gpus: int = 4,
    used_mib: Sequence[int] = (),
    temp_c: int = 40,
    reach: Reach = Reach.OK,
    error: str | None = None,
    taken_at: float = 1_000_000.0,
) -> NodeSnapshot:
    if reach is not Reach.OK:
        return NodeSnapshot(
            name=name,
            reach=reach,
            state=NodeState.DOWN,
            error=error or "no route",
            taken_at=taken_at,
        )
    used = list(used_mib) + [0] * (gpus - len(used_mib))
    cards = tuple(
        GpuSnapshot(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model="NVIDIA H100 80GB HBM3",
            mem_total_mib=MIB,
            mem_used_mib=used[i],
            util_pct=50 if used[i] else 0,
            temp_c=temp_c,
            ecc_volatile_uncorrected=0,
        )
        for i in range(gpus)
    )
    procs = tuple(
        GpuProcess(pid=1000 + i, gpu_uuid=f"GPU-{name}-{i}", used_mib=used[i], name="python")
        for i in range(gpus)
        if used[i]
    )
    obs = Observation(
        gpus=cards,
        processes=procs,
        facts=NodeFacts(hostname=name, driver_version="550.54", cuda_version="12.4", cpu_count=64),
    )
    return NodeSnapshot(
        name=name,
        reach=Reach.OK,
        state=NodeState.READY,
        observation=obs,
        latency_s=0.01,
        taken_at=taken_at,
    )


def fleet(*nodes: NodeSnapshot, taken_at: float = 1_000_000.0) -> FleetSnapshot:
    return FleetSnapshot(taken_at=taken_at, nodes=tuple(nodes))


class ScriptedSource:
    """Each poll returns `snapshot` (a test changes it between refreshes), or raises `error`."""

    live = True
    label = "scripted"
    deadline_s = 30.0

    def __init__(self, snapshot: FleetSnapshot) -> None:
        self.snapshot = snapshot
        self.error: BaseException | None = None
        self.polls = 0
        self.before_poll: Callable[[], None] | None = None
        self.closed = False

    def poll(self) -> FleetSnapshot:
        self.polls += 1
        if self.before_poll is not None:
            self.before_poll()
        if self.error is not None:
            raise self.error
        return self.snapshot

    def gather(self, nodes: object) -> FleetSnapshot:
        """What the actions gather (drain and consolidation plan on a fresh gather)."""
        return self.snapshot

    def close(self) -> None:
        self.closed = True


def opener(store: Store) -> Callable[[bool], contextlib.AbstractContextManager[Store]]:
    @contextlib.contextmanager
    def open_store(write: bool) -> Iterator[Store]:
        yield store

    return open_store


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000_000.0)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def source() -> ScriptedSource:
    return ScriptedSource(
        fleet(node("gpu-01", used_mib=[40_000]), node("gpu-02"), node("gpu-03", gpus=2))
    )


INVENTORY = Inventory(
    nodes=tuple(
        NodeSpec(name=name, host="127.0.0.1", port=port, expected_gpus=gpus)
        for name, port, gpus in (("gpu-01", 2201, 4), ("gpu-02", 2202, 4), ("gpu-03", 2203, 2))
    )
)


@pytest.fixture
def services(source: ScriptedSource, store: MemoryStore, clock: ManualClock) -> Services:
    actions = FleetActions(
        open_store=opener(store),
        clock=clock,
        operator="alice",
        inventory=INVENTORY,
        fleet=source,
        runner=FakeRunner(FakeCluster.of("gpu-01", "gpu-02", "gpu-03", gpus=4, clock=clock)),
    )
    return Services(
        source=source,
        open_store=opener(store),
        clock=clock,
        actions=actions,
        rules=load_rules(),
        expected_gpus={"gpu-01": 4, "gpu-02": 4, "gpu-03": 2},
        operator="alice",
    )


def make_app(services: Services, **kwargs: object) -> DashApp:
    return DashApp(services, offset_s=0.0, **kwargs)  # type: ignore[arg-type]


async def settle(app: DashApp, pilot: object) -> None:
    """Wait until running workers are done and their messages handled."""
    await app.workers.wait_for_complete()
    await pilot.pause()  # type: ignore[attr-defined]
    await app.workers.wait_for_complete()
    await pilot.pause()  # type: ignore[attr-defined]


async def keys(app: DashApp, pilot: object, *pressed: str) -> None:
    """Press keys as an operator would, then wait until what they set off is done."""
    await pilot.press(*pressed)  # type: ignore[attr-defined]
    await settle(app, pilot)


_TEXT = re.compile(
    r'<text[^>]*?x="([\d.]+)"[^>]*?textLength="([\d.]+)"[^>]*?'
    r'clip-path="url\(#[\w-]+-line-(\d+)\)"[^>]*>(.*?)</text>',
    re.S,
)


def screen_text(app: DashApp) -> list[str]:
    """The screen's lines as an operator reads them, from the SVG screenshot (each span put at
    its column)."""
    spans = [
        (int(line), float(x), float(length), html.unescape(body).replace("\xa0", " "))
        for x, length, line, body in _TEXT.findall(app.export_screenshot())
    ]
    widths = [length / len(body) for _, _, length, body in spans if body]
    cell = min(widths) if widths else 1.0
    lines: dict[int, list[str]] = {}
    for line, x, _, body in spans:
        row = lines.setdefault(line, [])
        col = round(x / cell)
        if len(row) < col:
            row.extend(" " * (col - len(row)))
        row[col : col + len(body)] = list(body)
    return ["".join(chars).rstrip() for _, chars in sorted(lines.items())]


# --- a store with jobs: one running with a checkpoint, one that failed over, one queued ---------


def submit(store: Store, clock: ManualClock, name: str, resources: dict[str, object]) -> Job:
    spec = spec_from_data({"name": name, "command": ["python", "train.py"], "resources": resources})
    return jobs.submit(store, [LoadedSpec(spec, f"{name}.yaml:1")], actor="alice", clock=clock)[0]


def launch(
    store: Store, job: Job, n: int, node: str, card: int, at: float, mib: int = 40_000
) -> None:
    inc = Incarnation(
        job_id=job.id,
        n=n,
        node=node,
        cards=(card,),
        gpu_uuids=(f"GPU-{node}-{card}",),
        mib_per_card=mib,
        whole=False,
        state=IncarnationState.LAUNCHING,
        started_at=at,
        run_dir=f".gpuctl/runs/{job.id}/{n}",
    )
    event = Event(at, "gpuctl", "launch", f"launched {job.id} on {node}", job.id, node)
    store.begin_launch(inc, capacity_mib={(node, card): MIB}, event=event)
    store.update_incarnation(job.id, n, state=IncarnationState.RUNNING, pid=4242 + n)


def populate(store: Store, clock: ManualClock) -> dict[str, Job]:
    """train (running on gpu-01 card 0, checkpoint 5 min old), moved (failed over from gpu-02 to
    gpu-03 within its budget), big (queued: 8 whole cards fit nowhere)."""
    now = clock.now()
    train = submit(store, clock, "train", {"mem_per_gpu": "40GiB"})
    launch(store, train, 1, "gpu-01", 0, now + 60)
    store.add_checkpoint(Checkpoint(train.id, 1, 100, "/ckpt/100", now + 300, "shared"))
    moved = submit(store, clock, "moved", {"mem_per_gpu": "40GiB"})
    launch(store, moved, 1, "gpu-02", 1, now + 30)
    lost = now + 400
    store.update_incarnation(
        moved.id, 1, state=IncarnationState.LOST, end_reason=EndReason.NODE_LOST, ended_at=lost
    )
    store.update_job(moved.id, state=JobState.QUEUED, event=Event(lost, "gpuctl", "failover", "x"))
    launch(store, moved, 2, "gpu-03", 0, lost + 20)
    big = submit(store, clock, "big", {"gpus": 8, "mem_per_gpu": "whole"})
    clock.advance(600)
    return {"train": train, "moved": moved, "big": big}
