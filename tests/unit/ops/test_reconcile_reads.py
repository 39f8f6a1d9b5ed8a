"""A control-loop pass reads each table of the store once, however many jobs there are: its
questions per job (a job, its incarnations, its checkpoints) are answered from those reads, and
what its own writes changed is read again (`gpuctl.ops.loop._view`). A pass over 1,000 jobs made
about 3,000 queries before (benchmarks/store_pass.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpuctl.adapters.protocols import Store
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.core.placement.model import Settings
from gpuctl.testing.memstore import MemoryStore
from tests.unit.ops.test_reconcile import CKPT, Loop, make

READS = frozenset(
    {"job", "jobs", "incarnations", "incarnations_for", "checkpoints", "checkpoints_for",
     "events", "reservations", "cordons", "liveness", "node_health", "lease", "node_versions",
     "latest_snapshot"}
)  # fmt: skip
MOST_READS = 30  # what one pass asks of the store whatever the number of jobs, at most


class Counting:
    """The store, counting its reads and its other calls by name."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if name in READS:
            self.reads[name] += 1
        elif callable(found):
            self.writes[name] += 1
        return found


def a_pass_over(jobs: int) -> tuple[Counter[str], Loop]:
    """The reads of one warm pass over `jobs` jobs (most running, some queued for lack of room),
    in which one job ends, one commits a checkpoint and one is cancelled."""
    counting = Counting(MemoryStore())
    nodes = tuple(f"n{i:03d}" for i in range(max(1, jobs // 10)))  # 8 jobs each: 2 a card
    t = make(counting, nodes, gpus=4, placement=Settings(policy="best-fit", band_max=0.5))  # type: ignore[arg-type]
    ids = [t.submit("train").id for _ in range(jobs)]
    t.step()
    running = [i for i in ids if t.job(i).state is JobState.RUNNING]
    assert len(running) >= jobs // 2 and len(running) < jobs  # some wait for room
    t.cluster.finish(running[0], 1, 0)
    t.cluster.commit(f"{CKPT}/{running[1]}", step=3, incarnation=1, committed_at=t.clock.now())
    t.store.update_job(running[2], cancel_requested=True)
    counting.reads.clear()
    t.step()
    assert t.job(running[0]).state is JobState.SUCCEEDED
    assert [c.step for c in t.store.checkpoints(running[1])] == [3]
    assert t.inc(running[2]).state is IncarnationState.STOPPING
    return Counter(counting.reads), t


def test_a_pass_reads_the_store_as_often_for_1000_jobs_as_for_10() -> None:
    few, _ = a_pass_over(10)
    many, _ = a_pass_over(1000)
    assert sum(many.values()) <= MOST_READS, many
    assert many == few  # nothing asked per job but of the jobs this pass wrote


def test_the_liveness_of_every_node_is_refreshed_in_one_write() -> None:
    """Each node's liveness is written again once a minute: 2,000 nodes were 2,000 transactions
    in one pass."""
    counting = Counting(MemoryStore())
    t = make(counting, tuple(f"n{i:03d}" for i in range(200)), gpus=1)  # type: ignore[arg-type]
    t.step()
    counting.writes.clear()
    t.step(61)
    assert counting.writes["set_liveness"] == 1
    assert {lv.last_ok_at for lv in t.store.liveness().values()} == {t.clock.now()}
