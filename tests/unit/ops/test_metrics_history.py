"""`metrics serve` records the fleet's history when it polls the fleet itself: one sample per
resolution step, none in a step a control loop already recorded, none from the store alone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gpuctl.config.health_rules import load_rules
from gpuctl.core.history import FLEET_SERIES, FleetSample, Retention
from gpuctl.ops.history import Recorder
from gpuctl.ops.metrics import Refresher
from gpuctl.testing.fakerunner import FakeCluster, FakeFleet, ManualClock
from gpuctl.testing.memstore import MemoryStore


def refresher(store: MemoryStore, clock: ManualClock, *, poll: bool = True) -> Refresher:
    cluster = FakeCluster.of("n1", "n2", gpus=2, clock=clock)
    made = (
        Refresher(
            open_store=lambda: store,
            clock=clock,
            rules=load_rules(),
            inventory=cluster.inventory(),
            gatherer=FakeFleet(cluster),
        )
        if poll
        else Refresher(open_store=lambda: store, clock=clock, rules=load_rules())
    )

    @contextlib.contextmanager
    def writer() -> Iterator[MemoryStore]:
        yield store

    made.record_history(Recorder(Retention(resolution_s=60)), writer)
    return made


def test_polls_every_15_s_record_one_sample_a_minute() -> None:
    store, clock = MemoryStore(), ManualClock()
    clock.advance(60 - clock.now() % 60)
    metrics = refresher(store, clock)
    for _ in range(12):  # three minutes of refreshes
        metrics.refresh()
        clock.advance(15)
    fleet = store.fleet_samples(0)
    assert [s.at % 60 for s in fleet] == [0, 0, 0] and len({s.at for s in fleet}) == 3
    assert sorted({n.node for n in store.node_samples(0)}) == ["n1", "n2"]
    assert len(store.node_samples(0)) == 6


def test_a_minute_a_control_loop_recorded_is_not_recorded_again() -> None:
    store, clock = MemoryStore(), ManualClock()
    clock.advance(60 - clock.now() % 60)
    metrics = refresher(store, clock)
    metrics.refresh()  # this minute: recorded by the server
    clock.advance(60)
    loops = FleetSample(int(clock.now()), 60, dict.fromkeys(FLEET_SERIES, 7.0))
    store.record_samples(loops, [])  # the next minute: a control loop was first
    for _ in range(3):
        metrics.refresh()
        clock.advance(15)
    fleet = store.fleet_samples(0)
    assert len(fleet) == 2
    assert fleet[-1] == loops  # the loop's sample, not replaced
    assert store.node_samples(clock.now() - 60) == []


def test_the_store_alone_records_nothing() -> None:
    store, clock = MemoryStore(), ManualClock()
    refresher(store, clock, poll=False).refresh()
    assert store.fleet_samples(0) == [] and store.node_samples(0) == []
