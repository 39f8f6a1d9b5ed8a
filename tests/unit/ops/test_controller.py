"""`ops.controller`: one controller leads through the store's lease, a standby takes over when it
expires, and a leader whose lease was taken steps down at its next write, saying so."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.placement.model import Settings
from gpuctl.core.shared import decode
from gpuctl.errors import LeaseLost, StoreConflict
from gpuctl.ops.controller import Controller, ControllerSettings, status
from gpuctl.ops.history import Recorder
from gpuctl.ops.loop import Reconciler, ReconcileSettings
from gpuctl.testing.fakerunner import FakeCluster, FakeFleet, FakeRunner, ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.testing.waiting import wait_for

SETTINGS = ControllerSettings(lease_s=3.0, renew_s=1.0, interval_s=0.05)


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


class Paused:
    """A store whose every call waits while the process is "stopped" (SIGSTOP, as a test can
    have it in one process)."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.running = threading.Event()
        self.running.set()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.running.wait()
            return method(*args, **kwargs)

        return call


def controller(store: Any, name: str, said: list[str]) -> Controller:
    clock = ManualClock()
    cluster = FakeCluster.of("n1", gpus=2, clock=clock)
    settings = ReconcileSettings(
        placement=Settings(policy="best-fit", band_max=1.0, headroom=0.0), checkpoint_scan_s=0.0
    )
    loop = Reconciler(
        store, FakeFleet(cluster), FakeRunner(cluster), cluster.inventory(), clock, settings
    )
    return Controller(loop, holder=name, settings=SETTINGS, say=said.append)


def test_a_leader_whose_lease_was_taken_steps_down_at_its_next_write_saying_so() -> None:
    clock = Clock()
    shared = MemoryStore()
    shared.now_s = clock
    said_a: list[str] = []
    said_b: list[str] = []
    paused = Paused(shared)
    a = controller(paused, "a", said_a)
    b = controller(shared.shared(), "b", said_b)
    stop_a, stop_b = threading.Event(), threading.Event()
    runs = [threading.Thread(target=a.run, args=(stop_a,))]
    runs[0].start()
    try:
        assert wait_for(lambda: a.passes >= 1, timeout_s=10)
        assert said_a[0] == "leading (token 1, lease 3s)"
        runs.append(threading.Thread(target=b.run, args=(stop_b,)))
        runs[1].start()
        assert wait_for(lambda: "standby: a leads (token 1)" in said_b, timeout_s=10)
        paused.running.clear()  # a is stopped past its lease
        clock.t += 10
        assert wait_for(lambda: b.leading and b.token == 2, timeout_s=10)
        paused.running.set()  # and continued: its next write is refused
        lost = "lost the lease to b (token 2 > 1): stepping down"
        assert wait_for(lambda: lost in said_a, timeout_s=10), said_a
        assert said_a.count(lost) == 1 and not a.leading
        assert wait_for(lambda: "standby: b leads (token 2)" in said_a, timeout_s=10)
        found = status(shared).to_dict()
        assert (found["leader"], found["token"], found["standbys"]) == ("b", 2, ["a"])
    finally:
        stop_a.set()
        stop_b.set()
        for t in runs:
            t.join(timeout=10)
    assert "released the lease (token 2)" in said_b  # a clean stop gives the lease back
    assert shared.members() == []


def test_a_pass_that_only_publishes_its_poll_steps_down_at_once_when_the_lease_is_lost(
    caplog: Any,
) -> None:
    clock = Clock()
    shared = MemoryStore()
    shared.now_s = clock
    mine = shared.shared()
    a = controller(mine, "a", [])
    a.loop.settings = dataclasses.replace(a.loop.settings, health=AutoDrainPolicy(enabled=False))
    mine.set_fence(mine.acquire_lease("a", 3.0).fence)
    a.loop.run_once(locked=False)  # the nodes' liveness written: the next pass writes nothing
    published = shared.latest_snapshot()
    assert published is not None
    clock.t += 10  # a was stopped past its lease; b took it
    shared.acquire_lease("b", 3.0)
    with pytest.raises(LeaseLost, match=r"lost the lease to b \(token 2 > 1\)"):
        a.loop.run_once(locked=False)
    assert shared.latest_snapshot() == published  # the stale poll was refused
    assert "not published" not in caplog.text


def test_the_history_recorder_lets_a_lost_lease_through() -> None:
    clock = Clock()
    shared = MemoryStore()
    shared.now_s = clock
    mine = shared.shared()
    a = controller(mine, "a", [])
    mine.set_fence(mine.acquire_lease("a", 3.0).fence)
    a.loop.run_once(locked=False)
    published = shared.latest_snapshot()
    assert published is not None
    clock.t += 10
    shared.acquire_lease("b", 3.0)
    with pytest.raises(LeaseLost):  # logged and swallowed, the leader would act on
        Recorder().record_quietly(mine, clock.t, decode(published.body))


class Busy(Paused):
    """A store whose first lease attempt waits on a lock past PostgreSQL's lock_timeout (a leader
    stopped inside a transaction holding the lease's row)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.tries = 0

    def acquire_lease(self, holder: str, lease_s: float) -> Any:
        self.tries += 1
        if self.tries == 1:
            raise StoreConflict(
                "db:5432/gpuctl: another gpuctl changed the same rows at the same time "
                "(canceling statement due to lock timeout); nothing was written"
            )
        return self.inner.acquire_lease(holder, lease_s)


def test_a_standby_whose_lease_attempt_times_out_on_a_lock_says_so_and_tries_again() -> None:
    said: list[str] = []
    busy = Busy(MemoryStore())
    c = controller(busy, "b", said)
    stop = threading.Event()
    run = threading.Thread(target=c.run, args=(stop,))
    run.start()
    try:
        assert wait_for(lambda: c.passes >= 1, timeout_s=10), said
    finally:
        stop.set()
        run.join(timeout=10)
    assert said[:2] == [
        "could not take the lease: the store is busy (db:5432/gpuctl: another gpuctl changed the "
        "same rows at the same time (canceling statement due to lock timeout); nothing was "
        "written); retrying in 1s",
        "leading (token 1, lease 3s)",
    ]
    assert not any("pass" in line for line in said)  # a standby runs no pass to cut short


class BusyBeat(Paused):
    """A store whose first heartbeat waits on a lock past the lock timeout."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.beats = 0

    def heartbeat(self, *args: Any, **kwargs: Any) -> Any:
        self.beats += 1
        if self.beats == 1:
            raise StoreConflict("db:5432/gpuctl: canceling statement due to lock timeout")
        return self.inner.heartbeat(*args, **kwargs)


def test_a_standby_whose_heartbeat_times_out_on_a_lock_says_the_store_was_busy() -> None:
    said: list[str] = []
    shared = MemoryStore()
    shared.acquire_lease("a", 3600.0)  # another controller leads for the whole test
    busy = BusyBeat(shared)
    c = controller(busy, "b", said)
    stop = threading.Event()
    run = threading.Thread(target=c.run, args=(stop,))
    run.start()
    try:
        assert wait_for(lambda: busy.beats >= 2 and len(said) >= 2, timeout_s=10), said
    finally:
        stop.set()
        run.join(timeout=10)
    assert said[:2] == [
        "the store was busy: db:5432/gpuctl: canceling statement due to lock timeout; "
        "trying again in 1s",
        "standby: a leads (token 1)",
    ]
    assert not any("pass" in line for line in said)  # a standby runs no pass to cut short
