"""What every dashboard screen shares: a status line, a body, the footer with this screen's keys;
`show(data)` after every refresh; `/` filter and `esc` back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol, runtime_checkable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from gpuctl.ops.dashboard import DashData, GpuHistory, Services
from gpuctl.tui import format as fmt
from gpuctl.tui.widgets.prompt import PromptScreen


@runtime_checkable
class Dash(Protocol):
    """What a screen reads of its app (`gpuctl.tui.app.DashApp` is one): the dashboard's services,
    newest data and polling, and a way to run work off the UI thread. Screens import this, not the
    app, which imports them."""

    services: Services
    data: DashData | None
    generation: int  # data versions shown (screens compare it on resume)
    offset_s: float  # the local clock's offset from UTC, for times shown
    readonly: bool
    refresh_s: float  # seconds between polls
    overdue_s: float | None  # how long the running poll is past its deadline
    gpu_history: GpuHistory  # each GPU's last polls

    def background(
        self, work: Callable[[], Any], done: Callable[[Any], None], *, name: str = "task"
    ) -> None: ...


ACTIONS = ("cordon", "uncordon", "drain", "consolidate", "cancel", "kill")


class DashScreen(Screen[None]):
    NAME = "screen"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", key_display="/", priority=True),  # see `:` (app)
        Binding("escape", "back", "Back", key_display="esc"),
    ]
    KEYS: ClassVar[tuple[tuple[str, str], ...]] = ()  # this screen's own keys, for `?`

    def __init__(self) -> None:
        super().__init__()
        self.filter = ""
        self.shown_generation = -1

    @property
    def dash(self) -> Dash:
        app = self.app
        assert isinstance(app, Dash)
        return app

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> Iterator[Widget]:
        return iter(())

    def on_mount(self) -> None:
        self.render_status()
        data = self.dash.data
        if data is not None:
            self.refresh_view(data)

    def on_screen_resume(self) -> None:
        data = self.dash.data
        if data is not None and self.shown_generation != self.dash.generation:
            self.refresh_view(data)
        self.render_status()

    def refresh_view(self, data: DashData) -> None:
        self.shown_generation = self.dash.generation
        self.show(data)
        self.render_status()

    def show(self, data: DashData) -> None:
        """Render `data` (subclasses)."""

    def heading(self) -> str:
        return self.NAME

    def render_status(self) -> None:
        app = self.dash
        text = Text("gpuctl dash", style="bold")
        text.append(f" · {self.heading()}")
        data = app.data
        if data is not None:
            text.append(f" · {fmt.safe(data.source)} · {len(data.nodes)} node(s)")
            text.append(f" · at {fmt.clock_hms(data.now, app.offset_s)}")
            if data.history is not None:
                text.append(f" · {data.history.label}")
        else:
            text.append(" · waiting for the first poll")
        text.append(f" · every {app.refresh_s:g}s")
        if app.overdue_s is not None:
            text.append(f" · poll overdue {app.overdue_s:.0f}s", style="bold red")
        if app.readonly:
            text.append(" · read-only", style="yellow")
        if self.filter:
            text.append(f" · filter /{self.filter}", style="cyan")
        self.query_one("#status", Static).update(text)

    # --- keys ---------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # False: hidden from the footer, and the key does nothing
        return not (action in ACTIONS and self.dash.readonly)

    def action_filter(self) -> None:
        def done(value: str | None) -> None:
            if value is not None:
                self.set_filter(value.strip())

        self.app.push_screen(PromptScreen("/", value=self.filter, placeholder="filter"), done)

    def set_filter(self, needle: str) -> None:
        self.filter = needle
        if self.dash.data is not None:
            self.refresh_view(self.dash.data)
        self.render_status()

    def action_back(self) -> None:
        if self.filter:
            self.set_filter("")
        elif len(self.app.screen_stack) > 2:  # the default screen, then the overview
            self.app.pop_screen()
