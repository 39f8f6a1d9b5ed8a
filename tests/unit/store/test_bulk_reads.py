"""The reads the control loop makes once per pass for all its jobs (`incarnations_for`,
`checkpoints_for`) answer what the per-job reads answer, on every backend, for every job in the
states asked that has any (and only those)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.postgres import open_url
from gpuctl.core.jobs.model import Checkpoint, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.testing.memstore import MemoryStore
from tests.pg import STORES, open_test_store
from tests.unit.store.test_reservations import CAP, ev, inc, running


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


@pytest.fixture
def other(store: Store, tmp_path: Path) -> Iterator[Store]:
    """A second handle on `store`'s data, as another process opens it."""
    if isinstance(store, MemoryStore):
        yield store.shared()
        return
    url = getattr(store, "_connect_url", None)
    s = open_url(url, write=True) if url else open_store(tmp_path, write=True)
    yield s
    s.close()


def test_every_jobs_incarnations_and_checkpoints_in_one_read_as_per_job(store: Store) -> None:
    running(store, "a-1", card=0)
    running(store, "b-1", card=1)
    running(store, "c-1", card=0, node="n2")
    store.update_incarnation("a-1", 1, state=IncarnationState.EXITED, exit_code=1)
    store.update_job("a-1", state=JobState.QUEUED)
    store.begin_launch(inc("a-1", 2, "n2", 1), capacity_mib=CAP, event=ev("launch"))
    for n, step, at in ((1, 10, 5.0), (1, 20, 6.0), (2, 30, 7.0)):
        store.add_checkpoint(Checkpoint("a-1", n, step, f"/c/{step}", at, "shared"))
    store.update_incarnation("c-1", 1, state=IncarnationState.EXITED, exit_code=0)
    store.update_job("c-1", state=JobState.SUCCEEDED)
    queued = Job("d-1", "d", JobSpec(JobRequest("d")), JobState.QUEUED, 0, "standard", 2.0)
    store.add_job(queued, ev("submit"))
    live = [s for s in JobState if not s.terminal]

    incs = store.incarnations_for(live)
    assert sorted(incs) == ["a-1", "b-1"]  # the jobs in those states that have any
    assert incs["a-1"] == store.incarnations("a-1") and [i.n for i in incs["a-1"]] == [1, 2]
    assert incs["b-1"] == store.incarnations("b-1")
    held = store.incarnations_for(live, holding=True)
    assert [i.n for i in held["a-1"]] == [2] and held["b-1"] == incs["b-1"]
    released = store.incarnations_for(live, holding=False)
    assert [i.n for i in released["a-1"]] == [1] and "b-1" not in released
    assert list(store.incarnations_for([JobState.SUCCEEDED])) == ["c-1"]

    store.add_checkpoint(Checkpoint("c-1", 1, 5, "/c/5", 4.0, "shared"))
    ckpts = store.checkpoints_for(live)
    assert list(ckpts) == ["a-1"] and ckpts["a-1"] == store.checkpoints("a-1")
    assert [c.step for c in ckpts["a-1"]] == [30, 20, 10]
    assert store.incarnations_for([]) == {} and store.checkpoints_for([]) == {}


def test_every_read_of_the_jobs_shows_each_change_another_writer_made(
    store: Store, other: Store
) -> None:
    """`jobs()` reads a job's whole row again only when its version moved: every change moves
    it, whoever makes it."""
    for name in ("a-1", "b-1", "c-1"):
        running(store, name, card=int(name[0] == "b"), node="n2" if name == "c-1" else "n1")
    assert [j.state for j in store.jobs()] == [JobState.RUNNING] * 3
    other.update_job("b-1", expect=JobState.RUNNING, state=JobState.HELD, reason="by hand")
    other.update_job("c-1", cancel_requested=True)
    by_id = {j.id: j for j in store.jobs()}
    assert by_id["b-1"].state is JobState.HELD and by_id["b-1"].reason == "by hand"
    assert by_id["c-1"].cancel_requested and by_id["a-1"] == other.job("a-1")
    assert [j.id for j in store.jobs([JobState.RUNNING])] == ["a-1", "c-1"]
    assert [j.id for j in store.jobs([JobState.HELD])] == ["b-1"]
    queued = Job("d-1", "d", JobSpec(JobRequest("d")), JobState.QUEUED, 0, "standard", 0.5)
    other.add_job(queued, ev("submit"))
    assert [j.id for j in store.jobs()] == ["d-1", "a-1", "b-1", "c-1"]  # oldest first
