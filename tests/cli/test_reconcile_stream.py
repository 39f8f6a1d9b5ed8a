"""`gpuctl reconcile --watch` on stderr: a waiting line (a drain held by the rate limit, a job not
requeued) is printed when it is new or changed, not at every pass, and once when it clears; each
pass's JSON report still lists it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest
import typer

from gpuctl.cli.reconcile import _stream, _watch
from gpuctl.cli.reconcile_stream import Stream
from gpuctl.cli.render import Output
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.errors import StoreConflict
from gpuctl.ops.loop import Action, PassReport
from gpuctl.testing.drainkit import Kit
from gpuctl.testing.memstore import MemoryStore

WAIT = "n1 is down, but most nodes are: not requeued"


def test_a_waiting_line_is_printed_once_then_again_when_its_message_changes() -> None:
    out: list[str] = []
    stream = Stream(out.append)
    passes = [
        [Action("failover", WAIT, "a-1", "n1", None, "waiting")],
        [Action("failover", WAIT, "a-1", "n1", None, "waiting")],
        [Action("failover", WAIT + " (3 of 4)", "a-1", "n1", None, "waiting")],
        [Action("launched", "running again", "b-1", "n2", 2, "ok")],
        [Action("launched", "running again", "b-1", "n2", 2, "ok")],
    ]
    for actions in passes:
        for a in actions:
            stream(a)
        stream.end_pass()
    assert out == [
        f"failover: a-1 n1: {WAIT}",
        f"failover: a-1 n1: {WAIT} (3 of 4)",
        "launched: b-1 n2: running again",  # what the loop did is printed every time
        f"failover: a-1 n1: cleared (was: {WAIT} (3 of 4))",  # at the end of that pass
        "launched: b-1 n2: running again",
    ]


class Passes:
    """What `_watch` drives: `n` passes of a kit's loop, then it returns (as Ctrl-C would)."""

    def __init__(self, kit: Kit, n: int) -> None:
        self.kit, self.n = kit, n

    @property
    def on_action(self) -> Callable[[Action], None] | None:
        return self.kit.loop.on_action

    def watch(
        self,
        interval_s: float,
        stop: threading.Event,
        on_report: Callable[[PassReport], None],
        on_skip: Callable[[StoreConflict], None] | None = None,
    ) -> int:
        for _ in range(self.n):
            self.kit.clock.advance(5)
            on_report(self.kit.loop.run_once())
        return self.n


def test_watch_prints_the_rate_limit_line_once_while_each_report_lists_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    policy = AutoDrainPolicy(drain_after_passes=2, max_drains_per_hour=1)
    k = Kit.make(MemoryStore(), ("n1", "n2", "n3", "n4", "n5"), gpus=1, health=policy)
    whole = {"gpus": 1, "mem_per_gpu": "whole"}
    jobs = [k.submit(f"j{i}", resources=whole) for i in range(2)]
    k.step()
    sick = sorted(k.inc(j.id).node for j in jobs)
    for name in sick:
        k.fleet.faults[name] = {"ecc": 1}
    k.loop.on_action = _stream()
    with pytest.raises(typer.Exit):
        _watch(cast(Any, Passes(k, 4)), 5.0, Output.JSON)
    out, err = capsys.readouterr()
    held = [line for line in err.splitlines() if "not drained yet" in line]
    (waits,) = {line.split(": not drained yet: ")[0] for line in held if "rate limit" in line}
    node = waits.split()[-1]
    assert held == [  # the hysteresis line of each node, then the rate limit once (not 3 times)
        f"drain: {sick[0]}: {sick[0]}: not drained yet: drain asked at 1 of 2 consecutive passes "
        "(hysteresis)",
        f"drain: {sick[1]}: {sick[1]}: not drained yet: drain asked at 1 of 2 consecutive passes "
        "(hysteresis)",
        f"drain: {node}: {node}: not drained yet: rate limit: at most 1 node(s) drained per hour",
    ]
    reports = [json.loads(line) for line in out.splitlines()]
    limited = [
        [a for a in r["actions"] if "rate limit" in a["message"] and a["outcome"] == "waiting"]
        for r in reports
    ]
    assert [len(x) for x in limited] == [0, 1, 1, 1]  # the report of each pass still lists it


def test_watch_says_the_network_suspicion_once_and_that_it_cleared_only_when_nodes_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    k = Kit.make(MemoryStore(), ("n1", "n2", "n3"), gpus=1)
    k.loop.on_action = _stream()
    k.step()
    k.cluster.partition("n1")
    k.cluster.partition("n2")
    with pytest.raises(typer.Exit):
        _watch(cast(Any, Passes(k, 4)), 5.0, Output.TABLE)  # most nodes silent all along
    suspect = [line for line in capsys.readouterr().err.splitlines() if "suspect" in line]
    assert suspect == [
        "suspect_network: 2 of 3 nodes do not answer at once: suspecting gpuctl's own network; "
        "no job is requeued until most nodes answer again"
    ]
    assert [e.kind for e in k.store.events(kinds=["suspect_network"])] == ["suspect_network"]
    k.cluster.heal("n1")
    k.cluster.heal("n2")
    with pytest.raises(typer.Exit):
        _watch(cast(Any, Passes(k, 1)), 5.0, Output.TABLE)
    assert "suspect_network: cleared (was: 2 of 3 nodes" in capsys.readouterr().err
