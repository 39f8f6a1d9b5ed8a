"""Pure formatting for the dashboard: numbers, durations, bars, sparklines, colours by band.

No textual, no I/O, no clock: values in, `str`, `Cell` or `rich.text.Text` out. `--once` renders
with the same functions, so the dashboard and its text output always agree.

Table cells are `Cell` values (plain pieces with a style each): cheap to build and compare for
thousands of rows per refresh, and turned into a rich `Text` only when a row is on screen.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from rich.cells import cell_len
from rich.text import Span, Text

from gpuctl.core import timefmt
from gpuctl.core.band import TARGET_BAND, BandName
from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.timefmt import duration as duration  # re-exported for the rows

NA = "N/A"
SPARKS = "▁▂▃▄▅▆▇█"
LEVELS = "·▁▂▃▄▅▆▇█"

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)

BAND_STYLE = {"idle": "yellow", "low": "bright_yellow", "target": "green", "over": "bold red"}
BAND_TEXT = {b.value: TARGET_BAND.words(b) for b in BandName}
STATE_STYLE = {
    "ready": "green",
    "cordoned": "yellow",
    "draining": "bold yellow",
    "down": "bold red",
    "unknown": "magenta",
}
SEVERITY_BADGE = {
    "ok": ("ok", "green"),
    "warn": ("warn", "yellow"),
    "critical": ("crit", "bold red"),
    "unknown": ("unkn", "magenta"),
}
# memory bar glyphs: in use within the allocation, allocated but unused, in use beyond the
# allocation (ghost or over-slice), free
BAR_USED, BAR_ALLOCATED, BAR_GHOST, BAR_FREE = "█", "▒", "▓", "·"
BAR_STYLE = {"used": "green", "allocated": "cyan", "ghost": "bold red", "free": "grey50"}


@dataclasses.dataclass(frozen=True, slots=True)
class Cell:
    """A table cell: pieces of text (already made safe) with a style each; a rich renderable."""

    parts: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, text: str, style: str = "") -> Cell:
        return cls(((text, style),))

    @property
    def plain(self) -> str:
        return "".join(piece for piece, _ in self.parts)

    @property
    def cell_len(self) -> int:
        text = self.plain
        return len(text) if text.isascii() else cell_len(text)

    def text(self) -> Text:
        return segments(self.parts)

    def __rich__(self) -> Text:
        return self.text()


DASH = Cell.of("-", "grey50")


def safe(text: object) -> str:
    """Node and store text is untrusted: strip terminal escape sequences and control characters."""
    return _ESCAPES.sub("", str(text))


def plain(text: object, style: str = "") -> Cell:
    """Untrusted text as a cell (escape sequences stripped; never parsed as markup)."""
    return Cell.of(safe(text), style)


def pct(value: float | None, digits: int = 0) -> str:
    return NA if value is None else f"{value:.{digits}f}%"


def gib(mib: float | None, digits: int = 1) -> str:
    return NA if mib is None else f"{mib / 1024:.{digits}f}"


def clock_hms(epoch_s: float | None, offset_s: float = 0.0) -> str:
    """HH:MM:SS of an epoch time at `offset_s` east of UTC (the caller's local offset)."""
    return timefmt.clock(epoch_s, int(offset_s))


# --- sparklines and bars -------------------------------------------------------------------------


def sparkline(
    values: Sequence[float | None],
    width: int,
    *,
    lo: float | None = None,
    hi: float | None = None,
) -> str:
    """The last `width` values as ▁..█; a gap (space) for None. Scaled to [lo, hi] when given,
    else to the values' own range (a flat series sits at the bottom)."""
    tail = list(values)[-width:] if width > 0 else []
    known = [v for v in tail if v is not None]
    if not known:
        return " " * len(tail)
    low = min(known) if lo is None else lo
    high = max(known) if hi is None else hi
    span = high - low
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
            continue
        x = 0.0 if span <= 0 else (min(max(v, low), high) - low) / span
        out.append(SPARKS[min(len(SPARKS) - 1, int(x * (len(SPARKS) - 1) + 0.5))])
    return "".join(out)


def squeeze(values: Sequence[float | None], width: int) -> list[float | None]:
    """`values` in at most `width` points, neighbours averaged (a gap only where all were): a
    window's history drawn whole in a narrow sparkline."""
    n = len(values)
    if n <= width or width <= 0:
        return list(values)
    out: list[float | None] = []
    for i in range(width):
        chunk = [v for v in values[i * n // width : (i + 1) * n // width] if v is not None]
        out.append(sum(chunk) / len(chunk) if chunk else None)
    return out


def level(fraction: float | None) -> str:
    """One glyph for a fraction 0..1 (`·` for 0, a full block for 1); `?` for unknown."""
    if fraction is None:
        return "?"
    x = min(max(fraction, 0.0), 1.0)
    if x <= 0:
        return LEVELS[0]
    return LEVELS[max(1, min(len(LEVELS) - 1, round(x * (len(LEVELS) - 1))))]


def mem_bar(allocated_mib: int, used_mib: int | None, total_mib: int | None, width: int) -> Cell:
    """Allocated vs observed memory on one card (or summed over a node), `width` cells:

    `█` green: in use within what gpuctl allocated · `▒` cyan: allocated, not in use ·
    `▓` red: in use beyond the allocation (ghost memory, or a job over its slice) · `·` free.
    """
    if not total_mib or total_mib <= 0:
        return Cell.of("?" * width, "magenta")
    used = 0 if used_mib is None else used_mib
    per = total_mib / width

    def cells(mib: float) -> int:
        return min(width, round(mib / per))

    alloc_cells = cells(min(allocated_mib, total_mib))
    used_cells = cells(min(used, total_mib))
    in_alloc = min(alloc_cells, used_cells)
    idle_alloc = alloc_cells - in_alloc
    ghost = max(0, used_cells - alloc_cells)
    free = max(0, width - in_alloc - idle_alloc - ghost)
    if used_mib is None:
        return Cell.of(BAR_ALLOCATED * alloc_cells + "?" * (width - alloc_cells), "magenta")
    return Cell(
        tuple(
            (piece, style)
            for piece, style in (
                (BAR_USED * in_alloc, BAR_STYLE["used"]),
                (BAR_ALLOCATED * idle_alloc, BAR_STYLE["allocated"]),
                (BAR_GHOST * ghost, BAR_STYLE["ghost"]),
                (BAR_FREE * free, BAR_STYLE["free"]),
            )
            if piece
        )
    )


def segments(parts: Iterable[tuple[str, str]]) -> Text:
    """Styled pieces of trusted text in one `Text`, neighbours of one style merged (fast: no
    per-piece copies or control-code stripping; a dashboard builds thousands per refresh)."""
    plain: list[str] = []
    spans: list[Span] = []
    at = 0
    for piece, style in parts:
        if not piece:
            continue
        end = at + len(piece)
        if spans and spans[-1].style == style and spans[-1].end == at:
            spans[-1] = Span(spans[-1].start, end, style)
        elif style:
            spans.append(Span(at, end, style))
        plain.append(piece)
        at = end
    return Text("".join(plain), spans=spans)


def gpu_strip(cards: Iterable[tuple[float | None, str]]) -> Cell:
    """One glyph per GPU: its observed memory use as a level, in its state's colour."""
    return Cell(tuple((level(fraction), style) for fraction, style in cards))


# --- coloured words ------------------------------------------------------------------------------


def band_text(utilization_pct: float | None, band: str | None) -> Text:
    return Text(pct(utilization_pct), style=BAND_STYLE.get(band or "", "bold"))


def state_text(state: str, reach: str | None = None) -> Cell:
    words = state if reach in (None, "ok") else f"{state} ({reach})"
    return Cell.of(words, STATE_STYLE.get(state, ""))


def badge(severity: str | None) -> Cell:
    if severity is None:
        return DASH
    word, style = SEVERITY_BADGE.get(severity, (severity, ""))
    return Cell.of(word, style)


def temp_text(temp_c: int | None, hot_c: int = 85) -> Cell:
    if temp_c is None:
        return DASH
    return Cell.of(f"{temp_c}C", "bold red" if temp_c >= hot_c else "")


def util_text(util_pct: float | None) -> Cell:
    return DASH if util_pct is None else Cell.of(f"{util_pct:.0f}%")


# --- the numbers ---------------------------------------------------------------------------------

# (key of the panel, title): the five numbers, then the preemption rate
NUMBER_KEYS = (
    ("utilization", "UTILIZATION"),
    ("fragmentation", "FRAGMENTATION"),
    ("queue", "QUEUE WAIT p50"),
    ("checkpoint", "CHECKPOINT AGE max"),
    ("failover", "FAILOVER OK"),
    ("preemption", "PREEMPTIONS"),
)
# The fleet history series (`core.history.FLEET_SERIES`) each card's sparkline follows
NUMBER_SERIES = {
    "utilization": "utilization_pct",
    "fragmentation": "fragmentation_pct",
    "queue": "queue_wait_p50_s",
    "checkpoint": "checkpoint_age_max_s",
    "failover": "failover_success_pct",
    "preemption": "preemptions_per_hour",
}
# What a number card's title shrinks to when the card is too narrow for its title (80 columns)
SHORT_TITLES = {
    "utilization": "ALLOCATED",
    "fragmentation": "FRAG",
    "queue": "QUEUE p50",
    "checkpoint": "CKPT max",
    "failover": "FAILOVER",
    "preemption": "PREEMPT",
}


def card_title(key: str, title: str, width: int) -> str:
    """A number card's title for a card `width` cells wide inside: whole, or its short form."""
    return title if len(title) <= width else SHORT_TITLES.get(key, title)


def card_headline(headline: Text, width: int) -> Text:
    """A number card's headline for a card `width` cells wide inside: whole, or its first words
    that fit (`46%` of `46% allocated`), never a word cut."""
    if headline.cell_len <= width:
        return headline
    cut = headline.plain.rfind(" ", 0, width + 1)
    return headline[:cut] if cut > 0 else headline


def number_values(n: FleetNumbers) -> dict[str, float | None]:
    """The value each sparkline follows (the headline of each number)."""
    j = n.jobs
    return {
        "utilization": n.utilization_pct,
        "fragmentation": n.fragmentation_pct,
        "queue": j.queue_wait_p50_s,
        "checkpoint": j.checkpoint_age_max_s,
        "failover": j.failover_success_pct,
        "preemption": j.preemptions_per_hour,
    }


def number_cards(n: FleetNumbers) -> dict[str, tuple[Text, str]]:
    """Each number as (headline, detail line), from `gpuctl.ops.fleetstatus.numbers`."""
    j = n.jobs
    # the share of GPU memory allocated, its band in words: "46% allocated", "idle silicon, <
    # 50%" (a bare "46% idle" read as "46% of the fleet is idle")
    headline = band_text(n.utilization_pct, n.band)
    headline.append(" allocated", style=BAND_STYLE.get(n.band or "", ""))
    band = "" if n.band is None else TARGET_BAND.words(BandName(n.band)) + " · "
    stranded = n.stranded_gib
    rate = j.preemptions_per_hour
    spot = j.spot_preempted_pct
    return {
        "utilization": (
            headline,
            f"{band}SM {pct(n.observed_util_pct)}"
            f" · {gib(n.allocated_mib, 0)}/{gib(n.capacity_mib, 0)} GiB",
        ),
        "fragmentation": (
            Text(pct(n.fragmentation_pct), style="bold"),
            "not measured yet" if stranded is None else f"{stranded:.1f} GiB stranded",
        ),
        "queue": (
            Text(duration(j.queue_wait_p50_s), style="bold"),
            f"p95 {duration(j.queue_wait_p95_s)} · {j.queue_waiting} waiting"
            f", oldest {duration(j.queue_oldest_wait_s)}",
        ),
        "checkpoint": (
            Text(duration(j.checkpoint_age_max_s), style="bold"),
            f"p95 {duration(j.checkpoint_age_p95_s)} · {j.checkpoint_running_jobs} running",
        ),
        "failover": (
            Text(pct(j.failover_success_pct), style="bold"),
            f"{j.failovers_succeeded} of {j.failovers_attempted} · {j.failovers_pending} pending"
            f" · {j.drain_moves} drained",
        ),
        "preemption": (
            Text(NA if rate is None else f"{rate:.2f}/h", style="bold"),
            "spot: " + (NA if spot is None else f"{spot:.0f}% preempted"),
        ),
    }


def numbers_text(n: FleetNumbers) -> str:
    """The numbers as lines of text (`gpuctl dash --once`)."""
    cards = number_cards(n)
    width = max(len(title) for _, title in NUMBER_KEYS)
    lines = []
    for key, title in NUMBER_KEYS:
        head, detail = cards[key]
        lines.append(f"{title:<{width}}  {head.plain:<12} {detail}")
    return "\n".join(lines)


def table_text(head: Sequence[str], rows: Sequence[Sequence[Cell | str]]) -> str:
    """A plain-text table: columns padded to their widest cell, trailing blanks stripped."""
    cells = [[c if isinstance(c, str) else c.plain for c in row] for row in rows]
    widths = [len(h) for h in head]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    for row in cells:
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(out)


def safe_lines(text: str) -> list[str]:
    """Untrusted multi-line text (a job's log) as lines without escape sequences."""
    return [safe(line) for line in text.splitlines()]
