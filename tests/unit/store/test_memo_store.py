"""The dashboard's kept store: reads remembered until another connection commits, never stale."""

import shutil
from pathlib import Path

from gpuctl.adapters.store import open_store
from gpuctl.core.jobs.model import Cordon, Event, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.ops.stores import KeptStore


def ev(kind: str, job_id: str | None = None) -> Event:
    return Event(at=100.0, actor="alice", kind=kind, message=f"{kind} happened", job_id=job_id)


def submit(state_dir: Path, job_id: str) -> None:
    job = Job(
        job_id,
        job_id,
        JobSpec(JobRequest(job_id), command=("true",)),
        JobState.QUEUED,
        0,
        "standard",
        10.0,
    )
    with open_store(state_dir, write=True) as store:
        store.add_job(job, ev("submit", job_id))


def job_ids(kept: KeptStore) -> list[str]:
    with kept(False) as store:
        return [j.id for j in store.jobs()]


def test_reads_are_remembered_while_nothing_is_committed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    submit(state, "a")
    kept = KeptStore(state)
    for _ in range(5):
        assert job_ids(kept) == ["a"]
    with kept(False) as store:
        assert getattr(store, "reads", None) == 1  # one read of the database for five polls
    kept.close()


def test_a_commit_by_another_connection_is_seen_at_the_next_read(tmp_path: Path) -> None:
    state = tmp_path / "state"
    submit(state, "a")
    kept = KeptStore(state)
    assert job_ids(kept) == ["a"]
    submit(state, "b")  # another connection (another process would be the same to SQLite)
    assert job_ids(kept) == ["a", "b"]
    with open_store(state, write=True) as store:
        store.cordon(Cordon("n1", "ecc", "alice", "operator", 1.0), ev("cordon"))
    with kept(False) as store:
        assert [c.node for c in store.cordons()] == ["n1"]
    kept.close()


def test_writes_through_the_opener_are_seen_by_its_reads(tmp_path: Path) -> None:
    state = tmp_path / "state"
    submit(state, "a")
    kept = KeptStore(state)
    with kept(False) as store:
        assert store.cordons() == []
    with kept(True) as store:
        store.cordon(Cordon("n2", "maintenance", "alice", "operator", 1.0), ev("cordon"))
    with kept(False) as store:
        assert [c.node for c in store.cordons()] == ["n2"]
    kept.close()


def test_a_state_folder_made_anew_is_read_anew(tmp_path: Path) -> None:
    state = tmp_path / "state"
    submit(state, "old")
    kept = KeptStore(state)
    assert job_ids(kept) == ["old"]
    shutil.rmtree(state)
    submit(state, "new")
    assert job_ids(kept) == ["new"]
    kept.close()


def test_no_database_yet_then_one_appears(tmp_path: Path) -> None:
    state = tmp_path / "state"
    kept = KeptStore(state)
    assert job_ids(kept) == []
    submit(state, "first")
    assert job_ids(kept) == ["first"]
    kept.close()


def test_a_caller_changing_what_it_got_changes_nothing_remembered(tmp_path: Path) -> None:
    state = tmp_path / "state"
    submit(state, "a")
    kept = KeptStore(state)
    with kept(False) as store:
        got = store.jobs()
        got.clear()
        assert [j.id for j in store.jobs()] == ["a"]
    kept.close()


def test_the_memo_stays_small_when_every_poll_asks_something_new(tmp_path: Path) -> None:
    from gpuctl.adapters.store.memo import MEMO_KEYS, MemoStore

    state = tmp_path / "state"
    submit(state, "a")
    kept = KeptStore(state)
    with kept(False) as store:
        assert isinstance(store, MemoStore)
        for i in range(300):
            store.events(since=float(i), limit=50)  # the dashboard's window moves every poll
        assert len(store._memo) == 0
        for i in range(MEMO_KEYS + 10):
            store.checkpoints(f"job-{i}")
        assert len(store._memo) <= MEMO_KEYS
    kept.close()
