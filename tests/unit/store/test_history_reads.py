"""The history read in buckets by the store (the dashboard's sparklines: one row per node and
point, not every sample) gives what averaging every sample gave, on each store; a prune's dry run
counts what the prune then deletes, table by table."""

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.history import DAY_S, FleetSample, NodeSample, Retention, average_nodes
from gpuctl.core.jobs.model import Event
from gpuctl.ops.history import window
from tests.pg import STORES, open_test_store

NOW = 1_800_000_000  # a whole hour
# names whose order a database collation may change (case, punctuation, digits)
NAMES = ("gpu-b", "Gpu-a", "gpu_10", "gpu-9", "gpu.2", "GPU-c")


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path / "state")
    yield s
    s.close()


def seed(store: Store, start: int, end: int) -> None:
    """Minute samples of each node (some columns undefined, a node silent for a while), with a
    few 5-minute averages among them, as a prune leaves at the raw level's edge."""
    rng = random.Random(7)
    for at in range(start, end, 60):
        nodes = []
        for k, name in enumerate(NAMES):
            if name == "gpu_10" and (at // 600) % 3 == 0:
                continue  # did not answer these ten minutes
            util = None if rng.random() < 0.1 else float(rng.randrange(0, 101))
            used = None if util is None else rng.randrange(0, 80_000)
            ghost = None if k % 2 else rng.randrange(0, 700)
            nodes.append(
                NodeSample(at, 60, name, util, used, rng.randrange(0, 80_000), ghost, 80_000)
            )
        store.record_samples(FleetSample(at, 60, {"utilization_pct": float(at % 97)}), nodes)
    five = [
        NodeSample(start - 300 * i, 300, name, float(10 * i + k), 100 * i, 5, None, 80_000)
        for i in range(1, 4)
        for k, name in enumerate(NAMES)
    ]
    store.record_samples(None, five[: len(NAMES)])
    store.record_samples(None, five[len(NAMES) : 2 * len(NAMES)])
    store.record_samples(None, five[2 * len(NAMES) :])


@pytest.mark.parametrize("step", [60, 300, 1200, 3600])
def test_bucket_averages_from_the_store_equal_averaging_every_sample(
    store: Store, step: int
) -> None:
    seed(store, NOW - 6 * 3600, NOW)
    for since in (NOW - 6 * 3600 - 900, NOW - 3 * 3600 + 17, NOW - 400):
        expected = average_nodes(store.node_samples(since), step)
        assert expected  # the seeded store has samples there
        assert store.node_sample_buckets(since, step) == expected
    until = NOW - 2 * 3600
    assert store.node_sample_buckets(NOW - DAY_S, step, until) == average_nodes(
        store.node_samples(NOW - DAY_S, until), step
    )
    got = store.node_sample_buckets(NOW - DAY_S, step, node="gpu_10")
    assert got == average_nodes(store.node_samples(NOW - DAY_S, node="gpu_10"), step)
    assert {n.node for n in got} == {"gpu_10"}
    assert store.node_sample_buckets(NOW - DAY_S, step, node="nowhere") == []


def test_the_dashboard_window_reads_one_row_per_node_and_point(store: Store) -> None:
    seed(store, NOW - 6 * 3600, NOW)
    fleet, nodes = window(store, NOW, 6 * 3600, step_s=300)
    # 6 h of 5-minute points, gpu_10 silent a third of the time
    assert len(nodes) == (len(NAMES) - 1) * 72 + 48
    assert nodes == average_nodes(window(store, NOW, 6 * 3600)[1], 300)
    assert [f.at for f in fleet] == sorted({n.at for n in nodes})
    # the report reads through the same window, as stored
    raw_fleet, raw_nodes = window(store, NOW, 6 * 3600, until=NOW)
    assert raw_nodes == store.node_samples(NOW - 6 * 3600, NOW)
    assert raw_fleet == store.fleet_samples(NOW - 6 * 3600, NOW)


def seed_for_prune(store: Store) -> Retention:
    for at in range(NOW - 4 * DAY_S, NOW, 120):
        util = float((at // 120) % 5 * 10)
        store.record_samples(
            FleetSample(at, 60, {"utilization_pct": util}),
            [NodeSample(at, 60, n, util, 1, 2, 3, 4) for n in ("a", "b")],
        )
    for days, kind in [
        (20, "checkpoint"),
        (2, "checkpoint_skipped"),
        (400, "cordon"),
        (20, "drain"),
    ]:
        store.append_event(Event(NOW - days * DAY_S, "alice", kind, f"{kind} {days}d ago"))
    return Retention(raw_s=DAY_S, five_min_s=2 * DAY_S, keep_s=3 * DAY_S)


def rows(store: Store) -> dict[tuple[str, str], int]:
    """Rows by (table, level), read the long way."""
    out: dict[tuple[str, str], int] = {}
    for f in store.fleet_samples(0):
        key = ("fleet_samples", {60: "1m", 300: "5m", 3600: "1h"}[f.step_s])
        out[key] = out.get(key, 0) + 1
    for n in store.node_samples(0):
        key = ("node_samples", {60: "1m", 300: "5m", 3600: "1h"}[n.step_s])
        out[key] = out.get(key, 0) + 1
    for e in store.events():
        key = ("events", "checkpoint" if e.kind.startswith("checkpoint") else "other")
        out[key] = out.get(key, 0) + 1
    return out


def test_a_prune_dry_run_counts_what_the_prune_deletes_table_by_table(store: Store) -> None:
    retention = seed_for_prune(store)
    stored = rows(store)

    dry = store.prune_history_report(NOW, retention, dry_run=True)

    assert rows(store) == stored  # nothing changed
    assert dry.dry_run and dry.pruned.averaged > 0 and dry.pruned.dropped > 0
    assert {(t.table, t.level): t.before for t in dry.tables if t.before} == stored
    real = store.prune_history_report(NOW, retention)
    assert not real.dry_run
    assert real.tables == dry.tables and real.pruned == dry.pruned
    after = rows(store)
    assert {(t.table, t.level): t.after for t in real.tables if t.after} == after
    levels = {(t.table, t.level): t.change for t in real.tables}
    assert levels[("node_samples", "1m")] == -2 * (3 * DAY_S // 120)  # 3 days of raw gone
    assert levels[("node_samples", "1h")] == 2 * 24  # one day of hourly averages
    assert levels[("events", "checkpoint")] == -1 and levels[("events", "other")] == -1
    again = store.prune_history_report(NOW, retention, dry_run=True)
    assert all(t.change == 0 for t in again.tables)
