"""The control loop records the fleet's history once per resolution step (`ops.history`)."""

from __future__ import annotations

from gpuctl.core.history import Retention
from gpuctl.core.placement.model import Settings
from gpuctl.ops.history import Recorder
from gpuctl.ops.loop import Reconciler, ReconcileSettings
from gpuctl.testing.fakerunner import FakeCluster, FakeFleet, FakeRunner, ManualClock
from gpuctl.testing.memstore import MemoryStore


def loop(store: MemoryStore) -> tuple[Reconciler, ManualClock]:
    clock = ManualClock()
    cluster = FakeCluster.of("n1", "n2", gpus=2, clock=clock)
    settings = ReconcileSettings(
        placement=Settings(policy="best-fit", band_max=1.0, headroom=0.0), checkpoint_scan_s=0.0
    )
    rec = Reconciler(
        store, FakeFleet(cluster), FakeRunner(cluster), cluster.inventory(), clock, settings
    )
    rec.record_history = Recorder(Retention(resolution_s=60)).record_quietly
    return rec, clock


def test_passes_record_one_sample_a_minute_of_the_numbers_and_each_node() -> None:
    store = MemoryStore()
    rec, clock = loop(store)
    clock.advance(60 - clock.now() % 60)  # at a minute's start
    for _ in range(30):  # 30 passes, 5 s apart: 150 s, three minutes begun
        rec.run_once()
        clock.advance(5)
    fleet = store.fleet_samples(0)
    assert len(fleet) == 3
    assert all(s.step_s == 60 for s in fleet)
    assert all(s.get("utilization_pct") == 0.0 for s in fleet)  # nothing allocated
    nodes = store.node_samples(0)
    assert sorted({n.node for n in nodes}) == ["n1", "n2"] and len(nodes) == 6
    assert all(n.mem_total_mib and n.mem_allocated_mib == 0 for n in nodes)


def test_a_new_loop_does_not_record_twice_in_the_minute_an_earlier_one_recorded() -> None:
    store = MemoryStore()
    first, clock = loop(store)
    first.run_once()
    second, _ = loop(store)
    second.clock = clock
    second.run_once()
    assert len(store.fleet_samples(0)) == 1


def test_a_loop_without_the_hook_records_nothing() -> None:
    store = MemoryStore()
    rec, _ = loop(store)
    rec.record_history = None
    rec.run_once()
    assert store.fleet_samples(0) == []
