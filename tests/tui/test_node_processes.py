"""The node screen names the job of each GPU process gpuctl started: the headless matching
(`gpuctl.ops.dashboard.owners_of`, `read_owners`) and what the screen shows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuctl.core.jobs.model import Incarnation, IncarnationState, JobProcess
from gpuctl.errors import TransportError
from gpuctl.ops.dashboard import NOT_GPUCTL, Services, owners_of, read_owners
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.tui.screens.node import NodeScreen
from gpuctl.tui.widgets.table import KeyedTable

from .conftest import ScriptedSource, fleet, keys, make_app, node, opener, populate, screen_text

SIZE = (160, 40)


def inc(job: str, n: int, where: str, pid: int | None = None) -> Incarnation:
    return Incarnation(
        job_id=job, n=n, node=where, cards=(0,), gpu_uuids=(), mib_per_card=1024, whole=False,
        state=IncarnationState.RUNNING, started_at=0.0, run_dir="r", pid=pid,
    )  # fmt: skip


class Listed:
    """Each node's job processes, as `JobRunner.processes` lists them; `down` cannot be read."""

    def __init__(self, procs: Mapping[str, Sequence[JobProcess]], down: str = "") -> None:
        self.procs = procs
        self.down = down
        self.asked: list[str] = []

    def on(self, node: str) -> Sequence[JobProcess]:
        self.asked.append(node)
        if node == self.down:
            raise TransportError(f"{node}: connection refused")
        return self.procs.get(node, ())


def test_a_listed_job_process_is_its_jobs_and_the_rest_are_not_gpuctls() -> None:
    listed = [JobProcess("train-1", 2, 501), JobProcess("old-1", 1, 502)]
    live = [inc("train-1", 2, "gpu-01", pid=500), inc("other", 1, "gpu-02", pid=502)]
    assert owners_of("gpu-01", [501, 502, 999], listed, live) == {
        501: "job train-1 #2",  # a child of the job: not its leader's pid, found by environment
        502: "job old-1 #1 (stray)",  # carries a job's environment the store has not live here
        999: NOT_GPUCTL,
    }


def test_without_a_listing_only_the_stores_pids_are_named_and_nothing_is_called_foreign() -> None:
    live = [inc("train-1", 2, "gpu-01", pid=500)]
    assert owners_of("gpu-01", [500, 501], None, live) == {500: "job train-1 #2", 501: "?"}


def test_a_slurm_jobs_gpu_process_is_named_by_its_slurm_job_not_a_stray(
    store: MemoryStore,
) -> None:
    import dataclasses

    from gpuctl.core.jobs.model import Event, JobState
    from gpuctl.core.jobs.spec import Backend
    from tests.unit.ops.test_reconcile import make

    template = make(MemoryStore()).submit("train")
    backend = Backend("slurm", "42", "/home/alice/.gpuctl/slurm/sjob-1", "hpc1")
    job = dataclasses.replace(
        template,
        id="sjob-1",
        spec=dataclasses.replace(template.spec, backend=backend),
        state=JobState.RUNNING,
    )
    store.add_job(job, Event(0.0, "alice", "submit", "to Slurm", job.id))
    # Slurm ran it on gpu-01 before the loop recorded its run: still Slurm's, no stray
    listed = Listed({"gpu-01": [JobProcess("sjob-1", 1, 801)]})
    read = read_owners(opener(store), listed, "gpu-01", [801])
    assert read.owners == {801: "job sjob-1 #1 (Slurm job 42)"}


def test_read_owners_says_why_the_listing_is_missing(store: MemoryStore) -> None:
    down = Listed({}, down="gpu-01")
    read = read_owners(opener(store), down, "gpu-01", [7])
    assert read.owners == {7: "?"}
    assert read.note == "job processes unreadable: gpu-01: connection refused"
    offline = read_owners(opener(store), None, "gpu-01", [7])
    assert offline.note == "no job process listing (offline review)"


async def test_the_node_screen_names_each_gpu_processs_job(
    services: Services, store: MemoryStore, clock: ManualClock, source: ScriptedSource
) -> None:
    train = populate(store, clock)["train"].id  # incarnation 1 runs on gpu-01, card 0
    source.snapshot = fleet(
        node("gpu-01", used_mib=[40_000, 5_000]), node("gpu-02"), node("gpu-03", gpus=2)
    )  # pid 1000 on GPU 0 (train's python, a child of its leader 4243), pid 1001 on GPU 1
    job_procs = [JobProcess(train, 1, 4243), JobProcess(train, 1, 1000)]
    services.processes = lister = Listed({"gpu-01": job_procs})
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await keys(app, pilot, "colon", *"node gpu-01", "enter")
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        procs = screen.query_one("#processes", KeyedTable)
        shown = {procs.shown(k)[0]: procs.shown(k)[1:] for k in procs.keys}
        assert shown == {
            "1000": ("0", "40000", "python", f"job {train} #1"),
            "1001": ("1", "5000", "python", NOT_GPUCTL),
        }
        text = "\n".join(screen_text(app))
        assert f"job {train} #1" in text and NOT_GPUCTL in text
        asked = len(lister.asked)
        await keys(app, pilot, "r")
        assert len(lister.asked) == asked  # the same processes: not listed again
