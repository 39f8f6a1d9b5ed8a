"""`gpuctl controller status`, and a read-only PostgreSQL role refused on a mutating verb in one
line (on the real server of tests/pg.py)."""

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from gpuctl.adapters.store.postgres import open_url
from gpuctl.cli.main import app
from gpuctl.errors import ExitCode


def gpuctl(*args: str, env: dict[str, str | None] | None = None) -> Result:
    base: dict[str, str | None] = {"GPUCTL_STATE_DIR": None, "GPUCTL_STATE_URL": None}
    return CliRunner().invoke(app, list(args), env={**base, **(env or {})})


def test_status_names_the_leader_its_token_and_expiry_and_exits_1_without_one(
    pg_url: str,
) -> None:
    env: dict[str, str | None] = {"GPUCTL_STATE_URL": pg_url}
    with open_url(pg_url, write=True) as store:
        store.set_fence(store.acquire_lease("host-a:41:beef", 15.0).fence)
        store.heartbeat("host-a:41:beef", "leader", 15.0)
        store.heartbeat("host-b:42:cafe", "standby", 15.0)
        store.mark_pass()
        shown = gpuctl("controller", "status", "-o", "json", env=env)
        assert shown.exit_code == 0, shown.output
        doc = json.loads(shown.stdout)
        assert (doc["leader"], doc["token"], doc["standbys"]) == (
            "host-a:41:beef",
            1,
            ["host-b:42:cafe"],
        )
        assert doc["lease_expires_at"].endswith("Z") and doc["last_pass_at"].endswith("Z")
        table = gpuctl("controller", "status", env=env)
        assert table.stdout.startswith("leader     host-a:41:beef\ntoken      1\n")
        store.release_lease()
    gone = gpuctl("controller", "status", env=env)
    assert gone.exit_code == ExitCode.ERROR
    assert gone.stdout.startswith("leader     none\n")
    assert gone.stderr == "no controller holds a live lease\n"


def test_a_read_only_role_is_told_in_one_line_that_it_cannot_submit(
    pg_url: str, tmp_path: Path
) -> None:
    open_url(pg_url, write=True).close()  # the owner created the tables
    with open_url(pg_url, write=True) as store:
        conn = store._pg  # the owner's connection: grants as a DBA would give them
        conn.execute("CREATE ROLE gpuctl_viewer LOGIN")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO gpuctl_viewer")
    viewer = pg_url.replace("postgresql://gpuctl@", "postgresql://gpuctl_viewer@")
    spec = tmp_path / "train.yaml"
    spec.write_text("name: train\ncommand: [python, train.py]\nresources:\n  gpus: 1\n")
    listed = gpuctl("jobs", "list", env={"GPUCTL_STATE_URL": viewer})
    assert listed.exit_code == 0, listed.output  # reading is allowed
    refused = gpuctl("submit", str(spec), env={"GPUCTL_STATE_URL": viewer})
    assert refused.exit_code == ExitCode.STATE
    assert refused.stderr.splitlines()[0] == (
        "error: read-only: this role cannot change the state (submit)"
    )
    assert "Traceback" not in refused.output
