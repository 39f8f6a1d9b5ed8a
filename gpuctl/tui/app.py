"""`gpuctl dash`: the fleet, live, in the terminal.

The app receives its services (`gpuctl.ops.dashboard.Services`) and builds no plans itself. Polls
run in a thread worker (`exit_on_error=False`); a poll that fails becomes a notification and the
last view stays; a poll that takes longer than the source's deadline is reported as overdue and no
second poll piles up behind it. Results reach the UI only through worker state messages.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.notifications import SeverityLevel
from textual.worker import Worker, WorkerState

from gpuctl.core.fleet.view import PlacementMemo
from gpuctl.errors import GpuctlError
from gpuctl.ops.actions import ActionPlan
from gpuctl.ops.dashboard import (
    ALL_EVENTS,
    DEFAULT_WINDOW,
    NO_CHECKPOINTS,
    DashData,
    DashHistory,
    EventFilter,
    GpuHistory,
    HealthKeeper,
    Services,
    collect,
    next_history_window,
    parse_event_filter,
)
from gpuctl.tui import format as fmt
from gpuctl.tui.messages import (
    ActionRequested,
    NextHistoryWindow,
    OpenJob,
    OpenNode,
    ToggleCheckpoints,
)
from gpuctl.tui.quietgc import QuietGc
from gpuctl.tui.screens.base import DashScreen
from gpuctl.tui.screens.job import JobScreen
from gpuctl.tui.screens.jobs import JobsScreen, QueueScreen
from gpuctl.tui.screens.node import NodeScreen
from gpuctl.tui.screens.overview import OverviewScreen
from gpuctl.tui.widgets.confirm import ConfirmDialog
from gpuctl.tui.widgets.help import HelpScreen
from gpuctl.tui.widgets.prompt import PromptScreen

MIN_REFRESH_S = 1.0
DEFAULT_REFRESH_S = 2.0
NOTES_KEPT = 100
QUIT_AGAIN_S = 5.0  # a second `q` within this long quits while an action still runs
MOVING = ("drain", "consolidate")  # actions that move jobs and take a while
GC_AFTER_S = 0.2  # garbage is collected this long after a refresh is shown


def describe(exc: BaseException | None) -> str:
    if isinstance(exc, GpuctlError):
        return exc.message
    if exc is None:
        return "unknown error"
    return f"{type(exc).__name__}: {exc}"


class DashApp(App[None]):
    CSS_PATH = str(Path(__file__).with_name("gpuctl.tcss"))
    TITLE = "gpuctl dash"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?"),
        # priority: handled as the key arrives, so the keys typed right after it (`:queue⏎` in
        # one go) go to the prompt, never to the table below it
        Binding("colon", "command", "Command", key_display=":", priority=True),
        Binding("r", "refresh", "Refresh"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        services: Services,
        refresh_s: float = DEFAULT_REFRESH_S,
        readonly: bool = False,
        *,
        offset_s: float | None = None,
        history: str = DEFAULT_WINDOW,
    ) -> None:
        super().__init__()
        self.services = services
        self.refresh_s = max(MIN_REFRESH_S, float(refresh_s))
        self.readonly = readonly or services.actions is None
        self.offset_s = float(time.localtime().tm_gmtoff) if offset_s is None else offset_s
        self.data: DashData | None = None
        self.generation = 0  # data versions shown (screens compare it on resume)
        self.polls = 0  # polls that finished
        self.poll_s: float | None = None  # how long the last poll took
        self.overdue_s: float | None = None  # how long the running poll is past its deadline
        # the last notifications (severity, message), for tests and logs
        self.notified: deque[tuple[str, str]] = deque(maxlen=NOTES_KEPT)
        self.event_filter: EventFilter = ALL_EVENTS  # which events the overview lists
        self._health = HealthKeeper()
        self.gpu_history = GpuHistory()  # each GPU's last polls, for the node screen
        # the numbers' and nodes' sparklines over `history` (1h, 6h, 24h), from the store
        self.history = DashHistory(history)
        self._placement = PlacementMemo()  # nodes whose placement inputs did not move
        self._poll_started: float | None = None
        self._callbacks: dict[Worker[Any], Callable[[Any], None]] = {}
        self._quit_asked_at: float | None = None
        self._inbox: DashData | None = None  # the last poll's data, until the UI thread takes it
        self.gc = QuietGc()  # garbage collection between refreshes (see gpuctl.tui.quietgc)

    # --- lifecycle ------------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.gc.start()
        self.push_screen(OverviewScreen())
        self.set_interval(self.refresh_s, self._tick)
        self.action_refresh()

    def on_unmount(self) -> None:
        self.gc.stop()
        self.services.close()

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        self.notified.append((severity, message))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "command":  # `:` in a prompt or dialog is just a character
            return self._dash_screen() is not None
        return True

    async def action_quit(self) -> None:
        """Quit; while a drain or consolidation is moving jobs, only on a second `q`."""
        running = [w.name for w in self.workers if w.name in MOVING and w.is_running]
        now = time.monotonic()
        asked = self._quit_asked_at
        if running and (asked is None or now - asked > QUIT_AGAIN_S):
            self._quit_asked_at = now
            self.notify(
                f"a {running[0]} is moving jobs: press q again to quit anyway (the control loop "
                "finishes a move left half-way)",
                severity="warning",
            )
            return
        self.exit()

    # --- polling ------------------------------------------------------------------------------

    @property
    def polling(self) -> bool:
        return self._poll_started is not None

    def _tick(self) -> None:
        if self._poll_started is None:
            self.action_refresh()
            return
        if time.monotonic() - self._poll_started > self.refresh_s:
            self.gc.idle()  # a poll that hangs leaves no refresh to collect after
        late = time.monotonic() - self._poll_started - self.services.source.deadline_s
        if late > 0:
            first = self.overdue_s is None
            self.overdue_s = late
            if first:
                self.notify(
                    f"poll overdue: no answer within {self.services.source.deadline_s:g}s; "
                    "showing the last view",
                    severity="warning",
                )
            self._status()

    def action_refresh(self) -> None:
        if self._poll_started is not None:
            return  # one poll at a time: a slow one never piles up others behind it
        self._poll_started = time.monotonic()
        services, health, placement = self.services, self._health, self._placement
        reasons, event_filter = self.wants_reasons(), self.event_filter
        gpu_history, history = self.gpu_history, self.history

        def poll() -> None:
            # The data goes through `_inbox`, not the worker's result: a finished worker sits in
            # reference cycles that only the cyclic collector frees, and would keep a whole
            # refresh (a thousand nodes' views) alive with it.
            data = collect(
                services,
                health,
                reasons=reasons,
                placement=placement,
                event_filter=event_filter,
                history=history,
            )
            gpu_history.record(data.snapshot.nodes)
            self._inbox = data

        self.run_worker(
            poll,
            name="poll",
            group="poll",
            thread=True,
            exit_on_error=False,
        )

    def wants_reasons(self) -> bool:
        """Why queued jobs wait is worked out only while a screen that shows it is open."""
        return any(isinstance(s, QueueScreen | JobScreen) for s in self.screen_stack)

    def _polled(self, data: DashData) -> None:
        self.data = data
        self.generation += 1
        self.polls += 1
        screen = self._dash_screen()
        if screen is not None:
            screen.refresh_view(data)
        self.set_timer(GC_AFTER_S, self.gc.idle)  # once the refresh is on screen

    def _status(self) -> None:
        screen = self._dash_screen()
        if screen is not None:
            screen.render_status()

    def _dash_screen(self) -> DashScreen | None:
        """The dashboard screen on top, or None under a dialog or once the app has closed its
        screens (a worker may finish while the app shuts down)."""
        if not self.screen_stack:
            return None
        screen = self.screen
        return screen if isinstance(screen, DashScreen) else None

    # --- workers ----------------------------------------------------------------------------

    def background(
        self, work: Callable[[], Any], done: Callable[[Any], None], *, name: str = "task"
    ) -> None:
        """Run `work` in a thread; `done(result)` then runs on the UI thread; an error becomes
        a notification."""
        worker = self.run_worker(work, name=name, group=name, thread=True, exit_on_error=False)
        self._callbacks[worker] = done

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state not in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED):
            return
        if not self.screen_stack:  # shutting down: nothing left to show it on
            self._inbox = None
            self._callbacks.pop(worker, None)
            return
        if worker.name == "poll":
            started, self._poll_started = self._poll_started, None
            self.poll_s = None if started is None else time.monotonic() - started
            if self.overdue_s is not None:
                self.overdue_s = None
                self._status()
            data, self._inbox = self._inbox, None
            if event.state is WorkerState.SUCCESS and data is not None:
                self._polled(data)
            elif event.state is WorkerState.ERROR:
                self.notify(f"refresh failed: {describe(worker.error)}", severity="error")
            return
        done = self._callbacks.pop(worker, None)
        if event.state is WorkerState.SUCCESS and done is not None:
            done(worker.result)
        elif event.state is WorkerState.ERROR:
            self.notify(f"{worker.name} failed: {describe(worker.error)}", severity="error")

    # --- navigation -------------------------------------------------------------------------

    def _to_overview(self) -> None:
        while len(self.screen_stack) > 2:  # the default screen, then the overview
            self.pop_screen()

    def goto(self, name: str, arg: str | None = None) -> None:
        """`:nodes`, `:jobs`, `:queue`, `:node NAME`, `:job ID`."""
        self._to_overview()
        if name in ("nodes", "node", "fleet", "overview") and not arg:
            return
        if name == "node" and arg:
            self.push_screen(NodeScreen(arg))
        elif name == "job" and arg:
            self.push_screen(JobScreen(arg))
        elif name == "jobs":
            self.push_screen(JobsScreen())
        elif name == "queue":
            self.push_screen(QueueScreen())
        self._reasons_now()

    def _reasons_now(self) -> None:
        """A screen that shows why jobs wait just opened: poll now rather than at the next tick."""
        if self.wants_reasons() and self.data is not None and not self.data.reasons:
            self.action_refresh()

    def on_open_node(self, message: OpenNode) -> None:
        self.push_screen(NodeScreen(message.name))

    def on_open_job(self, message: OpenJob) -> None:
        self.push_screen(JobScreen(message.job_id))
        self._reasons_now()

    def action_command(self) -> None:
        hint = "nodes | queue | jobs | node NAME | job ID | events KINDS"
        self.push_screen(PromptScreen(":", placeholder=hint), self.run_command)

    def run_command(self, line: str | None) -> None:
        words = (line or "").strip().lstrip(":").split()
        if not words:
            return
        cmd, arg = words[0].lower(), (words[1] if len(words) > 1 else None)
        if cmd in ("q", "quit", "exit"):
            self.exit()
        elif cmd in ("nodes", "node", "fleet", "overview", "jobs", "job", "queue"):
            if cmd == "job" and not arg:
                self.notify(":job needs a job id", severity="warning")
                return
            self.goto(cmd, arg)
        elif cmd == "events":
            try:
                wanted = parse_event_filter(" ".join(words[1:]))
            except GpuctlError as exc:
                self.notify(f"{exc.message} ({exc.hint})", severity="warning")
                return
            self.goto("nodes")
            self.filter_events(wanted)
        elif cmd == "help":
            self.action_help()
        else:
            self.notify(
                f"unknown command :{cmd} (try :nodes, :queue, :jobs, :node NAME, :job ID, "
                ":events KINDS)",
                severity="warning",
            )

    def filter_events(self, wanted: EventFilter) -> None:
        """List only the events `wanted` keeps, from the next poll (asked for now)."""
        self.event_filter = wanted
        self.action_refresh()

    def on_toggle_checkpoints(self, message: ToggleCheckpoints) -> None:
        """The `e` key: hide checkpoint events, or show every event again."""
        self.filter_events(ALL_EVENTS if self.event_filter.active else NO_CHECKPOINTS)

    def on_next_history_window(self, message: NextHistoryWindow) -> None:
        """The `h` key: the sparklines over the next window, read from the store now."""
        window = next_history_window(self.history.wanted)
        self.history.want(window)
        self.notify(f"history: the last {window}")
        self.action_refresh()

    def action_help(self) -> None:
        screen = self._dash_screen()
        if screen is not None:
            self.push_screen(HelpScreen(screen.heading(), screen.KEYS))

    # --- actions ------------------------------------------------------------------------------

    def on_action_requested(self, message: ActionRequested) -> None:
        self.request_action(message.action, message.target)

    def request_action(self, action: str, target: str | None) -> None:
        actions = self.services.actions
        if self.readonly or actions is None:
            self.notify("read-only: actions are disabled", severity="warning")
            return
        what = f"{action} {target}" if target else action
        if actions.needs_reason(action):

            def reason_given(reason: str | None) -> None:
                if reason is not None:
                    self._plan(action, target, reason)

            self.push_screen(PromptScreen(f"reason to {what}:", placeholder="why"), reason_given)
        else:
            self._plan(action, target, None)

    def _plan(self, action: str, target: str | None, reason: str | None) -> None:
        actions = self.services.actions
        assert actions is not None
        self.background(
            lambda: actions.plan(action, target, reason=reason), self._confirm, name="plan"
        )

    def _confirm(self, plan: ActionPlan) -> None:
        def answered(yes: bool | None) -> None:
            if yes and plan.applicable:
                self._apply(plan)

        self.push_screen(ConfirmDialog(plan), answered)

    def _apply(self, plan: ActionPlan) -> None:
        actions = self.services.actions
        assert actions is not None

        def progress(line: str) -> None:  # from the worker thread
            self.call_from_thread(self.notify, fmt.safe(line))

        def done(said: str) -> None:
            self.notify(fmt.safe(said))
            self.action_refresh()

        self.background(lambda: actions.apply(plan, progress), done, name=plan.action)
