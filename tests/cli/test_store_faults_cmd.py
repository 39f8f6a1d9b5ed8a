"""The state store failing under gpuctl, as the operator sees it: `reconcile --watch` stops with
exit 6 and one line naming the database when the file is truncated under it; a full disk is said
to be a full disk, and `db check` then says to free space, not to restore a backup."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuctl.adapters.store import failures, open_store, opening
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.core.jobs.model import Event, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest

CLI = [sys.executable, "-c", "from gpuctl.cli.main import run; run()"]


def filled(state: Path, jobs: int = 30) -> None:
    with open_store(state, write=True) as store:
        for i in range(jobs):
            j = Job(
                f"job-{i:06d}",
                "job",
                JobSpec(JobRequest("job"), env={"PAD": "x" * 200}),
                JobState.HELD,
                0,
                "spot",
                1.0,
            )
            store.add_job(j, Event(1.0, "alice", "submit", "submitted", j.id))


def test_watch_stops_with_exit_6_when_its_database_is_truncated_under_it(tmp_path: Path) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text("nodes:\n  - {name: gone, host: 127.0.0.1, port: 9, gpus: 1}\n")
    state = tmp_path / "state"
    filled(state)
    db = state / "state.db"
    argv = [*CLI, "--state-dir", str(state), "-i", str(inventory), "reconcile", "--watch"]
    proc = subprocess.Popen(
        [*argv, "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        seen = [proc.stderr.readline() for _ in range(2)]  # the first pass's events
        assert any(line.startswith("node_failing: gone") for line in seen), seen
        size = db.stat().st_size
        os.truncate(db, size // 2)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 6, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {db}: the database file shrank from {size} to {size // 2} bytes while gpuctl "
        "had it open (truncated or overwritten); refusing to use it"
    ], err
    assert "hint: run `gpuctl db check`" in err
    assert "Traceback" not in err


def full_after_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every store opened is as on a full disk: SQLite may add no page to the file."""
    connect = opening._connect

    def connect_full(path: Path, *, write: bool) -> sqlite3.Connection:
        conn = connect(path, write=write)
        conn.execute(f"PRAGMA max_page_count = {path.stat().st_size // 4096}")
        return conn

    monkeypatch.setattr(opening, "_connect", connect_full)


def test_a_submit_on_a_full_disk_says_so_and_exits_6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    filled(state, jobs=1)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: big\ncommand: [echo, {'x' * 20_000}]\nresources: {{gpus: 1}}\n")
    full_after_open(monkeypatch)
    argv = ["--state-dir", str(state), "submit", str(spec)]
    result = CliRunner().invoke(app, argv, obj=AppContext())
    assert result.exit_code == 6, result.output
    db = state / "state.db"
    assert result.stderr.splitlines() == [
        f"error: {db}: the disk is full (SQLite: database or disk is full); nothing was "
        "written, the database is as it was",
        f"hint: free space on the disk that holds {state}, then run the command again",
    ]
    monkeypatch.undo()
    with open_store(state, write=False) as store:
        assert [j.name for j in store.jobs()] == ["job"] and store.check() == []


def test_db_check_on_a_full_disk_says_to_free_space_not_to_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    filled(state, jobs=1)
    (state / "state.db").write_bytes(b"garbage" * 100)  # unreadable, as SQLite is with no room
    argv = ["--state-dir", str(state), "db", "check"]
    before = CliRunner().invoke(app, argv, obj=AppContext())
    assert before.exit_code == 6 and "restore" in before.stderr
    monkeypatch.setattr(failures, "free_space", lambda _: (0, 1000))  # as statvfs on a full disk
    result = CliRunner().invoke(app, argv, obj=AppContext())
    assert result.exit_code == 6, result.output
    assert result.stderr == (
        f"hint: the disk that holds {state} is full (a full disk damages nothing): free space "
        "there, then run gpuctl db check again\n"
    )
