"""`?`: the keys of the current screen, the commands, and how to read the fleet table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpuctl.tui import format as fmt

COMMANDS = (
    (":nodes", "the fleet (overview)"),
    (":queue", "queued jobs and why each waits"),
    (":jobs", "running and held jobs"),
    (":node NAME", "one node"),
    (":job ID", "one job, with its log tail"),
    (":events KINDS", "list only these events (drain,failover), or all but some (-checkpoint)"),
    (":events", "list every event again"),
    (":q", "quit"),
)
GLOBAL_KEYS = (
    ("?", "this help"),
    ("/", "filter the rows of this screen"),
    (":", "command (see below)"),
    ("enter", "drill down"),
    ("esc", "back (or clear the filter)"),
    ("r", "refresh now"),
    ("q", "quit"),
)


def legend() -> Text:
    text = Text("Memory bars, allocated vs observed:\n", style="bold")
    for glyph, style, words in (
        (fmt.BAR_USED, fmt.BAR_STYLE["used"], "in use, within what gpuctl allocated"),
        (fmt.BAR_ALLOCATED, fmt.BAR_STYLE["allocated"], "allocated, not in use"),
        (fmt.BAR_GHOST, fmt.BAR_STYLE["ghost"], "in use beyond the allocation (ghost, over slice)"),
        (fmt.BAR_FREE, fmt.BAR_STYLE["free"], "free"),
    ):
        text.append(f"  {glyph * 3} ", style=style)
        text.append(words + "\n")
    text.append("PER GPU: one glyph per GPU, its memory in use; ", style="")
    text.append("green", style="green")
    text.append(" allocated, ")
    text.append("red", style="red")
    text.append(" ghost memory, ")
    text.append("yellow", style="yellow")
    text.append(" health warning, ")
    text.append("bold red", style="bold red")
    text.append(" critical, grey free.\n")
    text.append("Utilization band: ")
    for band, words in fmt.BAND_TEXT.items():
        text.append(words, style=fmt.BAND_STYLE[band])
        text.append("  ")
    return text


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, screen_name: str, keys: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.screen_name = screen_name
        self.keys = tuple(keys)

    def compose(self) -> ComposeResult:
        text = Text(f"gpuctl dash · {self.screen_name}\n\n", style="bold")
        text.append("Keys on this screen:\n", style="bold")
        for key, words in (*self.keys, *GLOBAL_KEYS):
            text.append(f"  {key:<8}", style="cyan")
            text.append(f"{words}\n")
        text.append("\nCommands (:):\n", style="bold")
        for cmd, words in COMMANDS:
            text.append(f"  {cmd:<12}", style="cyan")
            text.append(f"{words}\n")
        text.append("\n")
        text.append_text(legend())
        with VerticalScroll(id="help"):
            yield Static(text, id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)
