"""Fencing closes the loop: whenever an incarnation ends while it may still live (its node came
back after a failover, its run dir is gone, a drain, a preemption, a consolidation move, a launch
that never showed up), gpuctl kills whatever is left of it and records it ended only once the node
says nothing of it is alive. Until then it keeps its cards and nothing takes its place on them.

Each test has a way in and a process that outlives SIGKILL (`FakeRunner.unkillable`: stuck in
the kernel) or a node whose answer does not arrive: the incarnation must stay where it is, then
end cleanly once the fence succeeds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.errors import TransportError
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.moves import nodeops
from gpuctl.ops.moves.migrate import migrate
from gpuctl.testing.drainkit import Kit
from tests.pg import STORES, open_test_store
from tests.unit.ops.test_reconcile import make

WHOLE = {"gpus": 1, "mem_per_gpu": "whole"}
OFF = AutoDrainPolicy(enabled=False)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path / "s")
    yield s
    s.close()


def live_copies(t: object, job_id: str) -> list[int]:
    cluster = t.cluster  # type: ignore[attr-defined]
    return [r.request.incarnation for r in cluster.runs(job_id, alive=True)]


def test_failover_the_lost_copy_keeps_its_cards_until_its_node_confirms_it_is_gone(
    store: Store,
) -> None:
    t = make(store, ("n1", "n2"), gpus=1, grace_s=30)
    job = t.submit("train", resources=WHOLE)
    t.step()
    old = t.inc(job.id).node
    t.cluster.partition(old)  # it runs on behind the partition
    t.step(5)
    t.step(31)  # lost, restarted elsewhere
    assert t.inc(job.id).n == 2 and live_copies(t, job.id) == [1, 2]
    t.runner.unkillable.add((job.id, 1))
    t.cluster.heal(old)
    report = t.step(1)
    assert t.inc(job.id, 1).state is IncarnationState.LOST  # not recorded as killed
    assert [a.outcome for a in report.of("fence")] == ["failed"]
    assert [i.n for i in t.store.incarnations(job.id) if i.state.holds_cards] == [1, 2]
    t.runner.unkillable.clear()
    t.step(1)
    assert t.inc(job.id, 1).state is IncarnationState.KILLED
    assert live_copies(t, job.id) == [2]
    assert check_invariants(store) == []


def test_a_run_dir_gone_from_an_answering_node_is_fenced_before_the_job_restarts(
    store: Store,
) -> None:
    t = make(store, ("n1", "n2"), gpus=1)
    job = t.submit("train", resources=WHOLE)
    t.step()
    t.cluster.lose_run_dir(job.id, 1)  # the observe no longer lists it; it still runs
    t.runner.unkillable.add((job.id, 1))
    t.step()
    assert t.inc(job.id).n == 1 and t.inc(job.id).state is IncarnationState.RUNNING
    assert t.job(job.id).state is JobState.RUNNING and len(t.runner.launches) == 1
    t.runner.unkillable.clear()
    t.step()
    ended = t.inc(job.id, 1)
    assert ended.state is IncarnationState.EXITED
    exits = [e.message for e in store.events(job_id=job.id, kinds=["exit"])]
    assert exits and "run dir is gone" in exits[0] and "still ran: killed" in exits[0]
    assert live_copies(t, job.id) == [2]  # restarted, and only then
    assert check_invariants(store) == []


def test_an_end_is_not_recorded_when_the_fence_gets_no_whole_answer(store: Store) -> None:
    t = make(store, ("n1", "n2"), gpus=1)
    job = t.submit("train", resources=WHOLE)
    t.step()
    t.cluster.finish(job.id, 1, 3)
    fence = t.runner.fence

    def cut(*args: object) -> object:
        raise TransportError("n1: fence incomplete: the session was cut")

    t.runner.fence = cut  # type: ignore[assignment,method-assign]
    t.step()
    assert t.inc(job.id, 1).state is IncarnationState.RUNNING and len(t.runner.launches) == 1
    t.runner.fence = fence  # type: ignore[method-assign]
    t.step()
    assert t.inc(job.id, 1).state is IncarnationState.EXITED and t.inc(job.id).n == 2


def test_preemption_waits_for_the_stopped_spot_copy_to_be_gone_before_its_card_is_reused(
    store: Store,
) -> None:
    t = make(store, ("n1",), gpus=1)
    t.runner.on_term = "ignore"
    spot = t.submit("spot", tier="spot", resources=WHOLE, grace_s=20)
    t.step()
    std = t.submit("std", resources=WHOLE)
    t.step(1)  # preempted: SIGTERM, ignored
    t.runner.unkillable.add((spot.id, 1))
    t.step(25)  # past the grace: SIGKILL, and it lives on
    assert t.inc(spot.id).state is IncarnationState.STOPPING
    assert t.job(std.id).state is JobState.QUEUED and len(t.runner.launches) == 1
    t.runner.unkillable.clear()
    t.step(1)
    assert t.inc(spot.id).state is IncarnationState.KILLED
    t.step(1)
    assert t.job(std.id).state is JobState.RUNNING
    assert live_copies(t, spot.id) == []
    assert check_invariants(store) == []


def stubborn_kit(store: Store) -> tuple[Kit, str]:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    kit.runner.ignore_signals = True
    job = kit.submit("stubborn")
    kit.step()
    kit.runner.checkpoint(job.id, 1)
    kit.step()
    kit.runner.unkillable.add((job.id, 1))
    return kit, job.id


def test_a_consolidation_move_starts_no_target_while_its_source_outlives_sigkill(
    store: Store,
) -> None:
    kit, job_id = stubborn_kit(store)
    result = migrate(
        kit.loop,
        job_id,
        None,
        reason="consolidate",
        actor="gpuctl",
        grace_s=6.0,
        checkpoint_wait_s=3.0,
        poll_s=1.0,
        timeout_s=30.0,
        sleep=kit.clock.advance,
    )
    assert not result.moved
    assert [r.request.incarnation for r in kit.cluster.runs(job_id, alive=True)] == [1]
    assert len(kit.runner.launches) == 1  # no second copy was started
    assert kit.inc(job_id, 1).state is IncarnationState.STOPPING
    kit.runner.unkillable.clear()
    for _ in range(6):
        kit.step()
    assert [r.request.incarnation for r in kit.cluster.runs(job_id, alive=True)] == [2]
    assert kit.inc(job_id, 1).state is IncarnationState.KILLED
    assert check_invariants(store) == []


def test_a_drain_moves_a_job_only_once_its_old_copy_is_gone(store: Store) -> None:
    kit, job_id = stubborn_kit(store)
    node = kit.inc(job_id).node
    plan = nodeops.plan_drain(nodeops.tick(kit.loop), node, reason="kernel update")
    result = nodeops.drain(
        kit.loop, plan, operator="alice", grace_s=5.0, timeout_s=30.0, sleep=kit.clock.advance
    )
    assert not result.complete
    assert [r.request.incarnation for r in kit.cluster.runs(job_id, alive=True)] == [1]
    assert len(kit.runner.launches) == 1
    kit.runner.unkillable.clear()
    for _ in range(6):
        kit.step()
    assert [r.request.incarnation for r in kit.cluster.runs(job_id, alive=True)] == [2]
    assert kit.inc(job_id, 2).node != node
    assert check_invariants(store) == []


def test_a_launch_that_never_showed_up_is_claimed_so_it_can_never_start_later(
    store: Store,
) -> None:
    t = make(store, ("n1", "n2"), gpus=1)
    job = t.submit("train", resources=WHOLE)
    t.runner.launch_error = TransportError("n1: timeout (read): the node hangs")
    t.step()
    assert t.inc(job.id).state is IncarnationState.LAUNCHING
    t.step(60)  # past the settle time: given up on, fenced, restarted as incarnation 2
    assert t.inc(job.id, 1).state is IncarnationState.EXITED
    first = t.inc(job.id, 1).node
    assert (first, job.id, 1) in t.runner.fences
    assert (job.id, 1) in t.cluster.node(first).claimed  # a late launch of it is refused there
