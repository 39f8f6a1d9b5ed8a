"""`gpuctl db check|path`: a healthy store exits 0; a store that cannot be trusted exits 6 with the
reason on stdout and the way out on stderr."""

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.store import SCHEMA_VERSION, open_store
from gpuctl.cli.main import app
from gpuctl.core.jobs.model import Event, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import ExitCode


def gpuctl(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env={"GPUCTL_STATE_DIR": None, **(env or {})})


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    with open_store(d, write=True) as store:
        store.add_job(
            Job("a-000001", "a", JobSpec(JobRequest("a")), JobState.QUEUED, 0, "standard", 1.0),
            Event(1.0, "alice", "submit", "submitted", "a-000001"),
        )
        store.begin_launch(
            Incarnation(
                "a-000001", 1, "n1", (0,), (), 100, False, IncarnationState.LAUNCHING, 2.0, "/r"
            ),
            capacity_mib={("n1", 0): 1000},
            event=Event(2.0, "gpuctl", "launch", "launching", "a-000001"),
        )
    return d


def test_a_healthy_store_reports_its_schema_and_rows_and_exits_0(state_dir: Path) -> None:
    result = gpuctl("--state-dir", str(state_dir), "db", "check")
    assert result.exit_code == 0, result.output
    assert f"database   {state_dir / 'state.db'}\n" in result.stdout
    assert f"schema     v{SCHEMA_VERSION} (this gpuctl knows v{SCHEMA_VERSION})\n" in result.stdout
    assert "rows       1 jobs, 1 incarnations, 2 events\n" in result.stdout
    assert result.stdout.endswith("healthy    yes\n")
    assert result.stderr == ""


def test_check_as_json_is_one_document(state_dir: Path) -> None:
    result = gpuctl("db", "check", "-o", "json", env={"GPUCTL_STATE_DIR": str(state_dir)})
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert (doc["healthy"], doc["problems"], doc["schema_version"], doc["jobs"]) == (
        True,
        [],
        SCHEMA_VERSION,
        1,
    )
    assert doc["database"] == str(state_dir / "state.db")


def test_no_store_yet_is_healthy_and_nothing_is_created(tmp_path: Path) -> None:
    result = gpuctl("--state-dir", str(tmp_path / "fresh"), "db", "check")
    assert result.exit_code == 0
    assert "no database yet" in result.stdout
    assert not (tmp_path / "fresh").exists()


def test_a_corrupt_store_exits_6_with_the_reason_and_a_way_out(state_dir: Path) -> None:
    db = state_dir / "state.db"
    db.write_bytes(b"not a database" * 300)
    result = gpuctl("--state-dir", str(state_dir), "db", "check")
    assert result.exit_code == ExitCode.STATE == 6
    assert f"problem    {db}: the database is unreadable or corrupt" in result.stdout
    assert result.stdout.endswith("healthy    NO\n")
    assert f"restore {db} from a backup, or move it" in result.stderr
    assert db.read_bytes() == b"not a database" * 300


def test_a_missing_store_where_one_existed_exits_6(state_dir: Path) -> None:
    (state_dir / "state.db").unlink()
    result = gpuctl("--state-dir", str(state_dir), "db", "check", "-o", "json")
    assert result.exit_code == 6
    [problem] = json.loads(result.stdout)["problems"]
    assert "the database is missing" in problem


def test_a_broken_invariant_exits_6_naming_the_job(state_dir: Path) -> None:
    raw = sqlite3.connect(state_dir / "state.db")
    with raw:
        raw.execute("UPDATE incarnations SET state = 'exited'")
    raw.close()
    result = gpuctl("--state-dir", str(state_dir), "db", "check")
    assert result.exit_code == 6
    assert (
        "problem    job a-000001: running, but its incarnation 1 is exited: nothing runs it"
        in result.stdout
    )


def test_a_double_booked_card_exits_6_with_the_capacity_it_was_granted_under(
    state_dir: Path,
) -> None:
    raw = sqlite3.connect(state_dir / "state.db")
    with raw:  # a second holder forced in behind the store's back: 100 + 950 > 1000 MiB
        raw.execute(
            "INSERT INTO jobs (id, name, spec, state, priority, tier, submitted_at, "
            "incarnation) VALUES ('b-000002', 'b', ?, 'running', 0, 'spot', 3.0, 1)",
            (json.dumps(JobSpec(JobRequest("b")).to_dict()),),
        )
        raw.execute(
            "INSERT INTO incarnations (job_id, n, node, cards, gpu_uuids, mib_per_card, "
            "whole, state, started_at, run_dir) VALUES ('b-000002', 1, 'n1', '[0]', '[]', "
            "950, 0, 'running', 3.0, '/r')"
        )
    raw.close()
    result = gpuctl("--state-dir", str(state_dir), "db", "check")
    assert result.exit_code == 6
    assert (
        "problem    card 0 of n1: 1050 MiB held (a-000001#1, b-000002#1) on a 1000 MiB card\n"
        in result.stdout
    )


def test_db_path_prints_where_the_database_lives(tmp_path: Path) -> None:
    result = gpuctl("db", "path", env={"GPUCTL_STATE_DIR": str(tmp_path / "s")})
    assert (result.exit_code, result.stdout) == (0, f"{tmp_path / 's' / 'state.db'}\n")
    assert not (tmp_path / "s").exists()
