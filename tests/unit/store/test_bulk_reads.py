"""The reads the control loop makes once per pass for all its jobs (`incarnations_for`,
`checkpoints_for`) answer what the per-job reads answer, on every backend, for any number of
jobs (SQLite limits a statement's parameters; the ids are one parameter)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.jobs.model import Checkpoint, IncarnationState, JobState
from tests.pg import STORES, open_test_store
from tests.unit.store.test_reservations import CAP, ev, inc, running


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


def test_every_jobs_incarnations_and_checkpoints_in_one_read_as_per_job(store: Store) -> None:
    running(store, "a-1", card=0)
    running(store, "b-1", card=1)
    store.update_incarnation("a-1", 1, state=IncarnationState.EXITED, exit_code=1)
    store.update_job("a-1", state=JobState.QUEUED)
    store.begin_launch(inc("a-1", 2, "n2", 0), capacity_mib=CAP, event=ev("launch"))
    for n, step, at in ((1, 10, 5.0), (1, 20, 6.0), (2, 30, 7.0)):
        store.add_checkpoint(Checkpoint("a-1", n, step, f"/c/{step}", at, "shared"))
    absent = [f"none-{i}" for i in range(40_000)]  # more than a statement's parameters

    incs = store.incarnations_for(["a-1", "b-1", *absent])
    assert incs["a-1"] == store.incarnations("a-1") and [i.n for i in incs["a-1"]] == [1, 2]
    assert incs["b-1"] == store.incarnations("b-1")
    assert len(incs) == 2 + len(absent) and all(incs[j] == [] for j in absent)
    held = store.incarnations_for(["a-1", "b-1"], holding=True)
    assert [i.n for i in held["a-1"]] == [2] and held["b-1"] == incs["b-1"]
    released = store.incarnations_for(["a-1", "b-1"], holding=False)
    assert [i.n for i in released["a-1"]] == [1] and released["b-1"] == []

    ckpts = store.checkpoints_for(["a-1", "b-1", *absent])
    assert ckpts["a-1"] == store.checkpoints("a-1") and [c.step for c in ckpts["a-1"]] == [
        30,
        20,
        10,
    ]
    assert ckpts["b-1"] == [] and len(ckpts) == 2 + len(absent)
    assert store.incarnations_for([]) == {} and store.checkpoints_for([]) == {}
