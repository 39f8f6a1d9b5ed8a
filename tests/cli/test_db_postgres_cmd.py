"""The state in PostgreSQL from the command line: `--state-url` / `GPUCTL_STATE_URL` route every
command there, `db path` shows the URL, a password in it is refused, an unreachable server is one
line and exit 6, and `db migrate` copies a SQLite store into an empty database."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.postgres import open_url
from gpuctl.cli.main import app
from gpuctl.core.jobs.model import (
    Checkpoint,
    Cordon,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
)
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import ExitCode


def gpuctl(*args: str, env: dict[str, str | None] | None = None) -> Result:
    base: dict[str, str | None] = {"GPUCTL_STATE_DIR": None, "GPUCTL_STATE_URL": None}
    return CliRunner().invoke(app, list(args), env={**base, **(env or {})})


def job(n: int) -> Job:
    return Job(f"a-{n:06d}", "a", JobSpec(JobRequest("a")), JobState.QUEUED, 0, "standard", n)


@pytest.fixture
def sqlite_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    with open_store(d, write=True) as store:
        for n in range(1, 4):
            store.add_job(job(n), Event(n, "alice", "submit", "submitted", f"a-{n:06d}"))
        store.begin_launch(
            Incarnation(
                "a-000001", 1, "n1", (0,), ("G0",), 100, False, IncarnationState.LAUNCHING, 5, "/r"
            ),
            capacity_mib={("n1", 0): 1000},
            event=Event(5.0, "gpuctl", "launch", "launching", "a-000001"),
        )
        store.add_checkpoint(Checkpoint("a-000001", 1, 7, "/c/7", 6.0, "node"))
        store.cordon(Cordon("n2", "fan", "bob", "person", 6.0), Event(6.0, "bob", "cordon", "c"))
    return d


def test_every_command_reads_and_writes_the_database_of_the_state_url(pg_url: str) -> None:
    with open_url(pg_url, write=True) as store:
        store.add_job(job(1), Event(1.0, "alice", "submit", "submitted", "a-000001"))
    listed = gpuctl("jobs", "list", "-o", "json", env={"GPUCTL_STATE_URL": pg_url})
    assert listed.exit_code == 0, listed.output
    assert [j["id"] for j in json.loads(listed.stdout)] == ["a-000001"]
    checked = gpuctl("--state-url", pg_url, "db", "check")
    assert checked.exit_code == 0, checked.output
    assert "rows       1 jobs, 0 incarnations, 1 events\n" in checked.stdout


def test_db_path_shows_the_url(pg_url: str) -> None:
    result = gpuctl("db", "path", "--state-url", pg_url)
    assert (result.exit_code, result.stdout) == (0, f"{pg_url}\n")


@pytest.mark.parametrize("where", ["--state-url", "GPUCTL_STATE_URL"])
def test_a_state_url_with_a_password_is_refused_and_never_shown(where: str) -> None:
    given = "postgresql://alice:s3cret@db.example/gpuctl"
    args, env = (["--state-url", given], {}) if where == "--state-url" else ([], {where: given})
    result = gpuctl(*args, "db", "path", env=env)
    assert result.exit_code == ExitCode.USAGE
    assert "s3cret" not in result.output
    assert result.stderr.startswith(f"error: {where}: the URL carries a password")
    assert ".pgpass" in result.stderr and "Traceback" not in result.output


def test_an_unreachable_server_is_one_line_naming_the_host_and_exit_6() -> None:
    url = "postgresql://gpuctl@127.0.0.1:1/gpuctl?connect_timeout=2"
    result = gpuctl("--state-url", url, "jobs", "list")
    assert result.exit_code == ExitCode.STATE
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: PostgreSQL at 127.0.0.1:1/gpuctl: cannot connect")
    assert "Traceback" not in result.output


def test_db_migrate_copies_every_row_in_one_go(sqlite_dir: Path, pg_url: str) -> None:
    dry = gpuctl("--state-dir", str(sqlite_dir), "db", "migrate", "--to", pg_url, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "jobs             3\n" in dry.stdout and "would copy" in dry.stderr
    with open_url(pg_url, write=False) as target:
        assert target.ephemeral  # the dry run created nothing

    done = gpuctl("--state-dir", str(sqlite_dir), "db", "migrate", "--to", pg_url, "-o", "json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["tables"]["events"] == 5
    with open_store(sqlite_dir, write=False) as src, open_url(pg_url, write=True) as dst:
        assert dst.jobs() == src.jobs()
        assert dst.incarnations() == src.incarnations()
        assert dst.events() == src.events()
        assert dst.checkpoints("a-000001") == src.checkpoints("a-000001")
        assert dst.cordons() == src.cordons()
        assert dst.card_capacities() == src.card_capacities()
        assert dst.check() == []
        assert dst.append_event(Event(9.0, "al", "x", "after the copy")) == 6  # ids go on


def test_db_migrate_refuses_a_database_that_holds_rows(sqlite_dir: Path, pg_url: str) -> None:
    with open_url(pg_url, write=True) as store:
        store.add_job(job(9), Event(1.0, "alice", "submit", "submitted", "a-000009"))
    result = gpuctl("--state-dir", str(sqlite_dir), "db", "migrate", "--to", pg_url)
    assert result.exit_code == ExitCode.STATE
    assert "already holds rows (1 jobs, 1 events)" in result.stderr
    with open_url(pg_url, write=False) as store:
        assert [j.id for j in store.jobs()] == ["a-000009"]  # nothing half-written
