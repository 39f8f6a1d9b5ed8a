"""`gpuctl place` and `gpuctl consolidate` plans for people: their tables laid out at the
terminal's width (`table_fit`: job and node names whole), the lines around them folded at it
between words (never inside a name), each list of nodes folded as a hostlist (`gpu[01-04,07]`).
Piped, the lines are left as they are and the tables are 200 columns wide."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TextIO

from rich.console import Console

from gpuctl.cli.render import safe
from gpuctl.cli.table_fit import FREE, KEY, Col, FitTable
from gpuctl.config.hostlist import fold

if TYPE_CHECKING:
    from gpuctl.core.consolidation import ConsolidationPlan
    from gpuctl.core.placement.plan import Plan

PIPED_WIDTH = 200

# Job and node names whole; when too narrow SCORE goes first, then PRIORITY, TIER, RUNNER-UP…
PLACE_COLUMNS = (
    Col("JOB", KEY),
    Col("TIER", drop=4),
    Col("PRIORITY", drop=5),
    Col("NODE", KEY),
    Col("CARDS", drop=1),
    Col("MEM/CARD", drop=2),
    Col("SCORE", drop=6),
    Col("RUNNER-UP", drop=3),
)
PLACE_WIDE = (Col("SHAPE", drop=7), Col("CARD UUIDS", FREE, drop=8))
# FROM and TO fold between the node and its cards, never inside the node's name
MOVE_COLUMNS = (
    Col("JOB", KEY),
    Col("TIER", drop=3),
    Col("FROM", FREE, whole_words=True),
    Col("TO", FREE, whole_words=True),
    Col("MEM/CARD", drop=2),
    Col("CHECKPOINT AGE", drop=1),
)


def nodes_text(names: Sequence[str]) -> str:
    """A list of node names for people: one hostlist (`gpu[01-04,07]`)."""
    return fold(names)


def placement_table(plan: Plan, *, wide: bool = False) -> FitTable:
    from gpuctl.core.placement.render import placement_rows

    _, rows = placement_rows(plan, wide=wide)
    return _table([*PLACE_COLUMNS, *PLACE_WIDE] if wide else PLACE_COLUMNS, rows)


def consolidation_table(plan: ConsolidationPlan) -> FitTable:
    from gpuctl.core.consolidation import consolidation_rows

    _, rows = consolidation_rows(plan)
    return _table(MOVE_COLUMNS, rows)


def placement_text(
    plan: Plan, *, explain: bool, wide: bool, width: int | None, color: bool = False
) -> str:
    """The plan as people read it at `width` columns (None: piped, lines as they are); `color`:
    the terminal's bold headers."""
    from gpuctl.core.placement.render import placement_footer, placement_header

    footer = placement_footer(plan, explain=explain, fold=nodes_text)
    return (
        fold_lines([placement_header(plan)], width)
        + render(placement_table(plan, wide=wide), width, color=color)
        + fold_lines(footer, width)
    )


def consolidation_text(plan: ConsolidationPlan, width: int | None, color: bool = False) -> str:
    from gpuctl.core.consolidation import consolidation_footer, consolidation_header

    out = fold_lines([consolidation_header(plan)], width)
    if plan.moves:
        out += render(consolidation_table(plan), width, color=color)
        out += fold_lines([*_moved_nodes(plan), ""], width)
    return out + fold_lines(consolidation_footer(plan), width)


def _moved_nodes(plan: ConsolidationPlan) -> list[str]:
    sources = sorted({m.from_node for m in plan.moves})
    targets = sorted({m.to_node for m in plan.moves})
    return [f"moves jobs off {nodes_text(sources)} onto {nodes_text(targets)}"]


def width_of(stream: TextIO) -> int | None:
    """The terminal's width when `stream` is one; None when piped."""
    if not stream.isatty():
        return None
    return Console(file=stream).width


def render(table: FitTable, width: int | None, *, color: bool = False) -> str:
    """The table as text at `width` columns (None: piped, 200), without trailing blanks."""
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width or PIPED_WIDTH,
        highlight=False,
        force_terminal=color,
        color_system="auto" if color else None,
    )
    console.print(table, crop=False)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def fold_lines(lines: Iterable[str], width: int | None) -> str:
    """Lines folded at `width` between words, each continuation indented two more than its
    line; names (no spaces) are never cut. None: the lines as they are."""
    out = []
    for line in lines:
        if width is None or len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        out.append(
            textwrap.fill(
                line,
                width,
                subsequent_indent=indent,
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return safe("\n".join(out)) + "\n"


def _table(cols: Sequence[Col], rows: Sequence[Sequence[str]]) -> FitTable:
    table = FitTable(cols)
    for row in rows:
        table.add_row(*(safe(cell) for cell in row))
    return table
