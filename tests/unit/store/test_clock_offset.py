"""An incarnation keeps its node's clock offset (measured at launch), in both stores, and a
store from before the column reads it as unknown until it is migrated."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.opening import open_connection
from gpuctl.adapters.store.schema import MIGRATIONS
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.core.jobs.model import Event, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from tests.pg import STORES, open_test_store

CAP = {("n1", 0): 80_000}


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


def job(job_id: str = "a-1") -> Job:
    return Job(job_id, "a", JobSpec(JobRequest("a")), JobState.QUEUED, 0, "standard", 1.0)


def inc(offset: float | None) -> Incarnation:
    return Incarnation(
        "a-1",
        1,
        "n1",
        (0,),
        ("GPU-0",),
        20_000,
        False,
        IncarnationState.LAUNCHING,
        50.0,
        "/r",
        clock_offset_s=offset,
    )


def ev(kind: str) -> Event:
    return Event(50.0, "gpuctl", kind, kind)


def test_the_clock_offset_measured_at_launch_is_kept(store: Store) -> None:
    store.add_job(job(), ev("submit"))
    store.begin_launch(inc(-612.5), capacity_mib=CAP, event=ev("launch"))
    assert [i.clock_offset_s for i in store.incarnations()] == [-612.5]


def test_the_offset_is_fixed_at_launch(tmp_path: Path) -> None:
    with open_store(tmp_path, write=True) as s:
        s.add_job(job(), ev("submit"))
        s.begin_launch(inc(None), capacity_mib=CAP, event=ev("launch"))
        with pytest.raises(ValueError, match="clock_offset_s"):
            s.update_incarnation("a-1", 1, clock_offset_s=3.0)


def test_a_v2_store_reads_offsets_as_unknown_and_is_migrated_on_write(tmp_path: Path) -> None:
    d = tmp_path / "state"
    with SqliteStore(open_connection(d, write=True, migrations=MIGRATIONS[:2])) as v2:
        v2.add_job(job(), ev("submit"))
    conn = sqlite3.connect(d / "state.db")
    with conn:  # a v2 gpuctl's launch, without the column
        conn.execute(
            "INSERT INTO incarnations (job_id, n, node, cards, gpu_uuids, mib_per_card, whole, "
            "state, started_at, run_dir) VALUES ('a-1', 1, 'n1', '[0]', '[\"GPU-0\"]', 20000, 0, "
            "'running', 50.0, '/r')"
        )
    conn.close()
    with open_store(d, write=False) as ro:  # a read never migrates
        assert ro.schema_version == 2
        assert [(i.n, i.clock_offset_s) for i in ro.incarnations()] == [(1, None)]
    with open_store(d, write=True) as rw:
        assert rw.schema_version == len(MIGRATIONS)
        assert [(i.n, i.clock_offset_s) for i in rw.incarnations()] == [(1, None)]
        assert rw.check() == []
