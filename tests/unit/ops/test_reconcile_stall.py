"""A running job that stops committing checkpoints (SIGSTOPped, hung) gets one `stalled` alert per
stall and a reason that says so, cleared by its next commit; gpuctl does nothing else about it.
Against both stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.jobs.model import IncarnationState, Job, JobState
from gpuctl.testing.drainkit import CKPT, Kit
from tests.pg import STORES, open_test_store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


def commit(k: Kit, job: Job, step: int) -> None:
    k.cluster.commit(f"{CKPT}/{job.id}", step=step, incarnation=1, committed_at=k.clock.now())


def working(k: Kit, job: Job, steps: range) -> None:
    """The job commits `steps`, one every 20 s, a pass after each."""
    for step in steps:
        commit(k, job, step)
        k.step(0)
        k.clock.advance(20)


def alerts(store: Store, job: Job) -> list[tuple[str | None, str]]:
    return [(e.outcome, e.message) for e in store.events(job_id=job.id, kinds=["stalled"])]


def test_a_job_that_stops_committing_is_alerted_once_and_cleared_by_its_next_commit(
    store: Store,
) -> None:
    k = Kit.make(store)
    job = k.submit("train")
    k.step()
    working(k, job, range(10, 50, 10))  # every 20 s: alerted past max(3 x 20 s, 60 s)
    k.step(0)  # 20 s after step 40
    k.step(35)  # 55 s: within
    assert alerts(store, job) == [] and k.job(job.id).reason is None
    k.step(10)  # 65 s without a commit: stalled
    for _ in range(5):
        k.step(30)
    ((outcome, message),) = alerts(store, job)  # one alert, not one per pass
    assert outcome == "alert" and "nothing after step 40 for 1m05s" in message
    assert "committed every 20s" in message
    reason = k.job(job.id).reason
    assert reason == "stalled: nothing after step 40 for over 1m00s (it committed every 20s)"
    inc = k.inc(job.id)  # nothing is done about it
    assert (inc.n, inc.state, k.job(job.id).state) == (
        1,
        IncarnationState.RUNNING,
        JobState.RUNNING,
    )
    assert k.signals(job.id) == []
    commit(k, job, 50)
    k.step(1)
    assert alerts(store, job)[-1] == (
        "ok",
        f"{job.id} makes progress again: step 50 committed (stall alert cleared)",
    )
    assert k.job(job.id).reason is None
    for _ in range(4):
        k.step(30)  # a second stall: a second alert
    assert [o for o, _ in alerts(store, job)] == ["alert", "ok", "alert"]


def test_a_job_with_no_known_checkpoint_cadence_is_never_called_stalled(store: Store) -> None:
    k = Kit.make(store)
    job = k.submit("train")
    k.step()
    commit(k, job, 10)  # one commit: no interval to judge by
    for _ in range(10):
        k.step(600)
    assert alerts(store, job) == [] and k.job(job.id).reason is None
