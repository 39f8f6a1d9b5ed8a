"""`Store.record_run`: a run Slurm started, written as it happened. It checks only what must
hold (the job is there and unfinished, the run is its next incarnation, the controller's fence),
never a cordon nor room: a card someone else holds comes back as a clash, recorded all the same.
On memory, SQLite and PostgreSQL."""

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.postgres import open_url
from gpuctl.core.jobs.model import (
    CardClash,
    Cordon,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
)
from gpuctl.core.jobs.spec import Backend, JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import LeaseLost, StoreConflict
from gpuctl.ops.invariants import check_invariants
from gpuctl.testing.memstore import MemoryStore
from gpuctl.testing.waiting import wait_for
from tests.pg import STORES, open_test_store

CAP = {("n1", 0): 80_000, ("n1", 1): 80_000}
SLURM = Backend("slurm", "42", "/home/a/.gpuctl/slurm/42")


@pytest.fixture(params=STORES)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two handles on one store: two controllers' (two processes', for SQL stores)."""
    a = open_test_store(request, tmp_path / "state")
    if isinstance(a, MemoryStore):
        b: Store = a.shared()
    elif request.param == "postgresql":
        b = open_url(request.getfixturevalue("pg_url"), write=True)
    else:
        b = open_store(tmp_path / "state", write=True)
    yield a, b
    b.close()
    a.close()


def ev(kind: str, at: float = 100.0) -> Event:
    return Event(at, "gpuctl", kind, f"{kind} happened")


def add(store: Store, job_id: str, *, slurm: bool = True) -> None:
    spec = JobSpec(JobRequest(job_id), backend=SLURM if slurm else None)
    job = Job(job_id, job_id, spec, JobState.QUEUED, 0, "standard", 1.0)
    store.add_job(job, ev("submit", 1.0))


def run(job_id: str, n: int = 1, card: int = 0) -> Incarnation:
    return Incarnation(
        job_id, n, "n1", (card,), (), 80_000, True, IncarnationState.RUNNING, 50.0, "/r"
    )


def test_a_run_on_a_cordoned_node_is_written_running_with_its_job(
    pair: tuple[Store, Store],
) -> None:
    store, _ = pair
    add(store, "s-1")
    store.cordon(Cordon("n1", "fan noise", "alice", "operator", 10.0), ev("cordon"))
    job, clashes = store.record_run(run("s-1"), capacity_mib=CAP, event=ev("slurm_running"))
    assert (job.state, job.incarnation, job.first_started_at, clashes) == (
        JobState.RUNNING,
        1,
        50.0,
        (),
    )
    (inc,) = store.incarnations("s-1")
    assert (inc.state, inc.node, inc.cards) == (IncarnationState.RUNNING, "n1", (0,))
    assert [i.job_id for i in store.incarnations(node="n1", holding=True)] == ["s-1"]
    assert len(store.events(kinds=["slurm_running"])) == 1
    assert check_invariants(store) == []


def test_only_the_job_its_next_incarnation_and_the_fence_are_checked(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    add(a, "s-1")
    with pytest.raises(StoreConflict):
        a.record_run(run("nobody"), capacity_mib=CAP, event=ev("slurm_running"))
    with pytest.raises(StoreConflict):
        a.record_run(run("s-1", n=2), capacity_mib=CAP, event=ev("slurm_running"))
    add(a, "s-2")
    a.update_job("s-2", state=JobState.CANCELLED)
    with pytest.raises(StoreConflict):
        a.record_run(run("s-2", card=1), capacity_mib=CAP, event=ev("slurm_running"))
    a.set_fence(a.acquire_lease("a", 0.3).fence)
    assert wait_for(lambda: (lease := b.lease()) is not None and not lease.live, timeout_s=10)
    b.set_fence(b.acquire_lease("b", 15.0).fence)
    with pytest.raises(LeaseLost):
        a.record_run(run("s-1"), capacity_mib=CAP, event=ev("slurm_running"))
    assert b.incarnations() == [] and b.job("s-1") == a.job("s-1")
    assert [e.kind for e in b.events(kinds=["slurm_running"])] == []


def test_a_card_gpuctl_gives_another_job_comes_back_as_a_clash_and_the_run_is_written(
    pair: tuple[Store, Store],
) -> None:
    store, _ = pair
    add(store, "g-1", slurm=False)
    launch = dataclasses.replace(run("g-1"), state=IncarnationState.LAUNCHING)
    store.begin_launch(launch, capacity_mib=CAP, event=ev("launch"))
    add(store, "s-1")
    job, clashes = store.record_run(run("s-1"), capacity_mib=CAP, event=ev("slurm_running"))
    assert clashes == (CardClash("n1", 0, "g-1", 1),)
    assert job.state is JobState.RUNNING
    assert sorted(i.job_id for i in store.incarnations(node="n1", holding=True)) == ["g-1", "s-1"]
    assert check_invariants(store) == [
        "card 0 of n1: two owners: Slurm runs s-1#1 there, and gpuctl gives it to g-1#1"
    ]
