"""The store fails closed: state it cannot trust is refused with a hint, never replaced by an
empty store, and nothing is created or overwritten while refusing."""

import sqlite3
from pathlib import Path

import pytest

from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.dbapi import Conn
from gpuctl.adapters.store.opening import open_connection
from gpuctl.adapters.store.schema import MIGRATIONS, Dialect, Migration
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.core.jobs.model import Event, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import ExitCode, StateError


def filled(state_dir: Path, jobs: int = 30) -> None:
    """A store with some jobs, closed (its WAL folded into the database file)."""
    with open_store(state_dir, write=True) as s:
        for i in range(jobs):
            j = Job(
                f"job-{i:06d}",
                "job",
                JobSpec(JobRequest("job"), env={"PAD": "x" * 200}),
                JobState.QUEUED,
                0,
                "spot",
                1.0,
            )
            s.add_job(j, Event(1.0, "alice", "submit", "submitted", j.id))


def files(state_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(state_dir.iterdir()) if p.is_file()}


def refused(state_dir: Path, *, write: bool, match: str) -> StateError:
    before = files(state_dir)
    with pytest.raises(StateError, match=match) as info:
        open_store(state_dir, write=write)
    assert files(state_dir) == before, "a refused open changed the state folder"
    assert info.value.exit_code is ExitCode.STATE
    assert info.value.hint is not None and "gpuctl db check" in info.value.hint
    return info.value


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    filled(d)
    return d


@pytest.mark.parametrize("write", [True, False])
def test_garbage_in_the_database_is_refused_and_left_as_it_is(state_dir: Path, write: bool) -> None:
    (state_dir / "state.db").write_bytes(b"\x00garbage, not SQLite\n" * 500)
    error = refused(state_dir, write=write, match="unreadable or corrupt")
    assert str(state_dir / "state.db") in error.message


def test_a_damaged_page_is_caught_by_the_check_at_open(state_dir: Path) -> None:
    db = state_dir / "state.db"
    raw = bytearray(db.read_bytes())
    raw[4096 * 3 : 4096 * 3 + 8] = b"\xff" * 8  # the header of the jobs table's root page
    db.write_bytes(bytes(raw))
    refused(state_dir, write=True, match="corrupt")


def test_garbage_is_refused_even_where_no_marker_says_a_store_existed(state_dir: Path) -> None:
    (state_dir / "store.id").unlink()
    (state_dir / "state.db").write_bytes(b"garbage" * 100)
    refused(state_dir, write=True, match="unreadable or corrupt")


@pytest.mark.parametrize("write", [True, False])
def test_a_missing_database_where_one_existed_is_refused(state_dir: Path, write: bool) -> None:
    (state_dir / "state.db").unlink()
    error = refused(state_dir, write=write, match="the database is missing")
    assert "move" in (error.hint or "")
    assert not (state_dir / "state.db").exists()


def test_an_emptied_database_where_one_existed_is_refused(state_dir: Path) -> None:
    (state_dir / "state.db").write_bytes(b"")
    refused(state_dir, write=True, match="the database is empty")


def test_another_stores_database_is_refused(state_dir: Path, tmp_path: Path) -> None:
    filled(tmp_path / "other", jobs=1)
    (state_dir / "state.db").write_bytes((tmp_path / "other" / "state.db").read_bytes())
    refused(state_dir, write=True, match="refusing to use another store's state")


def test_a_sqlite_file_that_is_not_gpuctls_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    conn = sqlite3.connect(d / "state.db")
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.commit()
    conn.close()
    refused(d, write=True, match="not a gpuctl state database")


def test_a_database_that_cannot_be_opened_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "state"
    (d / "state.db").mkdir(parents=True)
    refused(d, write=True, match="not a regular file")


NOW = len(MIGRATIONS)  # the schema version of this gpuctl
NEXT = NOW + 1


def next_chain() -> tuple[Migration, ...]:
    def add_column(conn: Conn, dialect: Dialect) -> None:
        conn.execute("ALTER TABLE jobs ADD COLUMN future_note TEXT")

    return (*MIGRATIONS, Migration(NEXT, "jobs.future_note", add_column))


def test_a_newer_schema_is_refused_for_writing_and_left_untouched(state_dir: Path) -> None:
    SqliteStore(open_connection(state_dir, write=True, migrations=next_chain())).close()
    error = refused(state_dir, write=True, match=f"schema version {NEXT} is newer than this gpuctl")
    assert f"({NOW})" in error.message
    refused(state_dir, write=False, match=f"schema version {NEXT} is newer")


def test_an_older_schema_is_migrated_on_write_after_a_backup_and_read_as_it_is(
    state_dir: Path,
) -> None:
    with SqliteStore(open_connection(state_dir, write=False, migrations=next_chain())) as ro:
        assert ro.schema_version == NOW  # a read never migrates
        assert len(ro.jobs()) == 30
    assert not (state_dir / f"state.db.v{NOW}.bak").exists()
    with SqliteStore(open_connection(state_dir, write=True, migrations=next_chain())) as rw:
        assert (rw.schema_version, rw.known_version) == (NEXT, NEXT)
        assert len(rw.jobs()) == 30
        assert rw.check() == []
    conn = sqlite3.connect(state_dir / "state.db")
    assert "future_note" in [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
    conn.close()
    backup = sqlite3.connect(state_dir / f"state.db.v{NOW}.bak")
    version = backup.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    assert version == (str(NOW),)
    assert backup.execute("SELECT count(*) FROM jobs").fetchone() == (30,)
    backup.close()


def test_migrations_must_be_numbered_in_order(tmp_path: Path) -> None:
    broken = (MIGRATIONS[0], Migration(3, "skips 2", lambda conn: None))
    with pytest.raises(ValueError, match=r"numbered 1..n in order, got \[1, 3\]"):
        open_connection(tmp_path / "state", write=True, migrations=broken)


def test_a_creation_that_never_finished_is_completed(tmp_path: Path) -> None:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    (d / "state.db").write_bytes(b"")  # crashed after creating the file, before the schema
    with open_store(d, write=True) as s:
        assert s.schema_version == NOW and s.jobs() == []
        assert s.database_id in (d / "store.id").read_text()


def test_a_lost_marker_is_written_again_from_the_database(state_dir: Path) -> None:
    marker = (state_dir / "store.id").read_text()
    (state_dir / "store.id").unlink()
    with open_store(state_dir, write=True) as s:
        assert len(s.jobs()) == 30
        assert s.database_id in (state_dir / "store.id").read_text()
        assert s.database_id in marker


def test_a_damaged_marker_is_refused(state_dir: Path) -> None:
    (state_dir / "store.id").write_text("{not json")
    refused(state_dir, write=True, match="store marker is damaged")
