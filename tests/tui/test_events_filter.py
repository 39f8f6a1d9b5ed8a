"""Events filtered by kind: the headless filter (`gpuctl.ops.dashboard`) and the dashboard's
`:events KINDS` and `e` key."""

from __future__ import annotations

import pytest

from gpuctl.core.jobs.model import Event
from gpuctl.errors import UsageError
from gpuctl.ops.dashboard import (
    ALL_EVENTS,
    NO_CHECKPOINTS,
    EventFilter,
    Services,
    collect,
    parse_event_filter,
    recent_events,
)
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.tui.widgets.fleet import EventsList

from .conftest import keys, make_app, screen_text, settle

SIZE = (160, 40)


def busy_store(store: MemoryStore, clock: ManualClock) -> None:
    """A drain and a failover, then 300 checkpoint events after them (ten jobs for a while)."""
    now = clock.now()
    store.append_event(Event(now - 900, "alice", "drain", "draining gpu-02: fan", node="gpu-02"))
    store.append_event(Event(now - 800, "gpuctl", "failover", "train-1 left gpu-02", "train-1"))
    for i in range(300):
        kind = "checkpoint_skipped" if i % 50 == 0 else "checkpoint"
        store.append_event(Event(now - 700 + i, "gpuctl", kind, f"step {i}", f"train-{i % 10}"))


def test_the_filter_reads_kinds_and_hidden_prefixes() -> None:
    assert parse_event_filter("drain,failover") == EventFilter(only=("drain", "failover"))
    assert parse_event_filter(" -checkpoint ") == NO_CHECKPOINTS
    assert parse_event_filter("drain failover,-x") == EventFilter(("drain", "failover"), ("x",))
    assert parse_event_filter("") == parse_event_filter("all") == ALL_EVENTS
    assert NO_CHECKPOINTS.describe() == "-checkpoint" and not ALL_EVENTS.active
    with pytest.raises(UsageError, match="'dr;ain' is not an event kind"):
        parse_event_filter("dr;ain")


def test_drains_and_failovers_are_found_under_hundreds_of_checkpoints(
    store: MemoryStore, clock: ManualClock
) -> None:
    busy_store(store, clock)
    since = clock.now() - 3600
    assert {e.kind for e in recent_events(store, since, 50)} <= {
        "checkpoint",
        "checkpoint_skipped",
    }  # unfiltered, the newest 50 are all checkpoints
    only = recent_events(store, since, 50, parse_event_filter("drain,failover"))
    assert [e.kind for e in only] == ["failover", "drain"]  # newest first
    hidden = recent_events(store, since, 50, NO_CHECKPOINTS)
    assert [e.kind for e in hidden] == ["failover", "drain"]


def test_hiding_keeps_the_newest_events_it_keeps(store: MemoryStore, clock: ManualClock) -> None:
    now = clock.now()
    for i in range(120):
        store.append_event(Event(now - 200 + i, "gpuctl", "launch", f"launch {i}", f"j{i}"))
        store.append_event(Event(now - 200 + i, "gpuctl", "checkpoint", f"ckpt {i}", f"j{i}"))
    kept = recent_events(store, now - 3600, 50, NO_CHECKPOINTS)
    assert len(kept) == 50
    assert [e.message for e in kept[:2]] == ["launch 119", "launch 118"]


def test_collect_lists_the_events_its_filter_keeps(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    busy_store(store, clock)
    data = collect(services, event_filter=parse_event_filter("drain"))
    assert [e.kind for e in data.events] == ["drain"]
    assert data.event_filter == EventFilter(only=("drain",))


async def test_colon_events_lists_only_those_kinds_and_colon_events_shows_all_again(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    busy_store(store, clock)
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        events = app.screen.query_one(EventsList)

        def kinds() -> list[str]:
            return [events.shown(k)[1] for k in events.keys if k.startswith("event:")]

        assert "drain" not in kinds()  # buried under the checkpoints
        await keys(app, pilot, "colon", *"events drain,failover", "enter")
        assert kinds() == ["failover", "drain"]
        assert "nodes · events drain,failover" in screen_text(app)[0]
        text = "\n".join(screen_text(app))
        assert "draining gpu-02: fan" in text and "train-1 left gpu-02" in text
        await keys(app, pilot, "colon", *"events", "enter")
        assert "drain" not in kinds() and len(kinds()) == 50
        await keys(app, pilot, "colon", *"events dr;ain", "enter")
        assert any("'dr;ain' is not an event kind" in m for _, m in app.notified)


async def test_e_hides_checkpoint_events_and_shows_them_again(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    busy_store(store, clock)
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        events = app.screen.query_one(EventsList)
        await keys(app, pilot, "e")
        shown = [events.shown(k)[1] for k in events.keys if k.startswith("event:")]
        assert shown == ["failover", "drain"]
        assert "events -checkpoint" in screen_text(app)[0]
        await keys(app, pilot, "e")
        shown = [events.shown(k)[1] for k in events.keys if k.startswith("event:")]
        assert "checkpoint" in shown and "drain" not in shown
