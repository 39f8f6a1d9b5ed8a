"""`gpuctl history prune|show`: a prune says per table and level what it deleted (a dry run the
same, changing nothing); show prints the stored series in report -o csv's columns."""

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.core.history import DAY_S, FleetSample, NodeSample
from gpuctl.core.jobs.model import Event
from gpuctl.core.timefmt import parse_rfc3339
from gpuctl.testing.fakerunner import ManualClock

NOW = 1_800_000_000 + 1234  # not on a bucket's edge


def gpuctl(state: Path, *args: str, inventory: Path | None = None) -> Any:
    ctx = AppContext(clock=ManualClock(NOW))
    argv = ["--state-dir", str(state), *args]
    if inventory is not None:
        argv = ["-i", str(inventory), *argv]
    return CliRunner().invoke(app, argv, obj=ctx)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """Four days of samples every two minutes for two nodes; checkpoint and operator events."""
    path = tmp_path / "state"
    with open_store(path, write=True) as store:
        start = NOW - 4 * DAY_S
        for at in range(start - start % 120, NOW, 120):
            util = float((at // 120) % 5 * 10)
            fleet = FleetSample(at, 60, {"utilization_pct": util, "stranded_gib": 1.5})
            nodes = [
                NodeSample(at, 60, n, util + k, 100, 200, None, 80_000)
                for k, n in enumerate(("gpu01", "gpu02"))
            ]
            store.record_samples(fleet, nodes)
        for days, kind in [(20, "checkpoint"), (1, "checkpoint"), (400, "cordon"), (2, "drain")]:
            store.append_event(Event(NOW - days * DAY_S, "alice", kind, kind, node="gpu01"))
    return path


def counts(state: Path) -> dict[str, int]:
    with open_store(state, write=False) as store:
        return store.counts()


def test_prune_dry_run_says_what_the_prune_then_deletes_table_by_table(state: Path) -> None:
    before = counts(state)
    dry = gpuctl(state, "history", "prune", "--dry-run", "--retention", "3d", "-o", "json")
    assert dry.exit_code == 0, dry.output
    assert counts(state) == before  # a dry run changes nothing
    planned = json.loads(dry.stdout)
    assert planned["dry_run"] is True and planned["retention_s"] == 3 * DAY_S

    done = gpuctl(state, "history", "prune", "--retention", "3d", "-o", "json")
    assert done.exit_code == 0, done.output
    pruned = json.loads(done.stdout)
    assert pruned["dry_run"] is False
    assert pruned["tables"] == planned["tables"]
    for k in ("averaged", "dropped", "events"):
        assert pruned[k] == planned[k]
    after = counts(state)
    by_table: dict[str, int] = {}
    for t in pruned["tables"]:
        by_table[t["table"]] = by_table.get(t["table"], 0) + t["after"]
        assert t["after"] - t["rows"] == t["change"]
    assert by_table == {k: after[k] for k in ("fleet_samples", "node_samples", "events")}
    levels = {(t["table"], t["level"]): t["change"] for t in pruned["tables"]}
    assert levels[("events", "checkpoint")] == -1 and levels[("events", "other")] == -1
    assert levels[("node_samples", "1m")] < 0 < levels[("node_samples", "5m")]  # 3d: no hourly


def test_prune_prints_a_table_and_says_a_dry_run_changed_nothing(state: Path) -> None:
    result = gpuctl(state, "history", "prune", "--dry-run")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TABLE", "LEVEL", "ROWS", "AFTER", "CHANGE"]
    assert any(ln.split()[:2] == ["events", "checkpoint"] for ln in lines)
    # 30d: the 20-day-old checkpoint and the 400-day-old cordon
    assert "past the retention (30d), would delete 2 event(s)" in result.stdout
    assert lines[-1] == "dry run: nothing changed"


def test_prune_takes_the_inventorys_retention_when_no_flag_is_given(
    state: Path, tmp_path: Path
) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        "defaults:\n  history_retention: 2d\nnodes:\n  - {name: gpu01, host: 127.0.0.1}\n"
    )
    result = gpuctl(state, "history", "prune", "--dry-run", "-o", "json", inventory=inventory)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["retention_s"] == 2 * DAY_S


def test_show_prints_the_series_in_report_csvs_columns(state: Path) -> None:
    result = gpuctl(state, "history", "show", "--since", "10m", "-o", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert list(rows[0]) == ["at", "step_s", "series", "node", "value"]
    stranded = [r for r in rows if r["series"] == "stranded_gib"]
    assert len(stranded) == 5 and {r["value"] for r in stranded} == {"1.5"}
    assert {r["node"] for r in rows if r["series"] == "util_pct"} == {"gpu01", "gpu02"}
    assert {r["value"] for r in rows if r["series"] == "mem_ghost_mib"} == {""}
    assert rows[0]["at"].endswith("Z") and rows[0]["step_s"] == "60"


def test_show_keeps_one_nodes_series_when_asked(state: Path) -> None:
    args = ("history", "show", "--since", "10m", "--node", "gpu02", "--series", "util_pct")
    result = gpuctl(state, *args, "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert len(doc) == 5
    assert {(d["series"], d["node"], d["step_s"]) for d in doc} == {("util_pct", "gpu02", 60)}
    for d in doc:
        at = int(parse_rfc3339(d["at"]))
        assert d["value"] == (at // 120) % 5 * 10 + 1  # gpu02's, as seeded
    table = gpuctl(state, *args)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["AT", "STEP", "SERIES", "NODE", "VALUE"]
    assert len(lines) == 6 and all("gpu02" in ln and " 1m " in ln for ln in lines[1:])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("history", "show", "--since", "yesterday"), "--since: 'yesterday' is not a duration"),
        (("history", "show", "--since", "0"), "--since: '0' is not a duration"),
        (("history", "show", "--series", "nope"), "--series: no series 'nope'"),
        (("history", "prune", "--retention", "5x"), "--retention: '5x' is not a duration"),
        (("history", "prune", "--retention", "10m"), "--retention: must be 1h to 366d"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(state: Path, args: tuple[str, ...], says: str) -> None:
    before = counts(state)
    result = gpuctl(state, *args)
    assert result.exit_code == 2, result.output
    assert says in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert counts(state) == before
