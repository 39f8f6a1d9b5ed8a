"""A store kept open (the control loop's) stops at its next read or write when its database file is
truncated or replaced under it, and a full disk is reported as a full disk, with nothing damaged."""

import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.failures import state_error
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.core.jobs.model import Checkpoint, Event, Job, JobState, NodeLiveness
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import ExitCode, StateError, StoreConflict, StoreCorrupt, StoreFull


def padded(pad: int) -> JobSpec:
    return JobSpec(JobRequest("job"), env={"PAD": "x" * pad})


def job(i: int, pad: int = 200) -> Job:
    return Job(f"job-{i:06d}", "job", padded(pad), JobState.QUEUED, 0, "spot", 1.0)


def submit(store: SqliteStore, i: int, pad: int = 200) -> None:
    j = job(i, pad)
    store.add_job(j, Event(1.0, "alice", "submit", "submitted", j.id))


def loop_pass(store: SqliteStore, t: float) -> None:
    """What a pass of the control loop reads and writes."""
    store.jobs()
    store.incarnations(holding=True)
    store.cordons()
    store.liveness()
    store.set_liveness(NodeLiveness("gpu01", t, None, False))
    store.add_checkpoint(Checkpoint("job-000001", 1, int(t), "/ckpt", t, "node"))
    store.append_event(Event(t, "gpuctl", "observe", "a pass"))


@pytest.fixture
def loop_store(tmp_path: Path) -> Iterator[SqliteStore]:
    """A store of 30 jobs held open as the loop holds it, a few passes in (its pages cached)."""
    state = tmp_path / "state"
    with open_store(state, write=True) as store:
        for i in range(30):
            submit(store, i)
    store = open_store(state, write=True)
    for t in range(5):
        loop_pass(store, float(t))
    yield store
    store.close()


def refused_corrupt(store: SqliteStore, match: str) -> StoreCorrupt:
    with pytest.raises(StoreCorrupt, match=match) as info:
        loop_pass(store, 100.0)
    error = info.value
    assert error.exit_code is ExitCode.STATE
    assert error.message.startswith(f"{store.path}: ") and "\n" not in error.message
    assert error.hint == "run `gpuctl db check`"
    return error


def test_a_database_truncated_under_the_loop_is_refused_at_its_next_pass(
    loop_store: SqliteStore,
) -> None:
    db = loop_store.path
    size = db.stat().st_size
    os.truncate(db, size // 2)
    refused_corrupt(loop_store, f"shrank from {size} to {size // 2} bytes")
    # and it stays refused: no write reaches the file, not even one that SQLite could serve
    with pytest.raises(StoreCorrupt):
        loop_store.set_liveness(NodeLiveness("gpu01", 200.0, None, False))
    with pytest.raises(StoreCorrupt):
        loop_store.jobs()
    assert db.stat().st_size == size // 2


def test_a_database_replaced_under_the_loop_is_refused_at_its_next_pass(
    loop_store: SqliteStore, tmp_path: Path
) -> None:
    db = loop_store.path
    backup = tmp_path / "restored.db"
    shutil.copyfile(db, backup)
    os.replace(backup, db)  # someone restores a backup while the loop runs
    refused_corrupt(loop_store, "the database file was replaced while gpuctl had it open")


def test_a_database_removed_under_the_loop_is_refused_at_its_next_pass(
    loop_store: SqliteStore,
) -> None:
    loop_store.path.unlink()
    refused_corrupt(loop_store, "the database file was removed")


def test_a_page_damaged_under_the_loop_is_store_corrupt_at_its_next_pass(
    loop_store: SqliteStore,
) -> None:
    db = loop_store.path
    raw = bytearray(db.read_bytes())
    raw[4096 * 3 : 4096 * 3 + 8] = b"\xff" * 8  # the header of the jobs table's root page
    db.write_bytes(bytes(raw))  # the same file, the same size: only SQLite can tell
    corrupt = "the database is corrupt: database disk image is malformed"
    with pytest.raises(StoreCorrupt, match=corrupt) as info, loop_store.loop_lock():
        loop_pass(loop_store, 100.0)
    assert info.value.hint == "run `gpuctl db check`"
    with pytest.raises(StoreCorrupt):  # refused from then on
        loop_store.cordons()


def test_a_full_database_says_the_disk_is_full_and_rolls_the_change_back(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with open_store(state, write=True) as store:
        submit(store, 0)
    store = open_store(state, write=True)
    try:
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        # SQLite's own SQLITE_FULL, as on a full disk: no page may be added to the file
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StoreFull) as info:
            submit(store, 1, pad=20_000)
        error = info.value
        assert error.exit_code is ExitCode.STATE
        assert error.message == (
            f"{store.path}: the disk is full (SQLite: database or disk is full); nothing was "
            "written, the database is as it was"
        )
        assert (
            error.hint == f"free space on the disk that holds {state}, then run the command again"
        )
        assert [j.id for j in store.jobs()] == ["job-000000"]
        store._conn.execute("PRAGMA max_page_count = 1073741823")  # space freed
        submit(store, 1, pad=20_000)  # the same store goes on: no transaction was left open
    finally:
        store.close()
    with open_store(state, write=False) as again:
        assert [j.id for j in again.jobs()] == ["job-000000", "job-000001"]
        assert again.check() == []


def io_error(name: str, code: int) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = code  # what sqlite3 sets, as on a real failure
    exc.sqlite_errorname = name
    return exc


SHMSIZE = io_error("SQLITE_IOERR_SHMSIZE", 4874)  # growing state.db-shm on a full disk


@pytest.mark.parametrize(
    ("free", "full"),
    [((0, 1000), True), ((10 << 30, 0), True), ((10 << 30, 1000), False), (None, False)],
)
def test_an_io_error_is_a_full_disk_when_the_state_folder_has_no_room(
    tmp_path: Path, free: tuple[int, int] | None, full: bool
) -> None:
    db = tmp_path / "state" / "state.db"
    error = state_error(SHMSIZE, db, f"{db}: unreadable", space=lambda _: free)
    assert isinstance(error, StoreFull) is full
    if full:
        assert error.message.startswith(f"{db}: the disk is full (SQLite: disk I/O error)")
        assert "free space" in (error.hint or "")
    else:
        assert type(error) is StateError and error.message == f"{db}: unreadable"


def test_a_store_kept_busy_by_another_writer_is_a_conflict_to_retry_not_a_broken_store(
    loop_store: SqliteStore,
) -> None:
    # A conflict skips one job's step (or the pass) and the loop tries again; any other
    # StateError stops the control loop, failing closed.
    loop_store._conn.execute("PRAGMA busy_timeout = 50")
    other = sqlite3.connect(loop_store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another gpuctl in the middle of its write
        with pytest.raises(StoreConflict, match="stayed busy"):
            loop_pass(loop_store, 9.0)
        other.execute("ROLLBACK")
        loop_pass(loop_store, 10.0)  # and the next pass goes through
    finally:
        other.close()
