"""The dashboard under Pilot: each screen, the numbers, refreshes, keys, actions, errors."""

from __future__ import annotations

import threading

import pytest
from textual import events
from textual.worker import Worker, WorkerState

from gpuctl.core.jobs.model import Cordon, Event
from gpuctl.core.model import Reach
from gpuctl.ops import fleetstatus
from gpuctl.ops.actions import ActionPlan
from gpuctl.ops.dashboard import Services
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.tui import format as fmt
from gpuctl.tui.app import DashApp
from gpuctl.tui.screens.job import JobScreen
from gpuctl.tui.screens.jobs import JobsScreen, QueueScreen
from gpuctl.tui.screens.node import NodeScreen
from gpuctl.tui.screens.overview import OverviewScreen
from gpuctl.tui.widgets.confirm import ConfirmDialog
from gpuctl.tui.widgets.fleet import EventsList, FleetTable
from gpuctl.tui.widgets.help import HelpScreen
from gpuctl.tui.widgets.numbers import NumbersPanel
from gpuctl.tui.widgets.prompt import PromptScreen
from gpuctl.tui.widgets.table import KeyedTable

from .conftest import (
    ScriptedSource,
    fleet,
    keys,
    make_app,
    node,
    populate,
    screen_text,
    settle,
)

SIZE = (160, 40)


def fleet_table(app: DashApp) -> FleetTable:
    return app.screen.query_one(FleetTable)


# --- the overview --------------------------------------------------------------------------------


async def test_the_overview_lists_every_node_with_its_state_gpus_and_memory(
    services: Services,
) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert isinstance(app.screen, OverviewScreen)
        table = fleet_table(app)
        assert table.keys == ("gpu-01", "gpu-02", "gpu-03")
        row = dict(zip([k for k, _ in table._columns], table.shown("gpu-01"), strict=True))
        assert row["state"] == "ready"
        assert row["gpus"] == "4/4"
        assert row["mem"] == "0/39/319"  # nothing allocated, 39 GiB in use: ghost memory
        assert row["health"] == "ok"
        events = app.screen.query_one(EventsList)
        assert any("gpu-01 GPU 0: 39.1 GiB ghost memory" in events.shown(k)[2] for k in events.keys)


async def test_the_numbers_shown_are_the_fleet_status_numbers_for_the_same_state(
    services: Services, store: MemoryStore, clock: ManualClock, source: ScriptedSource
) -> None:
    populate(store, clock)
    expected = fleetstatus.numbers(source.snapshot, store, clock.now())
    assert expected.jobs.failover_success_pct == 100.0  # the state really has all five numbers
    assert expected.jobs.queue_waiting == 1 and expected.jobs.checkpoint_age_max_s is not None
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.data is not None and app.data.numbers == expected
        shown = app.screen.query_one(NumbersPanel).shown()
        cards = fmt.number_cards(expected)
        assert shown == {key: cards[key][0].plain for key, _ in fmt.NUMBER_KEYS}
        assert shown["utilization"].startswith(f"{expected.utilization_pct:.0f}%")
        assert shown["queue"] == fmt.duration(expected.jobs.queue_wait_p50_s)
        assert shown["checkpoint"] == fmt.duration(expected.jobs.checkpoint_age_max_s)
        assert shown["failover"] == "100%"
        assert shown["fragmentation"] == fmt.pct(expected.fragmentation_pct)
        text = "\n".join(screen_text(app))
        for headline in shown.values():
            assert headline in text


async def test_a_node_going_down_shows_within_one_refresh(
    services: Services, source: ScriptedSource
) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert fleet_table(app).shown("gpu-02")[1] == "ready"
        nodes = list(source.snapshot.nodes)
        nodes[1] = node("gpu-02", reach=Reach.TIMEOUT, error="no answer within 10s")
        source.snapshot = fleet(*nodes)
        polls = app.polls
        await keys(app, pilot, "r")
        assert app.polls == polls + 1
        _, state, *_, notes = fleet_table(app).shown("gpu-02")
        assert (state, notes) == ("down (timeout)", "no answer within 10s")
        alerts = app.screen.query_one(EventsList)
        assert "gpu-02 timeout: no answer within 10s" in alerts.shown(alerts.keys[0])[2]


async def test_rows_are_updated_in_place_and_the_cursor_stays_on_its_node(
    services: Services, source: ScriptedSource
) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        table = fleet_table(app)
        await pilot.press("down", "down")
        assert table.cursor_key() == "gpu-03"
        rebuilds = table.rebuilds
        source.snapshot = fleet(
            node("gpu-01", used_mib=[40_000], temp_c=91), node("gpu-02"), node("gpu-03", gpus=2)
        )
        await keys(app, pilot, "r")
        assert table.shown("gpu-01")[7] == "91C"
        assert table.get_cell("gpu-01", "temp").plain == "91C"  # what the table renders
        assert "91C" in next(line for line in screen_text(app) if "gpu-01" in line)
        assert table.rebuilds == rebuilds
        assert table.cursor_key() == "gpu-03"


async def test_the_timer_polls_again_without_a_key(services: Services) -> None:
    app = make_app(services, refresh_s=1.0)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        first = app.polls
        await pilot.pause(1.3)
        await settle(app, pilot)
        assert app.polls > first


def test_the_refresh_interval_is_never_below_one_second(services: Services) -> None:
    assert DashApp(services, refresh_s=0.1).refresh_s == 1.0
    assert DashApp(services, refresh_s=5).refresh_s == 5.0


# --- never stuck, never crashed ------------------------------------------------------------------


async def test_a_failing_poll_is_a_notification_and_the_app_carries_on(
    services: Services, source: ScriptedSource
) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        source.error = RuntimeError("the probe exploded")
        await keys(app, pilot, "r")
        assert ("error", "refresh failed: RuntimeError: the probe exploded") in app.notified
        assert app.is_running and fleet_table(app).keys == ("gpu-01", "gpu-02", "gpu-03")
        source.error = None
        polls = app.polls
        await keys(app, pilot, "r")
        assert app.polls == polls + 1


async def test_a_poll_that_ends_while_the_app_shuts_down_is_dropped_not_a_crash(
    services: Services,
) -> None:
    # A thread worker can finish after the app has closed its screens; its state change still
    # arrives (seen in CI: `ScreenStackError` at the end of a test).
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        shown, polls = app.data, app.polls
    assert not app.screen_stack
    late = Worker(app, lambda: None, name="poll", group="poll", thread=True)
    app._inbox = shown
    app.on_worker_state_changed(Worker.StateChanged(late, WorkerState.SUCCESS))
    assert app.polls == polls and app._inbox is None
    task = Worker(app, lambda: None, name="cordon", group="cordon", thread=True)
    app._callbacks[task] = lambda _: pytest.fail("a callback ran with no screen to show it on")
    app.on_worker_state_changed(Worker.StateChanged(task, WorkerState.SUCCESS))
    assert task not in app._callbacks


async def test_a_hung_poll_is_reported_overdue_and_no_second_poll_piles_up(
    services: Services, source: ScriptedSource
) -> None:
    release = threading.Event()
    source.deadline_s = 0.0
    app = make_app(services, refresh_s=1.0)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        source.before_poll = lambda: release.wait(10)
        polls = source.polls
        await pilot.press("r")
        await pilot.pause(1.3)  # one timer tick while the poll hangs
        assert source.polls == polls + 1
        assert any(m.startswith("poll overdue") for _, m in app.notified)
        assert "poll overdue" in screen_text(app)[0]
        await pilot.press("q")  # the UI still answers keys
        release.set()
    assert not app.is_running


# --- keys ----------------------------------------------------------------------------------------


async def test_help_lists_the_keys_of_the_screen_and_esc_closes_it(services: Services) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = "\n".join(screen_text(app))
        assert "cordon / uncordon that node" in text and ":queue" in text
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)


async def test_slash_filters_the_rows_and_esc_clears_the_filter(services: Services) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("slash")
        assert isinstance(app.screen, PromptScreen)
        await pilot.press(*"gpu-02", "enter")
        assert fleet_table(app).keys == ("gpu-02",)
        assert "filter /gpu-02" in screen_text(app)[0]
        await pilot.press("escape")
        assert fleet_table(app).keys == ("gpu-01", "gpu-02", "gpu-03")


async def test_colon_commands_jump_between_screens(services: Services) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        for command, screen in (
            ("jobs", JobsScreen),
            ("queue", QueueScreen),
            ("nodes", OverviewScreen),
        ):
            await pilot.press("colon", *command, "enter")
            assert isinstance(app.screen, screen), command
        await pilot.press("colon", *"node gpu-03", "enter")
        assert isinstance(app.screen, NodeScreen) and app.screen.node_name == "gpu-03"
        await pilot.press("colon", *"nonsense", "enter")
        assert any("unknown command :nonsense" in m for _, m in app.notified)
        assert len(app.screen_stack) == 3  # still on the node, nothing pushed


async def test_a_command_typed_in_one_go_reaches_the_prompt(services: Services) -> None:
    """`:queue⏎` arriving in one read of the terminal (fast typing, tmux, a paste)."""
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        for key, char in [("colon", ":"), *((c, c) for c in "queue"), ("enter", "\r")]:
            app.post_message(events.Key(key, char))
        await settle(app, pilot)
        assert isinstance(app.screen, QueueScreen)
        assert app.is_running  # the `q` of `queue` went into the prompt


async def test_enter_drills_into_the_node_and_esc_comes_back(services: Services) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "enter")
        assert isinstance(app.screen, NodeScreen) and app.screen.node_name == "gpu-02"
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)
        assert fleet_table(app).cursor_key() == "gpu-02"


async def test_q_quits(services: Services, source: ScriptedSource) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("q")
    assert not app.is_running
    assert source.closed  # the services were closed with the app


# --- screens -------------------------------------------------------------------------------------


async def test_the_node_screen_shows_gpus_processes_health_and_cordon_history(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    now = clock.now()
    store.cordon(
        Cordon("gpu-01", "fan noise", "bob", "operator", now),
        Event(now, "bob", "cordon", "cordoned gpu-01: fan noise", node="gpu-01"),
    )
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        gpus = screen.query_one("#gpus", KeyedTable)
        assert gpus.keys == ("0", "1", "2", "3")
        gpu0 = gpus.shown("0")
        assert gpu0[3] == "0.0/39.1/79.6" and gpu0[7] == "ok"
        assert set(gpu0[2]) == {fmt.BAR_GHOST, fmt.BAR_FREE}  # in use, allocated to nobody
        procs = screen.query_one("#processes", KeyedTable)
        assert procs.shown(procs.keys[0])[:4] == ("1000", "0", "40000", "python")
        text = "\n".join(screen_text(app))
        assert "cordoned now by bob (operator): fan noise" in text
        assert "cordon    bob: cordoned gpu-01: fan noise" in text
        assert "gpu-01  cordoned" in text


async def test_queue_shows_why_each_job_waits_and_jobs_show_where_they_run(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    made = populate(store, clock)
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.data is not None and not app.data.reasons  # not worked out for the overview
        await pilot.press("colon", *"queue", "enter")
        await settle(app, pilot)  # the queue screen asks for a poll with the reasons at once
        assert app.data.reasons
        queue = app.screen.query_one(KeyedTable)
        big = made["big"].id
        assert queue.keys == (big,)
        assert queue.shown(big)[4:] == (
            "10m00s",
            "no node can take 8 × whole cards: 3 nodes: fewer than 8 usable cards",
        )
        await pilot.press("colon", *"jobs", "enter")
        table = app.screen.query_one(KeyedTable)
        train, moved = made["train"].id, made["moved"].id
        assert set(table.keys) == {train, moved}
        assert table.shown(train)[2:] == ("running", "gpu-01", "0", "standard", "5m00s", "1", "0")
        assert table.shown(moved)[3:8] == ("gpu-03", "0", "standard", "9m30s (none)", "2")


class FakeLogs:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def tail(self, store: object, job_ref: str, max_bytes: int = 0) -> str:
        self.asked.append(job_ref)
        return "step 1 loss 2.0\nstep 2 loss 1.5\x1b[31m red\x1b[0m\n"


async def test_the_job_screen_shows_incarnations_events_and_the_log_tail(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    made = populate(store, clock)
    services.logs = logs = FakeLogs()
    moved = made["moved"].id
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("colon", *"jobs", "enter")
        table = app.screen.query_one(KeyedTable)
        await keys(app, pilot, *["down"] * table.keys.index(moved), "enter")
        assert isinstance(app.screen, JobScreen) and app.screen.job_id == moved
        assert logs.asked == [moved]
        text = "\n".join(screen_text(app))
        assert "#1 lost      gpu-02 cards 1" in text and "#2 running   gpu-03 cards 0" in text
        assert "step 2 loss 1.5 red" in text  # escape sequences stripped
        await pilot.press("escape")
        assert isinstance(app.screen, JobsScreen)


# --- actions -------------------------------------------------------------------------------------


def store_state(store: MemoryStore) -> tuple[object, ...]:
    return (store.cordons(), store.events(), store.jobs())


async def test_the_confirm_dialog_shows_the_plan_and_cancel_applies_nothing(
    services: Services, store: MemoryStore
) -> None:
    before = store_state(store)
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "c")
        assert isinstance(app.screen, PromptScreen)
        await keys(app, pilot, *"fan noise", "enter")
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog)
        assert dialog.plan.text.startswith("cordon gpu-02: no new work lands there")
        text = "\n".join(screen_text(app))
        assert "reason:   fan noise" in text and "operator: alice (source: operator)" in text
        await keys(app, pilot, "n")
        assert isinstance(app.screen, OverviewScreen)
    assert store_state(store) == before


async def test_yes_applies_the_cordon_the_plan_showed(
    services: Services, store: MemoryStore
) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await keys(app, pilot, "down", "c", *"fan noise", "enter")
        await keys(app, pilot, "y")
        assert [(c.node, c.reason, c.operator, c.source) for c in store.cordons()] == [
            ("gpu-02", "fan noise", "alice", "operator")
        ]
        event = store.events(kinds=["cordon"])[-1]
        assert (event.actor, event.node, event.data["source"]) == ("alice", "gpu-02", "operator")
        assert event.data["reason"] == "fan noise"
        assert ("information", "gpu-02 cordoned by alice: fan noise") in app.notified
        assert fleet_table(app).shown("gpu-02")[1] == "cordoned"  # refreshed after the action
        await keys(app, pilot, "u")
        assert "lifts:    the cordon by alice (operator): fan noise" in app.screen.plan.text  # type: ignore[attr-defined]
        await keys(app, pilot, "y")
        assert store.cordons() == []


async def test_drain_shows_where_each_job_goes_and_cancel_moves_nothing(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    made = populate(store, clock)  # train runs on gpu-01, card 0
    before = store_state(store)
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await keys(app, pilot, "d", *"fan failing", "enter")
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog) and dialog.plan.applicable
        lines = dialog.plan.text.splitlines()
        assert lines[0] == "drain gpu-01: fan failing (not cordoned yet)"
        assert lines[1].startswith("cordon it, then move 1 of 1 job(s) off it")
        train = next(line for line in lines if line.startswith(made["train"].id))
        assert train.split()[1:3] == ["1", "0"] and train.split()[3] in ("gpu-02", "gpu-03")
        assert train.endswith("step 100, 5m00s old")
        assert "drain gpu-01: fan failing" in "\n".join(screen_text(app))
        await keys(app, pilot, "escape")
        assert isinstance(app.screen, OverviewScreen)
    assert store_state(store) == before


async def test_drain_of_an_empty_node_cordons_it_and_records_the_drain(
    services: Services, store: MemoryStore
) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await keys(app, pilot, "down", "down", "d", *"new PSU", "enter")
        assert app.screen.plan.text.endswith("no jobs on the node")  # type: ignore[attr-defined]
        await keys(app, pilot, "y")
        assert [(c.node, c.reason, c.operator) for c in store.cordons()] == [
            ("gpu-03", "new PSU", "alice")
        ]
        assert [e.kind for e in store.events() if e.node == "gpu-03"] == ["cordon", "drain"]
        assert ("information", "gpu-03: 0 of 0 job(s) moved; cordoned") in app.notified


async def test_consolidation_shows_the_services_plan(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    populate(store, clock)
    before = store_state(store)
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await keys(app, pilot, "x")
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog)
        assert dialog.plan.text.startswith("consolidation plan · fleet version ")
        assert "whole free cards" in dialog.plan.text
        await pilot.press("escape")
    assert store_state(store) == before


async def test_readonly_hides_the_actions_and_their_keys_do_nothing(
    services: Services, store: MemoryStore
) -> None:
    before = store_state(store)
    app = make_app(services, readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        footer = screen_text(app)[-1]
        assert "Cordon" not in footer and "Refresh" in footer
        assert "read-only" in screen_text(app)[0]
        await keys(app, pilot, "c", "u", "d", "x")
        assert isinstance(app.screen, OverviewScreen)
    assert store_state(store) == before


class SlowDrain:
    """An action service whose drain runs until the test lets it finish."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.applied: list[str] = []

    def needs_reason(self, action: str) -> bool:
        return False

    def plan(self, action: str, target: str | None, *, reason: str | None = None) -> ActionPlan:
        return ActionPlan(action, target, f"{action} {target}: move 1 job")

    def apply(self, plan: ActionPlan, progress: object = None) -> str:
        self.release.wait(10)
        self.applied.append(plan.action)
        return "drained"


async def test_q_while_a_drain_moves_jobs_asks_again_before_quitting(
    services: Services,
) -> None:
    slow = SlowDrain()
    services.actions = slow
    app = make_app(services)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot)
            await keys(app, pilot, "d")
            await pilot.press("y")
            await pilot.pause()
            await pilot.press("q")
            assert app.is_running
            assert app.notified[-1][1].startswith("a drain is moving jobs: press q again")
            slow.release.set()
            await pilot.press("q")
    finally:
        slow.release.set()
    assert not app.is_running
