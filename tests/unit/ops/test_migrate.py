"""The migration primitive over a scripted fleet (fake runner whose jobs keep the checkpoint
contract, a clock the test advances), on the in-memory and the SQLite store alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.migration import Phase
from gpuctl.core.jobs.model import EndReason, IncarnationState, JobState
from gpuctl.core.placement.model import Allocation
from gpuctl.errors import StoreUnavailable
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.moves import nodeops
from gpuctl.ops.moves.migrate import MigrationResult, Target, migrate, reserve
from gpuctl.ops.moves.nodeops import tick
from gpuctl.testing.drainkit import CKPT, Kit
from tests.pg import STORES, open_test_store

OFF = AutoDrainPolicy(enabled=False)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path / "state")
    yield s
    s.close()


def running(store: Store, *names: str, nodes: tuple[str, ...] = ("n1", "n2", "n3")) -> Kit:
    kit = Kit.make(store, nodes, health=OFF)
    for name in names:
        kit.submit(name)
    kit.step()
    return kit


def move(kit: Kit, job_id: str, target: Target | None = None, **kw: object) -> MigrationResult:
    params: dict[str, object] = {"reason": "test", "actor": "alice", "poll_s": 1.0}
    params.update(kw)
    return migrate(kit.loop, job_id, target, sleep=kit.clock.advance, **params)  # type: ignore[arg-type]


def test_a_job_moves_from_a_fresh_checkpoint_to_a_target_reserved_first(store: Store) -> None:
    kit = running(store, "train")
    (job,) = store.jobs()
    source = kit.inc(job.id)
    seen: list[tuple[str, list[str]]] = []
    signal = kit.runner.signal

    def watching(node, job_id, n, sig):  # type: ignore[no-untyped-def]
        seen.append((sig, [r.node for r in store.reservations()]))
        return signal(node, job_id, n, sig)

    kit.runner.signal = watching  # type: ignore[method-assign]
    result = move(kit, job.id, grace_s=10.0)
    assert result.moved and result.from_node == source.node, result
    new = kit.inc(job.id)
    assert (new.n, new.node, new.state) == (2, result.to_node, IncarnationState.RUNNING)
    assert new.node != source.node
    # the target was held before the source heard anything, and until it started there
    assert [s for s, _ in seen] == ["USR1", "TERM"]
    assert all(held == [new.node] for _, held in seen)
    # from the checkpoint written on SIGTERM, newer than the one SIGUSR1 asked for
    assert new.resume_step == 20 and result.resume_step == 20
    assert kit.runner.launches[-1][1].resume_from == f"{CKPT}/{job.id}/step-00000020"
    old = kit.inc(job.id, 1)
    assert (old.state, old.end_reason) == (IncarnationState.EXITED, EndReason.DRAINED)
    kinds = [k for k in kit.kinds(job.id) if k != "checkpoint"]
    assert kinds[kinds.index("reserve") :] == [
        "reserve", "checkpoint_request", "stop", "exit", "requeue", "launch", "launched",
        "migrated",
    ]  # fmt: skip
    reserve = store.events(job_id=job.id, kinds=["reserve"])[0]
    assert reserve.actor == "alice" and reserve.data["reason"] == "test"
    assert store.reservations() == [] and check_invariants(store) == []


def held_for(kit: Kit, job_id: str, node: str, card: int, reason: str = "test") -> None:
    """Reserve (node, card) for the job's next incarnation, as a command would, then leave."""
    job, source = kit.job(job_id), kit.inc(job_id)
    reserve(
        tick(kit.loop),
        job,
        source,
        Target(Allocation(source.job_id, node, (card,), source.mib_per_card, source.whole)),
        {(node, card): 80 * 1024},
        reason=reason,
        source="operator",
        actor="alice",
    )


def test_reserved_cards_are_not_given_to_other_work_while_the_job_moves(store: Store) -> None:
    kit = Kit.make(store, ("n1", "n2"), gpus=1, health=OFF)
    a = kit.submit("a")
    kit.step()
    source = kit.inc(a.id).node
    other = "n2" if source == "n1" else "n1"
    held_for(kit, a.id, other, 0)
    whole = kit.submit("whole", resources={"gpus": 1, "mem_per_gpu": "whole"})
    kit.step()  # the migration asks for a checkpoint; the whole-card job finds no free card
    assert kit.job(whole.id).state is JobState.QUEUED
    kit.step()  # stopped; started on the reserved card; the source's card is free
    kit.step()
    assert (kit.inc(a.id).n, kit.inc(a.id).node) == (2, other)
    assert kit.inc(whole.id).node == source and kit.job(whole.id).state is JobState.RUNNING
    assert check_invariants(store) == []


def test_a_job_that_ignores_signals_is_killed_after_the_grace_and_resumes_from_its_last_periodic_checkpoint(  # noqa: E501
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    kit.runner.ignore_signals = True  # trap '' TERM USR1
    job = kit.submit("stubborn")
    kit.step()
    kit.runner.checkpoint(job.id, 1)  # its periodic checkpoint: step 10
    kit.step()
    result = move(kit, job.id, grace_s=6.0, checkpoint_wait_s=3.0)
    assert result.moved and result.resume_step == 10
    assert kit.signals(job.id) == ["USR1", "TERM", "KILL"]
    killed = kit.inc(job.id, 1)
    assert (killed.state, killed.end_reason) == (IncarnationState.KILLED, EndReason.DRAINED)
    times = {e.kind: e.at for e in store.events(job_id=job.id)}
    assert times["kill"] - times["checkpoint_request"] <= 3.0 + 6.0 + 1.0  # waits + one poll
    assert check_invariants(store) == []


def test_a_migration_that_cannot_stop_its_source_in_time_is_rolled_back(store: Store) -> None:
    kit = running(store, "train", nodes=("n1", "n2", "n3"))
    (job,) = store.jobs()
    source = kit.inc(job.id)
    kit.cluster.partition(source.node)  # it cannot be asked anything
    result = move(kit, job.id, timeout_s=20.0)
    assert result.outcome == "rolled_back" and "timed out" in result.message
    assert store.reservations() == []
    assert kit.job(job.id).state is JobState.RUNNING and kit.inc(job.id).n == 1
    assert kit.signals(job.id) == []
    assert "migrate_rollback" in kit.kinds(job.id)


def test_a_taken_target_is_refused_and_another_one_chosen(store: Store) -> None:
    kit = running(store, "a", "b", nodes=("n1", "n2"))
    a, b = store.jobs()
    taken = kit.inc(b.id)
    result = move(kit, a.id, Target(Allocation(a.id, taken.node, taken.cards, 80 * 1024, True)))
    assert result.moved and (result.to_node, result.cards) != (taken.node, taken.cards)


def test_no_room_anywhere_leaves_the_job_where_it_runs(store: Store) -> None:
    kit = Kit.make(store, ("n1", "n2"), gpus=1, health=OFF)
    whole = {"gpus": 1, "mem_per_gpu": "whole"}
    a, _ = kit.submit("a", resources=whole), kit.submit("b", resources=whole)
    kit.step()
    result = move(kit, a.id)
    assert result.outcome == "not_started" and "not moved" in result.message
    assert kit.inc(a.id).state is IncarnationState.RUNNING and kit.signals(a.id) == []


def test_a_job_cancelled_while_it_moves_is_cancelled_not_moved(store: Store) -> None:
    kit = running(store, "train")
    (job,) = store.jobs()
    held_for(kit, job.id, "n3" if kit.inc(job.id).node != "n3" else "n2", 0)
    kit.step()  # SIGUSR1
    store.update_job(job.id, cancel_requested=True)
    kit.step()
    kit.step()
    assert kit.job(job.id).state is JobState.CANCELLED
    assert [i.n for i in store.incarnations(job.id)] == [1] and store.reservations() == []
    assert "migrate_rollback" in kit.kinds(job.id)


def test_a_pass_of_the_loop_takes_a_migration_one_step_further(store: Store) -> None:
    """A migration a command started and left (it died): the loop finishes it."""
    kit = running(store, "train")
    (job,) = store.jobs()
    target = next(n for n in ("n1", "n2", "n3") if n != kit.inc(job.id).node)
    held_for(kit, job.id, target, 1, "left half-done")
    kit.step()
    assert store.reservations()[0].phase is Phase.CHECKPOINTING
    kit.step()
    kit.step()
    assert (kit.inc(job.id).n, kit.inc(job.id).node, kit.inc(job.id).cards) == (2, target, (1,))
    assert len(kit.runner.launches) == 2 and check_invariants(store) == []


def test_a_target_cordoned_after_the_source_stopped_sends_the_job_elsewhere(store: Store) -> None:
    kit = running(store, "train")
    (job,) = store.jobs()
    source = kit.inc(job.id).node
    target, third = (n for n in ("n1", "n2", "n3") if n != source)
    held_for(kit, job.id, target, 0)
    kit.step()  # SIGUSR1
    kit.step()  # the checkpoint is there: SIGTERM
    assert kit.inc(job.id, 1).state is IncarnationState.STOPPING
    nodeops.cordon(store, target, reason="it broke too", operator="bob", clock=kit.clock)
    report = kit.step()
    assert report.of("migrate_rollback") and report.of("migrated")
    new = kit.inc(job.id)
    assert (new.n, new.node, new.resume_step) == (2, third, 20)
    assert store.reservations() == [] and check_invariants(store) == []


def test_a_target_cordoned_before_the_source_stopped_leaves_the_job_running(store: Store) -> None:
    kit = running(store, "train")
    (job,) = store.jobs()
    target = next(n for n in ("n1", "n2", "n3") if n != kit.inc(job.id).node)
    held_for(kit, job.id, target, 0)
    nodeops.cordon(store, target, reason="no", operator="bob", clock=kit.clock)
    kit.step()
    assert store.reservations() == [] and kit.signals(job.id) == []
    assert kit.inc(job.id).n == 1 and kit.inc(job.id).state is IncarnationState.RUNNING


def test_a_store_dropped_at_the_target_s_launch_stops_the_pass_and_the_next_one_moves_the_job(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dropped connection is the store's trouble, not the move's: the reservation stays, and
    the next pass (or the next leader) takes the migration on from what the store says."""
    kit = running(store, "train")
    (job,) = store.jobs()
    target = next(n for n in ("n1", "n2", "n3") if n != kit.inc(job.id).node)
    held_for(kit, job.id, target, 1)
    begin_launch = store.begin_launch
    dropped: list[str] = []

    def dropping_once(inc, **kw):  # type: ignore[no-untyped-def]
        if not dropped:
            dropped.append(inc.job_id)
            raise StoreUnavailable("db:5432/gpuctl: lost the connection to the state store")
        return begin_launch(inc, **kw)

    monkeypatch.setattr(store, "begin_launch", dropping_once)
    with pytest.raises(StoreUnavailable, match="lost the connection"):
        for _ in range(5):
            kit.step()
    assert dropped == [job.id]
    (res,) = store.reservations()
    assert (res.node, res.cards) == (target, (1,))
    assert "migrate_rollback" not in kit.kinds(job.id)
    kit.step()
    new = kit.inc(job.id)
    assert (new.n, new.node, new.cards, new.state) == (2, target, (1,), IncarnationState.RUNNING)
    assert "migrated" in kit.kinds(job.id) and "migrate_rollback" not in kit.kinds(job.id)
    assert store.reservations() == [] and check_invariants(store) == []
