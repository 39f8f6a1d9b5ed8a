"""Two operators on two machines plan the same change, then both apply it: the first wins, the
second is refused, told what changed since its plan, and changes nothing. Cordon, uncordon and
drain through `FleetActions` (what `gpuctl cordon|uncordon|drain` and the dashboard's keys call),
on every backend."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.ops.actions import ActionRefused, FleetActions
from gpuctl.testing.drainkit import Kit
from tests.pg import STORES, open_test_store

OFF = AutoDrainPolicy(enabled=False)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


def operator(kit: Kit, name: str) -> FleetActions:
    @contextlib.contextmanager
    def opener(write: bool) -> Iterator[Store]:
        yield kit.store

    return FleetActions(
        open_store=opener,
        clock=kit.clock,
        operator=name,
        inventory=kit.cluster.inventory(),
        fleet=kit.fleet,
        runner=kit.runner,
    )


def test_two_operators_cordoning_one_node_one_wins_the_other_is_told_who(store: Store) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    alice, bob = operator(kit, "alice"), operator(kit, "bob")
    alices = alice.plan("cordon", "n1", reason="fan noise")
    bobs = bob.plan("cordon", "n1", reason="kernel update")
    assert alice.carry_out(alices).message == "n1 cordoned by alice: fan noise"
    with pytest.raises(ActionRefused) as refused:  # the dashboard's key: an error
        bob.apply(bobs)
    assert refused.value.message.startswith("n1 was cordoned by alice at ")
    assert refused.value.message.endswith("(reason: fan noise) since your plan; nothing changed")
    done = bob.carry_out(bobs)  # what `gpuctl cordon` reports: n1 failed (exit 3)
    assert not done.complete and [o.outcome for o in done.value] == ["failed"]
    assert done.message == refused.value.message
    assert [(c.operator, c.reason) for c in store.cordons()] == [("alice", "fan noise")]
    assert [e.actor for e in store.events(kinds=["cordon"])] == ["alice"]


def test_an_uncordon_planned_before_another_operator_s_cordon_lifts_nothing(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    alice, bob = operator(kit, "alice"), operator(kit, "bob")
    alice.carry_out(alice.plan("cordon", "n1", reason="fan noise"))
    lift = bob.plan("uncordon", "n1")  # bob plans to lift alice's cordon ...
    kit.clock.advance(30)
    alice.carry_out(alice.plan("cordon", "n1", reason="ECC errors"))  # ... she makes it worse
    with pytest.raises(ActionRefused, match=r"n1 was cordoned by alice .*\(reason: ECC errors\)"):
        bob.apply(lift)
    assert [c.reason for c in store.cordons()] == ["ECC errors"]


def test_two_operators_draining_one_node_one_moves_its_jobs_the_other_moves_nothing(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2", "n3"), gpus=2, health=OFF)
    jobs = [kit.submit(f"j{i}") for i in range(2)]
    kit.step()
    node = kit.inc(jobs[0].id).node
    alice, bob = operator(kit, "alice"), operator(kit, "bob")
    alices = alice.plan_nodes("drain", [node], "kernel update", grace_s=5.0)
    bobs = bob.plan("drain", node, reason="bad fan")  # the dashboard's key
    done = alice.carry_out(alices)
    assert done.complete
    (outcome,) = done.value
    assert outcome.drain is not None
    moved = {r.job_id: r.incarnation for r in outcome.drain.results}
    with pytest.raises(ActionRefused, match=rf"{node} was cordoned by alice .*kernel update"):
        bob.apply(bobs)
    assert [(c.operator, c.reason) for c in store.cordons()] == [("alice", "kernel update")]
    assert {j: kit.job(j).incarnation for j in moved} == moved  # bob moved none of them again
    assert {e.actor for e in store.events(kinds=["reserve", "drain"])} == {"alice"}


def test_a_move_planned_before_the_job_changed_is_refused_saying_who_changed_it(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2", "n3"), gpus=2, health=OFF)
    job = kit.submit("j0")
    kit.step()
    node = kit.inc(job.id).node
    alice = operator(kit, "alice")
    plan = alice.plan_nodes("drain", [node], "kernel update", grace_s=5.0)
    kit.store.update_job(job.id, priority=5)  # another operator's change to the job meanwhile
    done = alice.carry_out(plan)
    (outcome,) = done.value
    assert outcome.drain is not None and outcome.outcome == "left_jobs"
    (result,) = outcome.drain.results
    assert result.outcome == "not_started" and not done.complete
    assert result.message.startswith(f"job {job.id} was changed")
    assert result.message.endswith("since your plan; nothing changed")
    assert kit.inc(job.id).n == 1 and store.reservations() == []
