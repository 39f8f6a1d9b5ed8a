"""The pure playbook core: conditions (parsing, checking, evaluating with unknown values),
target selection, batches, the run's journal and failure accounting, cancelling to a target."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuctl.core import playbook as core
from gpuctl.core.playbook import (
    CancelCandidate,
    Selector,
    Settings,
    TargetFacts,
    TimeWindow,
)
from gpuctl.core.playbook.expr import FLEET_NAMES, ExprError, parse
from gpuctl.core.playbook.run import (
    Journal,
    NodeResult,
    StepResult,
    aggregate,
    in_play,
    stop_reason,
)


def fleet(text: str, **env: object) -> bool:
    return parse(text, node_facts=False).evaluate(env)


def test_conditions_compare_numbers_texts_and_lists() -> None:
    assert fleet("fragmentation_pct > 20", fragmentation_pct=20.5)
    assert not fleet("fragmentation_pct > 20", fragmentation_pct=20)
    assert fleet("utilization_pct < 80 and band != 'over'", utilization_pct=70, band="target")
    assert fleet("band in ['idle', 'low'] or queue_waiting >= 3", band="target", queue_waiting=3)
    assert fleet('not (band == "over")', band="idle")
    assert fleet("queue_oldest_job == null", queue_oldest_job=None)
    assert fleet("utilization_pct >= 60 and utilization_pct <= 80", utilization_pct=60)


def test_an_unknown_number_never_satisfies_an_ordering() -> None:
    assert not fleet("fragmentation_pct > 20", fragmentation_pct=None)
    assert not fleet("fragmentation_pct <= 20", fragmentation_pct=None)
    assert fleet("not fragmentation_pct > 20")  # a missing name is null
    assert fleet("fragmentation_pct == null", fragmentation_pct=None)


def test_node_facts_read_state_health_labels_and_groups() -> None:
    node = TargetFacts(
        "gpu01", "cordoned", groups=("a100",), labels={"zone": "eu-1"}, health="unhealthy"
    )
    env = node.env()
    cases = {
        'node.health == "unhealthy" and node.cordoned': True,
        '"a100" in node.groups and node.labels.zone == "eu-1"': True,
        'node.labels.rack == "r1"': False,
        "node.state not in ['ready', 'draining']": True,
        "node.gpus > 0": False,  # unknown
    }
    for text, expected in cases.items():
        expr = parse(text, node_facts=True)
        assert expr.uses_node and expr.evaluate(env) is expected, text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fragmentation > 20", "unknown name 'fragmentation'; did you mean 'fragmentation_pct'?"),
        ("band > 2", "> compares numbers; band is a text"),
        ("band == 3", "band is a text but 3 is a number"),
        ("utilization_pct", "utilization_pct is a number, not a condition"),
        ("utilization_pct > 1 > 0", "chained comparisons are not supported"),
        ("band in 'over'", "in needs a list on its right"),
        ("band == 'hot'", "band is never 'hot': it is one of idle, low, target, over"),
        ("__import__('os')", "unexpected '('"),
        ("node.name.__class__ == 'x'", "unknown name 'node.name.__class__'"),
        ("utilization_pct > 2 ; x", "unexpected character ';'"),
        ("", "a condition must not be empty"),
        ("node.state == 'ready'", "node.state: node facts are only known in steps that act on"),
    ],
)
def test_bad_conditions_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ExprError, match="^" + message.replace("(", r"\(").replace("?", r"\?")):
        parse(text, node_facts=not text.startswith("node.state"))


def test_the_explanation_shows_each_value_read() -> None:
    expr = parse("fragmentation_pct > 20 and band != 'over'", node_facts=False)
    text = core.explain_condition(expr, {"fragmentation_pct": 31.5, "band": "target"})
    assert text == (
        "fragmentation_pct > 20 and band != 'over' (fragmentation_pct = 31.5, band = \"target\")"
        ": true"
    )


def test_every_number_of_fleetstatus_is_a_condition_name() -> None:
    from gpuctl.ops.fleetstatus import numbers
    from gpuctl.testing.fakerunner import FakeCluster, FakeFleet
    from gpuctl.testing.memstore import MemoryStore

    cluster = FakeCluster.of("n1", gpus=1)
    snapshot = FakeFleet(cluster).gather(cluster.inventory())
    assert set(numbers(snapshot, MemoryStore(), 0.0).to_dict()) <= set(FLEET_NAMES)


NODES = (
    TargetFacts("gpu01", "ready", groups=("a100",), labels={"zone": "eu-1"}),
    TargetFacts("gpu02", "cordoned", groups=("a100",)),
    TargetFacts("big1", "ready", groups=("h100",), labels={"zone": "eu-2"}),
    TargetFacts("big2", "down", groups=("h100",)),
)


def test_selectors_match_names_globs_groups_labels_and_states_in_inventory_order() -> None:
    def pick(*selectors: Selector) -> tuple[str, ...]:
        return core.resolve_targets(selectors, NODES)

    assert pick(Selector()) == ("gpu01", "gpu02", "big1", "big2")
    assert pick(Selector(names=("big*",), states=("ready",))) == ("big1",)
    assert pick(Selector(groups=("a100",), labels={"zone": "eu-1"})) == ("gpu01",)
    assert pick(Selector(names=("big2",)), Selector(names=("gpu0[2]",))) == ("gpu02", "big2")
    assert pick(Selector(states=("draining",))) == ()


def test_serial_splits_the_targets_into_batches_in_order() -> None:
    targets = ("a", "b", "c", "d", "e")
    assert core.batches(targets, Settings()) == (targets,)
    assert core.batches(targets, Settings(serial=2)) == (("a", "b"), ("c", "d"), ("e",))
    assert core.batches(targets, Settings(serial_pct=40)) == (("a", "b"), ("c", "d"), ("e",))
    assert core.batches(targets, Settings(serial_pct=10)) == tuple((t,) for t in targets)
    assert core.batches((), Settings(serial=2)) == ((),)  # fleet steps still run


@given(st.lists(st.text("abc", min_size=1, max_size=3), unique=True), st.integers(1, 7))
def test_batches_partition_the_targets_and_respect_serial(targets: list[str], serial: int) -> None:
    got = core.batches(targets, Settings(serial=serial))
    assert [n for b in got for n in b] == targets
    assert all(1 <= len(b) <= serial for b in got if targets)


def test_units_run_every_step_for_each_batch_in_turn() -> None:
    step_a = core.Step(0, "cordon", {"reason": "x"})
    step_b = core.Step(1, "status", {})
    pb = core.Playbook("p", (Selector(),), (step_a, step_b))
    keys = [(u.key, u.nodes) for u in core.units(pb, (("a", "b"), ("c",)))]
    assert keys == [
        ("b1.s1", ("a", "b")),
        ("b1.s2", ("a", "b")),
        ("b2.s1", ("c",)),
        ("b2.s2", ("c",)),
    ]


def test_a_window_may_wrap_past_midnight() -> None:
    night = TimeWindow(22 * 60, 4 * 60)
    assert night.contains(23 * 60) and night.contains(0) and night.contains(3 * 60 + 59)
    assert not night.contains(4 * 60) and not night.contains(12 * 60)
    day = TimeWindow(9 * 60, 17 * 60)
    assert day.contains(9 * 60) and not day.contains(17 * 60)
    assert night.text == "22:00-04:00"


def result(key: str, outcome: str, nodes: tuple[NodeResult, ...] = ()) -> StepResult:
    return StepResult(key, 0, 0, "run", "run", outcome, "msg", nodes)


def journal(targets: int = 4) -> Journal:
    return Journal("r1", "p", "d" * 64, 1.0, "alice", (("a", "b"), ("c", "d")), targets)


def test_failed_nodes_stop_the_run_only_beyond_max_fail_percentage() -> None:
    j = journal().finish(result("b1.s1", "failed", (NodeResult("a", "failed", "exit 1"),)), 2.0)
    assert j.failed_nodes == ("a",) and j.failed_pct() == 25.0
    last = result("b1.s1", "failed", (NodeResult("a", "failed", "x"),))
    assert stop_reason(j, last, Settings(max_fail_percentage=25)) is None
    assert stop_reason(j, last, Settings(max_fail_percentage=0)) == (
        "1 of 4 target(s) failed (25% > max_fail_percentage 0%)"
    )
    assert in_play(("a", "b"), j) == ("b",)  # a failed node takes no part in later steps


def test_a_failed_fleet_step_always_stops_the_run() -> None:
    failed = StepResult("b1.s3", 0, 2, "assert", "band ok", "failed", "band == 'over'")
    reason = stop_reason(journal(), failed, Settings(max_fail_percentage=100))
    assert reason == "step 3 (band ok) failed: band == 'over'"
    assert stop_reason(journal(), result("b1.s1", "changed"), Settings()) is None


def test_the_journal_records_units_and_round_trips_through_json() -> None:
    import json

    j = journal().start("b1.s1", 2.0)
    assert j.current == "b1.s1" and j.status == "running"
    j = j.finish(result("b1.s1", "changed"), 3.0, health={"a": "healthy"})
    assert (j.current, dict(j.done), dict(j.health)) == (
        None,
        {"b1.s1": "changed"},
        {"a": "healthy"},
    )
    back = Journal.from_dict(json.loads(json.dumps(j.to_dict())))
    assert back == j
    assert (
        Journal.from_dict(json.loads(json.dumps(j.close("done", 4.0).to_dict()))).status == "done"
    )
    with pytest.raises(ValueError, match="journal"):
        Journal.from_dict({**j.to_dict(), "schema": 99})
    with pytest.raises(ValueError, match="outcome"):
        Journal.from_dict({**j.to_dict(), "done": {"b1.s1": "maybe"}})


def test_a_node_step_outcome_is_the_worst_of_its_nodes() -> None:
    ok, changed = NodeResult("a", "ok", ""), NodeResult("b", "changed", "")
    skipped, failed = NodeResult("c", "skipped", ""), NodeResult("d", "failed", "")
    assert aggregate([ok, changed, skipped]) == "changed"
    assert aggregate([ok, skipped]) == "ok"
    assert aggregate([skipped]) == aggregate([]) == "skipped"
    assert aggregate([changed, failed]) == "failed"


GIB = 1024


def test_cancelling_to_a_target_takes_the_lowest_priority_and_newest_first_and_stops_there() -> (
    None
):
    cands = [
        CancelCandidate("old-low", -5, 100.0, 40 * GIB),
        CancelCandidate("new-low", -5, 200.0, 40 * GIB),
        CancelCandidate("high", 10, 300.0, 80 * GIB),
        CancelCandidate("waiting", -10, 400.0, 0),
    ]
    pick = core.choose_cancellations
    # 300 of 320 GiB (93.75 %): one 40 GiB job brings it to 81 %, two to 68.75 %
    chosen = pick(
        cands,
        allocated_mib=300 * GIB,
        capacity_mib=320 * GIB,
        target_utilization_pct=80,
        limit=None,
    )
    assert chosen == ("new-low", "old-low")  # a waiting job holds nothing: not worth cancelling
    assert pick(
        cands, allocated_mib=300 * GIB, capacity_mib=320 * GIB, target_utilization_pct=80, limit=1
    ) == ("new-low",)
    assert (
        pick(
            cands,
            allocated_mib=200 * GIB,
            capacity_mib=320 * GIB,
            target_utilization_pct=80,
            limit=None,
        )
        == ()
    )
    every = pick(cands, allocated_mib=0, capacity_mib=0, target_utilization_pct=None, limit=None)
    assert every == ("waiting", "new-low", "old-low", "high")


@given(
    st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 80)), max_size=8),
    st.integers(0, 400),
    st.floats(0, 100),
)
def test_cancelling_to_a_target_reaches_it_when_it_can_and_never_cancels_more_than_needed(
    jobs: list[tuple[int, int]], free_gib: int, target: float
) -> None:
    cands = [CancelCandidate(f"j{i}", p, float(i), g * GIB) for i, (p, g) in enumerate(jobs)]
    held = sum(c.held_mib for c in cands)
    capacity = held + free_gib * GIB
    chosen = core.choose_cancellations(
        cands, allocated_mib=held, capacity_mib=capacity, target_utilization_pct=target, limit=None
    )
    freed = sum(c.held_mib for c in cands if c.job_id in chosen)
    if capacity:
        after = 100.0 * (held - freed) / capacity
        holding = [c for c in cands if c.held_mib > 0]
        assert after <= target or len(chosen) == len(holding)
        if chosen:  # without the last one chosen, the target was not reached yet
            last = next(c for c in cands if c.job_id == chosen[-1])
            assert 100.0 * (held - freed + last.held_mib) / capacity > target


def test_a_step_describes_what_it_does() -> None:
    run = core.Step(
        0, "run", {"argv": ["systemctl", "restart", "x y"], "sudo": True, "timeout_s": 5.0}
    )
    assert core.describe(run) == "run sudo -n systemctl restart 'x y' (timeout 5s)"
    cancel = core.Step(
        1,
        "cancel",
        {"jobs": [], "tier": "spot", "max": 3, "target_utilization_pct": 80.0, "force": False},
    )
    assert core.describe(cancel) == (
        "cancel spot jobs (lowest priority, newest first) until utilization <= 80%, at most 3"
    )
    assert dataclasses.replace(run, name="restart").title == "restart"
