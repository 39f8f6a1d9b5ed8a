"""The dashboard's sparklines read the store's history (`ops.dashboard.DashHistory`): started on
a store holding hours of samples, the numbers and each node's utilization show those hours at
once, the live values of each refresh added; without a stored history, the last refreshes."""

from __future__ import annotations

from gpuctl.core.history import FLEET_SERIES, FleetSample, NodeSample
from gpuctl.ops.dashboard import DashHistory, Services, collect
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.tui import format as fmt
from gpuctl.tui.rows import FLEET_COLUMNS, NODE_SPARK_WIDTH
from gpuctl.tui.widgets.numbers import NumberCard
from gpuctl.tui.widgets.table import KeyedTable

from .conftest import keys, make_app, screen_text, settle

SIZE = (200, 50)
HOURS = 6


def record_hours(store: MemoryStore, now: float, hours: int = HOURS) -> None:
    """A sample a minute over the last `hours`: allocation climbs from 0 to 100% over them,
    gpu-01's utilization likewise, gpu-02's stays at 10%."""
    minutes = hours * 60
    start = int(now) - int(now) % 60 - minutes * 60
    for m in range(minutes):
        at = start + m * 60
        pct = round(100 * m / (minutes - 1), 2)
        values = dict.fromkeys(FLEET_SERIES) | {"utilization_pct": pct}
        store.record_samples(
            FleetSample(at, 60, values),
            [
                NodeSample(at, 60, "gpu-01", pct, 0, 0, 0, 100),
                NodeSample(at, 60, "gpu-02", 10.0, 0, 0, 0, 100),
            ],
        )


def test_a_dashboard_started_on_six_hours_of_history_has_them_at_five_minute_points(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    record_hours(store, clock.now())
    data = collect(services, history=DashHistory("6h"))
    view = data.history
    assert view is not None and view.stored and view.step_s == 300
    points = view.series("utilization_pct")
    assert len(points) == 72  # 6 h at 5 minutes
    stored = [p for p in points[:-1] if p is not None]
    assert len(stored) >= 70 and stored == sorted(stored)  # climbing, as recorded
    assert stored[0] < 5 and stored[-1] > 95
    assert points[-1] == data.numbers.utilization_pct  # this refresh, live
    gpu01, gpu02 = view.node("gpu-01"), view.node("gpu-02")
    assert len(gpu01) == 72 and gpu01[0] is not None and gpu01[0] < 5
    assert {p for p in gpu02[:-1] if p is not None} == {10.0}
    assert gpu02[-1] == 0.0  # the live poll: its GPUs idle


def test_the_points_move_on_as_buckets_end_reading_only_what_is_new(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    record_hours(store, clock.now(), hours=1)
    history = DashHistory("1h")
    first = collect(services, history=history).history
    assert first is not None and first.step_s == 60
    clock.advance(120)
    at = int(clock.now()) - int(clock.now()) % 60 - 60  # the minute that just ended
    values = dict.fromkeys(FLEET_SERIES) | {"utilization_pct": 42.0}
    store.record_samples(FleetSample(at, 60, values), [])  # a control loop recorded it
    after = collect(services, history=history).history
    assert after is not None
    assert after.series("utilization_pct")[-2] == 42.0  # read from the store
    assert after.series("utilization_pct")[:-3] == first.series("utilization_pct")[2:-1]


def test_without_a_stored_history_the_sparklines_are_the_last_refreshes(
    services: Services, clock: ManualClock
) -> None:
    history = DashHistory("6h")
    for _ in range(3):
        view = collect(services, history=history).history
        clock.advance(2)
    assert view is not None and not view.stored
    assert len(view.series("utilization_pct")) == 3 and len(view.node("gpu-01")) == 3
    assert view.label == "history: this run"


async def test_the_overview_draws_the_stored_hours_in_its_cards_and_node_rows(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    record_hours(store, clock.now())
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        card = next(c for c in app.screen.query(NumberCard) if c.key == "utilization")
        width = card.content_size.width
        spark = fmt.sparkline(fmt.squeeze(card.points, width), width, lo=0, hi=100)
        assert len(card.points) == 72 and spark.startswith("▁") and "█" in spark
        assert spark in "\n".join(screen_text(app))  # 6 h climbing, drawn at the first poll
        table = app.screen.query_one("#fleet", KeyedTable)
        column = [k for k, _ in FLEET_COLUMNS].index("util_hist")
        row = table.shown("gpu-01")[column]
        assert len(row) == NODE_SPARK_WIDTH and row[0] == "▁" and "▇" in row
        assert set(table.shown("gpu-02")[column][:-1]) == {"▂"}  # a steady 10%
        assert "history 6h" in screen_text(app)[0]
        await keys(app, pilot, "h")  # the next window: 24 h
        await settle(app, pilot)
        assert "history 24h" in screen_text(app)[0]
        assert app.data is not None and app.data.history is not None
        assert app.data.history.step_s == 1200
