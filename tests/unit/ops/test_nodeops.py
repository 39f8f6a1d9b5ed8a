"""Cordon, uncordon, the drain plan and the drain, over a scripted fleet and both stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.errors import StoreConflict, UsageError
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.moves import nodeops
from gpuctl.testing.drainkit import Kit
from tests.pg import STORES, open_test_store

OFF = AutoDrainPolicy(enabled=False)
WHOLE = {"gpus": 1, "mem_per_gpu": "whole"}


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


def test_a_cordon_records_reason_operator_time_and_source_and_is_lifted(store: Store) -> None:
    kit = Kit.make(store, health=OFF)
    done = nodeops.cordon(store, "n1", reason=" fan noise ", operator="alice", clock=kit.clock)
    assert (done.reason, done.operator, done.source, done.at) == (
        "fan noise",
        "alice",
        "operator",
        kit.clock.now(),
    )
    assert store.cordons() == [done]
    event = store.events(kinds=["cordon"])[-1]
    assert (event.actor, event.node, event.data) == (
        "alice",
        "n1",
        {"source": "operator", "reason": "fan noise"},
    )
    job = kit.submit("train", resources=WHOLE)
    for _ in range(3):
        kit.submit("more", resources=WHOLE)
    kit.step()
    assert all(i.node != "n1" for i in store.incarnations(holding=True))
    assert kit.job(job.id).state is JobState.RUNNING
    lifted = nodeops.uncordon(store, "n1", operator="bob", clock=kit.clock)
    assert lifted == done and store.cordons() == []
    assert "by alice" in store.events(kinds=["uncordon"])[-1].message


def test_gpuctl_lifting_its_health_cordon_never_lifts_a_person_s(store: Store) -> None:
    kit = Kit.make(store, health=OFF)
    nodeops.cordon(store, "n2", reason="maintenance", operator="alice", clock=kit.clock)
    with pytest.raises(StoreConflict):
        nodeops.uncordon(store, "n2", operator="gpuctl", clock=kit.clock, source="health")
    assert [c.operator for c in store.cordons()] == ["alice"]


def test_bad_input_is_refused(store: Store) -> None:
    kit = Kit.make(store, health=OFF)
    with pytest.raises(UsageError, match="--reason"):
        nodeops.cordon(store, "n1", reason="  ", operator="a", clock=kit.clock)
    with pytest.raises(UsageError, match="not a node name"):
        nodeops.cordon(store, "-rf", reason="x", operator="a", clock=kit.clock)
    with pytest.raises(UsageError, match="unknown node"):
        nodeops.plan_drain(nodeops.tick(kit.loop), "n9", reason="x")


def test_the_drain_plan_gives_each_job_a_target_or_a_reason_and_changes_nothing(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2"), gpus=2, health=OFF)
    jobs = [kit.submit(f"w{i}", resources=WHOLE) for i in range(3)]
    kit.step()
    busy = max(("n1", "n2"), key=lambda n: len(store.incarnations(node=n, holding=True)))
    kit.runner.checkpoint(kit.inc(jobs[0].id).job_id, 1)
    kit.step()
    before = len(store.events())
    plan = nodeops.plan_drain(nodeops.tick(kit.loop), busy, reason="bad fan")
    assert len(store.events()) == before and store.cordons() == []
    assert len(plan.moves) == 2
    assert len(plan.movable) == 1  # one free card elsewhere, for two jobs
    (stuck,) = [m for m in plan.moves if m.to_node is None]
    assert stuck.why_not
    (going,) = plan.movable
    assert going.to_node != busy and len(going.to_cards) == 1
    doc = json.loads(json.dumps(plan.to_dict()))
    assert (doc["node"], doc["movable"], doc["stuck"]) == (busy, 1, 1)
    with_ckpt = [m for m in plan.moves if m.checkpoint_step is not None]
    assert all(m.checkpoint_age_s is not None for m in with_ckpt)


def test_a_drain_cordons_first_then_moves_every_job_it_can(store: Store) -> None:
    kit = Kit.make(store, ("n1", "n2", "n3"), gpus=2, health=OFF)
    jobs = [kit.submit(f"j{i}") for i in range(3)]
    kit.step()
    node = kit.inc(jobs[0].id).node
    here = [i.job_id for i in store.incarnations(node=node, holding=True)]
    plan = nodeops.plan_drain(nodeops.tick(kit.loop), node, reason="kernel update")
    finished: list[str] = []
    result = nodeops.drain(
        kit.loop,
        plan,
        operator="alice",
        grace_s=5.0,
        parallel=2,
        sleep=kit.clock.advance,
        on_result=lambda r: finished.append(r.job_id),
    )
    assert result.complete and sorted(finished) == sorted(here)
    assert [(c.node, c.operator, c.source) for c in store.cordons()] == [
        (node, "alice", "operator")
    ]
    assert store.incarnations(node=node, holding=True) == []
    for job_id in here:
        assert kit.job(job_id).state is JobState.RUNNING and kit.inc(job_id).n == 2
    drain_event = store.events(kinds=["drain"])[-1]
    assert (drain_event.actor, drain_event.node) == ("alice", node)
    first_cordon = store.events(kinds=["cordon"])[-1].id or 0
    first_reserve = min(e.id or 0 for e in store.events(kinds=["reserve"]))
    assert first_cordon < first_reserve
    doc = result.to_dict()
    assert (doc["moved"], doc["jobs"], doc["complete"]) == (len(here), len(here), True)
    assert check_invariants(store) == []


def test_jobs_without_room_stay_on_the_cordoned_node_with_the_reason(store: Store) -> None:
    kit = Kit.make(store, ("n1", "n2"), gpus=1, health=OFF)
    a, b = kit.submit("a", resources=WHOLE), kit.submit("b", resources=WHOLE)
    kit.step()
    node = kit.inc(a.id).node
    plan = nodeops.plan_drain(nodeops.tick(kit.loop), node, reason="r")
    result = nodeops.drain(kit.loop, plan, operator="alice", sleep=kit.clock.advance)
    assert not result.complete
    (only,) = result.results
    assert only.outcome == "not_started" and "not moved" in only.message
    assert kit.inc(a.id).state is IncarnationState.RUNNING and kit.signals(a.id) == []
    assert kit.job(b.id).state is JobState.RUNNING
    assert [c.node for c in store.cordons()] == [node]


def test_a_drain_past_its_timeout_starts_nothing_more(store: Store) -> None:
    kit = Kit.make(store, ("n1", "n2", "n3"), gpus=2, health=OFF)
    kit.runner.ignore_signals = True
    jobs = [kit.submit(f"j{i}") for i in range(2)]
    kit.step()
    node = kit.inc(jobs[0].id).node
    plan = nodeops.plan_drain(nodeops.tick(kit.loop), node, reason="r")
    count = len(plan.movable)
    result = nodeops.drain(
        kit.loop,
        plan,
        operator="alice",
        grace_s=10.0,
        checkpoint_wait_s=10.0,
        timeout_s=3.0,
        parallel=1,
        sleep=kit.clock.advance,
    )
    outcomes = sorted(r.outcome for r in result.results)
    assert outcomes == sorted(["rolled_back"] + ["not_started"] * (count - 1))
    assert store.reservations() == [] and not result.complete
    assert all(kit.inc(j.id).n == 1 for j in jobs)


def test_jobs_of_a_node_that_does_not_answer_are_left_to_failover(store: Store) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    job = kit.submit("train")
    kit.step()
    node = kit.inc(job.id).node
    kit.cluster.partition(node)
    plan = nodeops.plan_drain(nodeops.tick(kit.loop), node, reason="r")
    (move,) = plan.moves
    assert move.to_node is None and "did not answer" in (move.why_not or "")
    assert "failover restarts them once the node is down" in (move.why_not or "")
