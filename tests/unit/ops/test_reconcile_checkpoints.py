"""The control loop when a job's checkpoints are all unusable at a restart (damaged, gone): the
job is held for a person, never started fresh on gpuctl's own say-so; a job that never committed
one starts fresh as before. Over the fake runner, on the in-memory and the SQLite store alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.moves.migrate import migrate
from gpuctl.testing.drainkit import CKPT, Kit
from tests.pg import STORES, open_test_store

OFF = AutoDrainPolicy(enabled=False)
FRESH = "to start it fresh, submit its spec again with `gpuctl submit --replace`"


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path / "state")
    yield s
    s.close()


def two_checkpoints(kit: Kit, job_id: str) -> str:
    """Incarnation 1 commits steps 65 and 70, each recorded by a pass; the folder."""
    folder = f"{CKPT}/{job_id}"
    for step in (65, 70):
        kit.clock.advance(10)
        kit.cluster.commit(folder, step=step, incarnation=1, committed_at=kit.clock.now())
        kit.step()
    assert sorted(c.step for c in kit.store.checkpoints(job_id)) == [65, 70]
    return folder


def damage(kit: Kit, folder: str, problems: dict[int, str]) -> None:
    """The markers of these steps now fail verification with these problems."""
    kit.cluster.shared_checkpoints[folder] = [
        dataclasses.replace(m, valid=False, problem=problems[m.step or 0])
        if m.step in problems
        else m
        for m in kit.cluster.shared_checkpoints[folder]
    ]


def test_a_job_whose_every_checkpoint_is_damaged_at_failover_is_held_not_started_fresh(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    job = kit.submit("train")
    kit.step()
    first = kit.inc(job.id)
    folder = two_checkpoints(kit, job.id)
    damage(kit, folder, {70: "checksum mismatch: state.json", 65: "missing file: state.json"})
    kit.cluster.kill_node(first.node)
    kit.step(5)  # failing
    kit.step(31)  # down: lost and requeued; no checkpoint to resume from

    held = kit.job(job.id)
    assert held.state is JobState.HELD
    assert held.reason == (
        "no usable checkpoint: step 70 of incarnation 1: checksum mismatch: state.json; "
        "step 65 of incarnation 1: missing file: state.json; "
        f"{FRESH} (a new job; this one is cancelled)"
    )
    assert [r.incarnation for _, r in kit.runner.launches] == [1]  # nothing launched afresh
    assert [i.n for i in store.incarnations(job.id)] == [1]
    assert kit.inc(job.id).state is IncarnationState.LOST
    kit.step()
    assert kit.job(job.id).state is JobState.HELD and len(kit.runner.launches) == 1
    assert check_invariants(store) == []


def test_a_damaged_checkpoint_committed_since_the_last_scan_also_holds_the_job(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    job = kit.submit("train")
    kit.step()
    first = kit.inc(job.id)
    kit.clock.advance(10)
    folder = f"{CKPT}/{job.id}"
    kit.cluster.commit(folder, step=5, incarnation=1, committed_at=kit.clock.now(), valid=False)
    kit.cluster.kill_node(first.node)  # before any pass read it: the store recorded nothing
    kit.step(5)
    kit.step(31)
    held = kit.job(job.id)
    assert held.state is JobState.HELD, held
    assert "step 5 of incarnation 1: checksum mismatch: state.json" in (held.reason or "")
    assert len(kit.runner.launches) == 1 and check_invariants(store) == []


def test_a_recorded_checkpoint_gone_at_failover_is_named_and_not_a_store_error(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    job = kit.submit("train")
    kit.step()
    first = kit.inc(job.id)
    folder = two_checkpoints(kit, job.id)
    kit.cluster.shared_checkpoints[folder] = [  # step 70's folder deleted
        m for m in kit.cluster.shared_checkpoints[folder] if m.step != 70
    ]
    kit.cluster.kill_node(first.node)
    kit.step(5)
    kit.step(31)
    assert kit.inc(job.id).resume_step == 65  # gpuctl's choice: the newest one still there
    invalid = [e.message for e in store.events(job_id=job.id, kinds=("checkpoint_invalid",))]
    assert invalid == [f"{job.id}: step 70 of incarnation 1 is not usable: not found"]
    assert check_invariants(store) == []


def test_a_job_that_never_committed_a_checkpoint_starts_fresh_after_failover(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    job = kit.submit("train")
    kit.step()
    kit.cluster.kill_node(kit.inc(job.id).node)
    kit.step(5)
    kit.step(31)
    second = kit.inc(job.id)
    assert (second.n, second.state, second.resume_step) == (2, IncarnationState.RUNNING, None)
    assert kit.job(job.id).state is JobState.RUNNING and check_invariants(store) == []


def test_a_drained_job_whose_every_checkpoint_is_damaged_is_held_and_its_target_freed(
    store: Store,
) -> None:
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    kit.runner.ignore_signals = True  # no checkpoint on SIGUSR1 or SIGTERM: killed after the grace
    job = kit.submit("stubborn")
    kit.step()
    folder = two_checkpoints(kit, job.id)
    damage(kit, folder, {70: "checksum mismatch: state.json", 65: "checksum mismatch: state.json"})
    result = migrate(
        kit.loop,
        job.id,
        None,
        reason="test",
        actor="alice",
        grace_s=6.0,
        checkpoint_wait_s=3.0,
        poll_s=1.0,
        sleep=kit.clock.advance,
    )
    assert kit.signals(job.id) == ["USR1", "TERM", "KILL"]
    held = kit.job(job.id)
    assert held.state is JobState.HELD
    assert (held.reason or "").startswith(
        "no usable checkpoint: step 70 of incarnation 1: checksum mismatch: state.json; "
        "step 65 of incarnation 1: checksum mismatch: state.json; "
    )
    assert result.outcome == "rolled_back" and "the job is held (no usable" in result.message
    assert [r.incarnation for _, r in kit.runner.launches] == [1]
    assert store.reservations() == [] and check_invariants(store) == []
