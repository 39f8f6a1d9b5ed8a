"""Lists of nodes printed for people are one hostlist (`gpu[01-04,07]`), as ClusterShell folds
them; `-o json` keeps every name."""

from __future__ import annotations

import json

import pytest

from gpuctl.cli.reconcile import _print
from gpuctl.cli.render import Output
from gpuctl.ops.loop.model import NodeReport, PassReport

NAMES = ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu07")


def _report() -> PassReport:
    nodes = tuple(NodeReport(n, "refused" if n != "gpu05" else "ok", "down") for n in NAMES)
    up = NodeReport("gpu05", "ok", "ok")
    return PassReport(0.0, 0.1, False, True, (*nodes[:4], up, nodes[5]), (), {"running": 2})


def test_a_reconcile_pass_folds_its_down_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    _print(_report(), Output.TABLE)
    out = capsys.readouterr().out
    assert out == (
        "0 action(s) done; jobs: 2 running; down: gpu[01-04,07]; suspecting gpuctl's own network\n"
    )
    _print(_report(), Output.JSON)
    doc = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in doc["nodes"] if n["liveness"] == "down"] == [
        "gpu01", "gpu02", "gpu03", "gpu04", "gpu07"
    ]  # fmt: skip
