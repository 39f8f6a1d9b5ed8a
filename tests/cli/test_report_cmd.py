"""`gpuctl report`: one JSON document with the numbers now (those of `gpuctl status`) and over
the window, the worst nodes, stranded capacity and notable events; Markdown for people."""

import datetime as dt
import json
import re
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from gpuctl.adapters.store import open_store
from gpuctl.core.jobs.model import Event
from gpuctl.testing.fakes import fake_node_env
from tests.cli.test_metrics_cmd import NODES, gpuctl, record_history, transport

RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"  # UTC, to the second
TIME_KEYS = {"now", "queue_oldest_wait_s", "checkpoint_age_max_s", "checkpoint_age_p95_s"}


@pytest.fixture
def node_env(tmp_path: Path) -> dict[str, str]:
    return fake_node_env(tmp_path, "gpu01")


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    nodes = "".join(
        f"  - {{name: {n}, host: 127.0.0.1, port: {2201 + i}}}\n" for i, n in enumerate(NODES)
    )
    path.write_text("nodes:\n" + nodes)
    return path


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def report_json(inventory: Path, state: Path, node_env: dict[str, str], *args: str) -> Any:
    result = gpuctl(inventory, state, transport(node_env, "gpu03"), "report", "-o", "json", *args)
    assert result.exit_code == 3, result.output  # like status: some node did not answer
    return json.loads(result.stdout)


def test_json_has_the_status_numbers_now_and_the_window_figures(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    now = time.time()
    record_history(state, now)
    status = gpuctl(inventory, state, transport(node_env, "gpu03"), "status", "-o", "json")
    doc = report_json(inventory, state, node_env, "--window", "24h")
    assert list(doc) == [
        "generated_at",
        "window",
        "window_s",
        "fleet",
        "numbers",
        "worst_nodes",
        "stranded",
        "events",
        "store_error",
    ]
    assert (doc["window"], doc["window_s"], doc["store_error"]) == ("1d00h", 86400.0, None)
    assert re.fullmatch(RFC3339, doc["generated_at"]), doc["generated_at"]
    assert {k: doc["fleet"][k] for k in ("nodes", "nodes_up", "gpus")} == {
        "nodes": 3,
        "nodes_up": 2,
        "gpus": 4,
    }
    numbers = json.loads(status.stdout)["numbers"]
    same = {k: v for k, v in doc["numbers"]["now"].items() if k not in TIME_KEYS}
    assert same == {k: v for k, v in numbers.items() if k not in TIME_KEYS}
    window = doc["numbers"]["window"]
    assert window["failover_success_pct"] == 100.0
    assert window["preemptions_per_hour"] == pytest.approx(1 / 24)
    # a held 8 GiB for 7170 s; b 16 GiB for 1710 s, then again for 1700 s
    held = (8192 * 7170 + 16384 * (1710 + 1700)) / 86400
    assert window["allocated_avg_mib"] == pytest.approx(held, rel=0.01)
    capacity = doc["numbers"]["now"]["capacity_mib"]
    assert window["utilization_avg_pct"] == pytest.approx(100 * held / capacity, rel=0.01)


def test_a_shorter_window_counts_only_what_happened_inside_it(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    record_history(state, time.time())
    doc = report_json(inventory, state, node_env, "--window", "30m")
    window = doc["numbers"]["window"]
    assert (doc["window"], doc["window_s"]) == ("30m00s", 1800.0)
    assert window["queue_started"] == 0  # a and b first started more than 30 min ago
    assert window["preemptions"] == 0  # b was preempted 30 min ago, at the edge: outside
    assert doc["events"]["counts"]["preempt"] == 2  # the audit events are a minute old


def test_worst_nodes_put_the_unreachable_first_and_events_are_listed(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    record_history(state, time.time())
    doc = report_json(inventory, state, node_env)
    worst = doc["worst_nodes"]
    assert [w["name"] for w in worst] == ["gpu03"]  # the answering nodes are healthy
    assert worst[0]["reach"] == "refused" and worst[0]["schedulable"] is False
    assert worst[0]["verdict"] == "unknown"
    assert any("gpu03: refused" in r for r in worst[0]["reasons"])
    assert doc["stranded"]["unschedulable"] == [
        {"node": "gpu03", "reason": "unreachable (refused)", "capacity_mib": 0}
    ]
    assert isinstance(doc["stranded"]["fragmentation_pct"], float)  # measured on the free cards
    assert doc["events"]["counts"] == {
        "failover": 1,
        "preempt": 2,
        "drain": 1,
        "over_slice": 0,
        "hold": 0,
        "node_down": 0,
        "suspect_network": 0,
    }
    assert [e["kind"] for e in doc["events"]["notable"]] == [
        "failover",
        "preempt",
        "preempt",
        "drain",
    ]
    assert all(re.fullmatch(RFC3339, e["at"]) for e in doc["events"]["notable"])


def test_markdown_has_a_title_a_numbers_table_and_the_sections(
    inventory: Path, state: Path, node_env: dict[str, str], in_india: ZoneInfo
) -> None:
    record_history(state, time.time())
    held_at = float(int(time.time()))
    store = open_store(state, write=True)
    try:
        message = "c held: \x1b[2Jcrash loop | 3 exits"
        store.append_event(Event(held_at, "gpuctl", "hold", message, "c", "gpu01"))
    finally:
        store.close()
    result = gpuctl(inventory, state, transport(node_env, "gpu03"), "report")
    assert result.exit_code == 3, result.output
    md = result.stdout
    lines = md.splitlines()
    assert lines[0] == "# gpuctl fleet report"
    # times in local time with the zone, as in jobs show; -o json has them in RFC 3339, UTC
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+05:30"
    assert re.match(rf"Generated {stamp} · window 1d00h · 3 node\(s\)", lines[2]), lines[2]
    local = dt.datetime.fromtimestamp(held_at, in_india).strftime("%Y-%m-%d %H:%M:%S +05:30")
    assert f"- {local} **hold** gpu01 c: c held: [2Jcrash loop \\| 3 exits" in lines
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == [
        "## Numbers",
        "## Worst nodes",
        "## Stranded capacity",
        "## Notable events (1d00h)",
    ]
    assert "| Number | Now | Over 1d00h |" in lines
    util = report_json(inventory, state, node_env)
    pct = util["numbers"]["now"]["utilization_pct"]
    assert any(
        line.startswith(f"| Utilization (allocated) | {pct:.0f}% (idle silicon, < 50%) |")
        for line in lines
    )
    assert any(
        line.startswith("| Failover success | — | 100% (1 of 1); 0 drain move(s) apart |")
        for line in lines
    )
    assert any(line.startswith("- **gpu03**: unknown; does not answer (refused)") for line in lines)
    assert "\x1b" not in md
    assert any("**hold** gpu01 c: c held: [2Jcrash loop \\| 3 exits" in line for line in lines)


def test_a_bad_window_is_a_usage_error(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    t = transport(node_env)
    for bad in ("soon", "0h", "400d", ""):
        result = gpuctl(inventory, state, t, "report", "--window", bad)
        assert result.exit_code == 2, bad
        assert result.stderr.startswith("error: --window"), result.stderr
    assert t.calls == []  # refused before polling anything


def test_without_a_store_the_report_has_the_fleet_and_null_job_figures(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    result = gpuctl(inventory, state, transport(node_env, *NODES), "report", "-o", "json")
    assert result.exit_code == 4  # nobody answered
    doc = json.loads(result.stdout)
    assert doc["fleet"]["nodes_up"] == 0
    assert doc["numbers"]["now"]["utilization_pct"] is None
    assert doc["numbers"]["window"]["allocated_avg_mib"] == 0.0
    assert [w["name"] for w in doc["worst_nodes"]] == list(NODES)
    assert not state.exists()  # a report writes nothing
