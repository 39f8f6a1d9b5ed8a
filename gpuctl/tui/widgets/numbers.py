"""The five numbers (and the preemption rate), each with its history as a sparkline: the chosen
window's points (`ops.dashboard.HistoryView`, from the store's history) drawn whole, or without a
stored history the last refreshes."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.ops.dashboard import HistoryView
from gpuctl.tui import format as fmt

SPARK_POINTS = 60
PERCENT_KEYS = frozenset({"utilization", "fragmentation", "failover"})


class NumberCard(Static):
    """One number: title, headline (coloured by band where it has one), detail, sparkline."""

    def __init__(self, key: str, title: str) -> None:
        super().__init__(id=f"num-{key}", classes="number")
        self.key = key
        self.title = title
        self.history: deque[float | None] = deque(maxlen=SPARK_POINTS)
        self.points: list[float | None] = []  # what the sparkline draws
        self.window = False  # the points are a window's, drawn whole (else the last ones)
        self.headline = fmt.NA
        self.detail = ""
        self._rendered: Text | None = None
        self._headline: Text | None = None

    @property
    def shown_title(self) -> str:
        """The title at the card's width: whole, or short when the card is narrow."""
        return fmt.card_title(self.key, self.title, self.content_size.width or len(self.title))

    def show(
        self,
        headline: Text,
        detail: str,
        value: float | None,
        points: Sequence[float | None] | None = None,
    ) -> None:
        """`points`: the window's history to draw whole; None: the values shown so far."""
        self.history.append(value)
        self.window = points is not None
        self.points = list(points) if points is not None else list(self.history)
        self.headline, self.detail, self._headline = headline.plain, detail, headline
        self._render_card()

    def on_resize(self) -> None:
        if self._headline is not None:
            self._render_card()

    def _render_card(self) -> None:
        width = max(8, self.content_size.width or 24)
        headline = fmt.card_headline(self._headline or Text(fmt.NA), self.content_size.width or 24)
        lo, hi = (0.0, 100.0) if self.key in PERCENT_KEYS else (0.0, None)
        points = fmt.squeeze(self.points, width) if self.window else self.points
        spark = fmt.sparkline(points, width, lo=lo, hi=hi)
        body = Text(self.shown_title, style="dim")
        body.append("\n")
        body.append_text(headline)
        body.append("\n")
        body.append(self.detail, style="dim")
        body.append("\n")
        body.append(spark, style="cyan")
        if body != self._rendered:
            self._rendered = body
            self.update(body)


class NumbersPanel(Horizontal):
    def compose(self) -> ComposeResult:
        for key, title in fmt.NUMBER_KEYS:
            yield NumberCard(key, title)

    def show(self, numbers: FleetNumbers, history: HistoryView | None = None) -> None:
        cards = fmt.number_cards(numbers)
        values = fmt.number_values(numbers)
        stored = history is not None and history.stored
        for card in self.query(NumberCard):
            headline, detail = cards[card.key]
            points = history.series(fmt.NUMBER_SERIES[card.key]) if history is not None else None
            card.show(headline, detail, values[card.key], points if stored else None)

    def shown(self) -> dict[str, str]:
        """Each number's headline as the operator reads it."""
        return {card.key: card.headline for card in self.query(NumberCard)}
