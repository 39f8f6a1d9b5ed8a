"""The fleet's history in the store (schema v5): samples kept across a reopen, downsampled as
they age, dropped past the retention; events pruned by kind, the audit log still append-only."""

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.core.history import DAY_S, FleetSample, NodeSample, Retention
from gpuctl.core.jobs.model import Event
from tests.pg import STORES, open_test_store

NOW = 1_800_000_000  # a whole hour


def fleet(at: int, util: float, step: int = 60) -> FleetSample:
    return FleetSample(at, step, {"utilization_pct": util, "fragmentation_pct": None})


def node(at: int, name: str, util: float, step: int = 60) -> NodeSample:
    return NodeSample(at, step, name, util, 1000, 2000, 10, 80_000)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path / "state")
    yield s
    s.close()


def test_samples_survive_closing_and_reopening_the_store(tmp_path: Path) -> None:
    with open_store(tmp_path / "state", write=True) as s:
        s.record_samples(fleet(NOW, 61.5), [node(NOW, "gpu-01", 40), node(NOW, "gpu-02", 90)])
    with open_store(tmp_path / "state", write=False) as s:
        assert [f.get("utilization_pct") for f in s.fleet_samples(NOW - 60)] == [61.5]
        got = s.node_samples(NOW - 60)
        assert [(n.node, n.util_pct, n.mem_ghost_mib) for n in got] == [
            ("gpu-01", 40, 10),
            ("gpu-02", 90, 10),
        ]
        assert s.last_sample_at() == NOW


def test_a_sample_at_a_time_already_recorded_replaces_it(store: Store) -> None:
    store.record_samples(fleet(NOW, 10), [node(NOW, "a", 10), node(NOW, "b", 10)])
    store.record_samples(fleet(NOW, 20), [node(NOW, "a", 20)])
    assert [f.get("utilization_pct") for f in store.fleet_samples(0)] == [20]
    assert [(n.node, n.util_pct) for n in store.node_samples(0)] == [("a", 20)]


def test_prune_averages_aged_samples_and_drops_those_past_the_retention(store: Store) -> None:
    retention = Retention(raw_s=DAY_S, five_min_s=2 * DAY_S, keep_s=3 * DAY_S)
    start = NOW - 4 * DAY_S
    for at in range(start, NOW, 60):
        util = float((at // 60) % 5 * 10)  # 0, 10, 20, 30, 40: every average is 20
        store.record_samples(fleet(at, util), [node(at, "a", util)])

    pruned = store.prune_history(NOW, retention)

    assert pruned.averaged > 0 and pruned.dropped > 0
    samples = store.fleet_samples(0)
    assert min(s.at for s in samples) >= NOW - 3 * DAY_S  # past the retention: gone
    steps = {s.step_s for s in samples if s.at < NOW - 2 * DAY_S}
    assert steps == {3600}
    fives = [s for s in samples if NOW - 2 * DAY_S <= s.at < NOW - DAY_S]
    assert {s.step_s for s in fives} == {300} and len(fives) == 288
    assert {s.get("utilization_pct") for s in samples if s.step_s > 60} == {20.0}
    raw = [s for s in samples if s.at >= NOW - DAY_S]
    assert {s.step_s for s in raw} == {60} and len(raw) == 1440
    nodes = store.node_samples(0, node="a")
    assert len(nodes) == len(samples)
    assert {n.util_pct for n in nodes if n.step_s > 60} == {20}
    # a second prune finds nothing more to do
    again = store.prune_history(NOW, retention)
    assert (again.averaged, again.dropped) == (0, 0)


def test_checkpoint_events_are_pruned_sooner_than_operators_events(store: Store) -> None:
    old = NOW - 30 * DAY_S
    store.append_event(Event(old, "gpuctl", "checkpoint", "j1 step 5", job_id="j1"))
    store.append_event(Event(old, "alice", "cordon", "gpu-01 cordoned", node="gpu-01"))
    store.append_event(Event(NOW - DAY_S, "gpuctl", "checkpoint", "j1 step 9", job_id="j1"))
    store.append_event(Event(NOW - 400 * DAY_S, "bob", "submit", "j0 submitted"))

    pruned = store.prune_history(NOW, Retention())

    assert pruned.events == 2
    assert [(e.kind, e.message) for e in store.events()] == [
        ("cordon", "gpu-01 cordoned"),
        ("checkpoint", "j1 step 9"),
    ]
    store.append_event(Event(NOW, "alice", "uncordon", "gpu-01 uncordoned"))
    assert [e.id for e in store.events()][-1] == 5  # ids are never reused


def test_the_audit_log_stays_append_only_outside_a_prune(tmp_path: Path) -> None:
    with open_store(tmp_path / "state", write=True) as s:
        s.append_event(Event(NOW - 900 * DAY_S, "alice", "cordon", "long ago"))
        s.prune_history(NOW - 800 * DAY_S, Retention())  # nothing past the retention then
        path = s.path
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM events")
    conn.close()
