"""deploy/grafana/gpuctl.json: it imports anywhere (a datasource input, no fixed data source),
every query parses (promtool check rules, one recording rule per query) and names only metrics
that `gpuctl metrics serve` serves (the families of a real exposition of a fixture fleet)."""

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuctl.ops.metrics import exposition, read_fleet
from gpuctl.testing.promtool import promtool
from tests.unit.ops.test_metrics_series import NOW, XIDS, fleet, observation, store_with_jobs

DASHBOARD = Path(__file__).parents[3] / "deploy" / "grafana" / "gpuctl.json"
# what Grafana puts in place of its variables before it sends a query
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless", "inf", "nan"}  # fmt: skip


def exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (p["title"], t["expr"])
        for p in dashboard["panels"]
        for t in p.get("targets") or ()
        if t.get("expr")
    ]


def as_sent(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names of a PromQL expression: strings, label matchers, ranges and the label
    lists of by/without/on/ignoring/group_* removed, then every identifier not called as a
    function (followed by `(`) and not a keyword."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        after = text[m.end() :].lstrip()
        if after.startswith("(") or m.group() in KEYWORDS:
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3)
        names.add(m.group())
    return names


def served() -> set[str]:
    """Every sample name a real exposition can hold (families without samples included)."""
    page = exposition(read_fleet(fleet(observation("h100", XIDS)), store_with_jobs(), NOW, ()))
    out = set()
    for f in text_string_to_metric_families(page.decode()):
        out.add(f.name)
        out.update(s.name for s in f.samples)
        if f.type == "counter":
            out.add(f.name + "_total")
        if f.type == "histogram":
            out.update(f.name + s for s in ("_bucket", "_sum", "_count"))
    return out


def test_the_dashboard_imports_anywhere_through_a_datasource_input() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    for p in dashboard["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in (
        "Allocated memory per node",
        "Fragmentation and stranded memory",
        "Queue wait histogram",
        "Checkpoint age per job",
        "Failovers and preemptions",
    ):
        assert wanted in titles  # fmt: skip


def test_every_query_parses_and_names_only_metrics_the_exporter_serves(tmp_path: Path) -> None:
    queries = exprs(json.loads(DASHBOARD.read_text()))
    assert len(queries) >= 20
    rules = {
        "groups": [
            {
                "name": "gpuctl-dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": as_sent(e)}
                    for i, (_, e) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    assert f"SUCCESS: {len(queries)} rules found" in promtool("check", "rules", path)
    known = served()
    for title, expr in queries:
        names = metric_names(as_sent(expr))
        assert names, f"{title}: no metric in {expr}"
        assert names <= known, f"{title}: {sorted(names - known)} not served ({expr})"


def test_the_name_extraction_sees_metrics_and_skips_functions_labels_and_ranges() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le) (rate(gpuctl_queue_wait_seconds_bucket{x="a b"}'
        "[1h]))) > 1e3 or max by (node, gpu) (gpuctl_gpu_last_xid) * on(UUID) "
        "group_left(job_id) gpuctl_gpu_job_info"
    )
    assert metric_names(expr) == {
        "gpuctl_queue_wait_seconds_bucket",
        "gpuctl_gpu_last_xid",
        "gpuctl_gpu_job_info",
    }
