"""The control loop records a running job's commit at the pass after it, with the default 30 s
checkpoint scan: the node's observe (one exec per node per pass) says what each run committed
last, and the markers are read only when that changed. A run the observe says nothing of is read
every `checkpoint_scan_s` as before."""

from __future__ import annotations

from gpuctl.core.placement.model import Settings
from gpuctl.ops.loop import Reconciler, ReconcileSettings
from gpuctl.testing.drainkit import CKPT, LoopKit
from gpuctl.testing.fakerunner import FakeCluster, FakeFleet, FakeRunner, ManualClock
from gpuctl.testing.memstore import MemoryStore


def kit() -> LoopKit[FakeRunner, FakeFleet]:
    clock = ManualClock()
    cluster = FakeCluster.of("n1", "n2", clock=clock)
    runner, fleet = FakeRunner(cluster), FakeFleet(cluster)
    settings = ReconcileSettings(placement=Settings(policy="best-fit", band_max=1.0, headroom=0.0))
    assert settings.checkpoint_scan_s == 30.0  # the default
    store = MemoryStore()
    loop = Reconciler(store, fleet, runner, cluster.inventory(), clock, settings)
    return LoopKit(store, clock, cluster, runner, fleet, loop)


def commit(k: LoopKit[FakeRunner, FakeFleet], job_id: str, step: int) -> None:
    at = k.clock.now()
    k.cluster.commit(f"{CKPT}/{job_id}", step=step, incarnation=1, committed_at=at)


def recorded(k: LoopKit[FakeRunner, FakeFleet], job_id: str) -> tuple[int, float] | None:
    found = k.store.checkpoints(job_id)  # newest first: what `jobs` and the numbers show
    return (found[0].step, found[0].committed_at) if found else None


def test_a_commit_is_recorded_at_the_next_pass_and_markers_are_read_only_when_it_changes() -> None:
    k = kit()
    job = k.submit("train")
    k.step(2)  # launched
    k.step(2)
    for step in (10, 20, 30):
        k.clock.advance(1)
        commit(k, job.id, step)
        k.step(2)  # 2 s later: recorded, not 30 s later
        assert recorded(k, job.id) == (step, k.clock.now() - 2)
    reads = len(k.runner.checkpoint_reads)
    for _ in range(20):
        k.step(2)  # 40 s without a commit: the markers are not read again
    assert len(k.runner.checkpoint_reads) == reads
    assert recorded(k, job.id) == (30, k.clock.now() - 42)


def test_a_run_the_observe_says_nothing_of_is_read_every_checkpoint_scan() -> None:
    k = kit()
    k.runner.watch_commits = False  # launched by a gpuctl that did not record checkpoint dirs
    job = k.submit("train")
    k.step(2)
    commit(k, job.id, 10)
    k.step(2)
    first = recorded(k, job.id)
    commit(k, job.id, 20)
    k.step(2)
    assert recorded(k, job.id) == first  # read again only 30 s after the last read
    k.step(30)
    assert recorded(k, job.id) == (20, k.clock.now() - 32)
