"""Cancelling a job from the dashboard (`:jobs`, `:queue`, one job): the plan, the confirm, and
the store after it, as `gpuctl cancel` leaves it."""

from __future__ import annotations

from gpuctl.core.jobs.model import JobState
from gpuctl.ops.dashboard import Services
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.tui.app import DashApp
from gpuctl.tui.screens.job import JobScreen
from gpuctl.tui.screens.jobs import JobsScreen, QueueScreen
from gpuctl.tui.widgets.confirm import ConfirmDialog
from gpuctl.tui.widgets.table import KeyedTable

from .conftest import keys, make_app, populate, screen_text, settle

SIZE = (160, 40)


async def open_jobs(app: DashApp, pilot: object, screen: str, job_id: str) -> KeyedTable:
    await keys(app, pilot, "colon", *screen, "enter")
    table = app.screen.query_one(KeyedTable)
    await keys(app, pilot, *["down"] * table.keys.index(job_id))
    assert table.cursor_key() == job_id
    return table


async def test_k_on_a_running_job_shows_the_plan_and_y_asks_the_loop_to_stop_it(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    train = populate(store, clock)["train"].id
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        table = await open_jobs(app, pilot, "jobs", train)
        await keys(app, pilot, "k")
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog) and dialog.plan.applicable
        text = "\n".join(screen_text(app))
        assert f"cancel {train} (train), running on gpu-01 cards 0, incarnation 1:" in text
        assert "the control loop sends SIGTERM (the job checkpoints and exits)," in text
        assert "then KILL after its grace (30s); newest checkpoint: step 100, 5m00s old" in text
        await keys(app, pilot, "y")
        assert isinstance(app.screen, JobsScreen)
        job = store.job(train)
        assert job is not None and job.state is JobState.RUNNING and job.cancel_requested
        event = store.events(kinds=["cancel"])[-1]
        assert (event.actor, event.job_id, event.data["force"]) == ("alice", train, False)
        said = f"{train}: cancel requested; the control loop stops it (SIGTERM, then KILL after"
        assert ("information", f"{said} the grace)") in app.notified
        assert table.shown(train)[2] == "running (cancelling)"


async def test_a_running_job_is_killed_only_through_its_own_key_and_confirm(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    train = populate(store, clock)["train"].id
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await open_jobs(app, pilot, "jobs", train)
        await keys(app, pilot, "K")
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog)
        assert dialog.plan.text.startswith(f"kill {train} (train), running on gpu-01")
        assert "KILLs it at once (gpuctl cancel --force): no last checkpoint" in dialog.plan.text
        await keys(app, pilot, "y")
        job = store.job(train)
        assert job is not None and job.cancel_requested
        assert store.events(kinds=["cancel"])[-1].data["force"] is True


async def test_cancel_of_a_queued_job_from_the_queue_cancels_it_and_kill_is_refused(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    big = populate(store, clock)["big"].id
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        table = await open_jobs(app, pilot, "queue", big)
        await keys(app, pilot, "K")
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog) and not dialog.plan.applicable
        assert "kill applies to a running job only" in dialog.plan.text
        await keys(app, pilot, "y")  # nothing to apply: `y` does nothing
        assert isinstance(app.screen, ConfirmDialog)
        await keys(app, pilot, "escape")
        assert store.job(big).state is JobState.QUEUED  # type: ignore[union-attr]
        await keys(app, pilot, "k")
        assert "cancelled at once; it never starts" in app.screen.plan.text  # type: ignore[attr-defined]
        await keys(app, pilot, "y")
        assert isinstance(app.screen, QueueScreen)
        assert store.job(big).state is JobState.CANCELLED  # type: ignore[union-attr]
        assert ("information", f"{big} cancelled") in app.notified
        assert big not in table.keys  # gone from the queue after the refresh


async def test_n_in_the_cancel_dialog_leaves_the_job_running(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    moved = populate(store, clock)["moved"].id
    before = (store.jobs(), store.events())
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await keys(app, pilot, "colon", *f"job {moved}", "enter")
        assert isinstance(app.screen, JobScreen)
        await keys(app, pilot, "k")
        assert isinstance(app.screen, ConfirmDialog)
        await keys(app, pilot, "n")
        assert isinstance(app.screen, JobScreen)
    assert (store.jobs(), store.events()) == before


async def test_readonly_has_no_cancel_key(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    train = populate(store, clock)["train"].id
    app = make_app(services, readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await open_jobs(app, pilot, "jobs", train)
        assert "Cancel job" not in screen_text(app)[-1]
        await keys(app, pilot, "k", "K")
        assert isinstance(app.screen, JobsScreen)
    assert not store.job(train).cancel_requested  # type: ignore[union-attr]
