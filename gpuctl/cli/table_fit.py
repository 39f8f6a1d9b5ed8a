"""Tables that fit the terminal the way kubectl's and k9s's do: names are never cut, free text
(notes, reasons) folds in the width the other columns leave, and under a floor width the
low-priority columns are dropped rather than squeezed (`-o wide` or `-o json` show them all).

A `FitTable` is a rich renderable that lays itself out at the width it is printed at, so the same
table fits a terminal, a pipe (200 columns) or a test's `Console(width=80)`."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table

FREE_MIN = 20  # a free-text column is laid out at least this wide…
FREE_TIGHT = 10  # …or down to this when nothing is left to drop and the table then fits
GAP = 2  # between two columns (rich's padding of one on each side)


class Role(enum.Enum):
    KEY = "key"  # names: whole, on one line, never dropped
    FIXED = "fixed"  # short values: whole, on one line; dropped by `drop` order when too narrow
    FREE = "free"  # free text: folds in the width left, at least FREE_MIN


@dataclass(frozen=True)
class Col:
    header: str
    role: Role = Role.FIXED
    drop: int = 0  # under a floor width the highest goes first; 0: never dropped
    whole_words: bool = False  # free text that folds between words only (`node cards 0,1`)


KEY = Role.KEY
FREE = Role.FREE


def _width(cell: str) -> int:
    return max((cell_len(line) for line in cell.splitlines()), default=0)


@dataclass(frozen=True)
class Layout:
    shown: tuple[int, ...]  # the indexes of the columns kept, in order
    widths: tuple[int, ...]  # their content widths (no padding)

    @property
    def total(self) -> int:
        return sum(self.widths) + GAP * max(0, len(self.widths) - 1)


def layout(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> Layout:
    """Which columns to show and how wide, for a table printed `width` columns wide. Key and
    fixed columns get their longest value; free columns share what is left (at least FREE_MIN,
    at most their longest value); while that does not fit, the column with the highest `drop`
    goes. When nothing is left to drop, free columns shrink to what is left, down to FREE_TIGHT;
    a `whole_words` column never below its longest word. The result can be wider than `width`
    only when the kept columns alone are."""
    natural = [
        max(cell_len(c.header), *(_width(r[i]) for r in rows)) if rows else cell_len(c.header)
        for i, c in enumerate(cols)
    ]
    words = [
        max((cell_len(w) for r in rows for w in r[i].split()), default=0) if c.whole_words else 0
        for i, c in enumerate(cols)
    ]
    shown = list(range(len(cols)))

    def least_of(i: int, least: int) -> int:
        return max(min(natural[i], least), words[i])

    def floor(keep: list[int]) -> int:
        need = sum(least_of(i, FREE_MIN) if cols[i].role is Role.FREE else natural[i] for i in keep)
        return need + GAP * max(0, len(keep) - 1)

    while floor(shown) > width:
        droppable = [i for i in shown if cols[i].drop > 0]
        if not droppable:
            break
        shown.remove(max(droppable, key=lambda i: (cols[i].drop, i)))
    free = [i for i in shown if cols[i].role is Role.FREE]
    fixed = sum(natural[i] for i in shown if i not in free) + GAP * max(0, len(shown) - 1)
    left = width - fixed
    least = FREE_MIN
    if free and floor(shown) > width and left // len(free) >= FREE_TIGHT:
        least = left // len(free)  # nothing left to drop: narrower notes rather than wider
    widths = dict.fromkeys(shown, 0)
    for i in shown:
        if i not in free:
            widths[i] = natural[i]
    for n, i in enumerate(free):  # split what is left evenly, each at least FREE_MIN
        share = max(least_of(i, least), left // (len(free) - n))
        widths[i] = min(natural[i], share)
        left -= widths[i]
    return Layout(tuple(shown), tuple(widths[i] for i in shown))


class FitTable:
    """A table of plain-text cells laid out (`layout`) at the width it is printed at."""

    def __init__(self, cols: Sequence[Col], *, header_style: str = "bold") -> None:
        self.cols = tuple(cols)
        self.rows: list[tuple[str, ...]] = []
        self.header_style = header_style

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.cols):
            raise ValueError(f"{len(cells)} cells for {len(self.cols)} columns")
        self.rows.append(tuple(cells))

    def table(self, width: int) -> Table:
        """The rich table for a width: kept columns at their layout widths."""
        fit = layout(self.cols, self.rows, width)
        table = Table(
            box=None, header_style=self.header_style, pad_edge=False, width=max(1, fit.total)
        )
        for i, w in zip(fit.shown, fit.widths, strict=True):
            col = self.cols[i]
            free = col.role is Role.FREE
            table.add_column(
                col.header, width=max(1, w), no_wrap=not free, overflow="fold" if free else "crop"
            )
        for row in self.rows:
            table.add_row(*(row[i] for i in fit.shown))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        total = layout(self.cols, self.rows, options.max_width).total
        return Measurement(total, total)
