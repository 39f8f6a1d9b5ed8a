"""KeyedTable.sync_lazy: a thousand-row table formats only what is (nearly) on screen, and a row
scrolled into view shows its newest cells, never stale ones."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from gpuctl.tui.format import Cell
from gpuctl.tui.widgets.table import KeyedTable

ROWS = 1000
COLUMNS = (("name", "NAME"), ("value", "VALUE"))


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        yield KeyedTable(COLUMNS, id="t")


def keys() -> list[str]:
    return [f"node-{i:04d}" for i in range(ROWS)]


def cells_for(generation: int, asked: list[str]) -> object:
    def cells(key: str) -> tuple[Cell, ...]:
        asked.append(key)
        return (Cell.of(key), Cell.of(f"v{generation}"))

    return cells


def value_on_screen(table: KeyedTable, key: str) -> str:
    """What the table renders for the row's value cell (its data, not the formatter)."""
    cell = table.get_row(key)[1]
    assert isinstance(cell, Cell)
    return cell.plain


async def test_only_rows_near_the_screen_are_formatted_and_scrolling_shows_the_newest() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 30)) as pilot:
        table = app.query_one(KeyedTable)
        asked: list[str] = []
        table.sync_lazy(keys(), cells_for(1, asked))  # type: ignore[arg-type]
        await pilot.pause()
        assert 0 < len(asked) < 150  # a screen of 30 rows and its margins, not 1,000
        assert value_on_screen(table, "node-0000") == "v1"

        asked.clear()
        table.sync_lazy(keys(), cells_for(2, asked))  # type: ignore[arg-type]
        await pilot.pause()
        assert 0 < len(asked) < 150
        assert value_on_screen(table, "node-0000") == "v2"
        assert table.rebuilds == 1  # same keys: updated in place

        table.move_cursor(row=ROWS - 1, animate=False)  # the last row scrolls into view
        await pilot.pause()
        assert table.scroll_y > 900
        assert table.cursor_key() == "node-0999"
        assert value_on_screen(table, "node-0999") == "v2"
        assert value_on_screen(table, "node-0980") == "v2"
        assert len(asked) < 400  # the top and the bottom, not every row


async def test_reading_a_row_that_was_never_on_screen_formats_it() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 30)) as pilot:
        table = app.query_one(KeyedTable)
        asked: list[str] = []
        table.sync_lazy(keys(), cells_for(3, asked))  # type: ignore[arg-type]
        await pilot.pause()
        assert "node-0500" not in asked
        assert table.shown("node-0500") == ("node-0500", "v3")


async def test_a_plain_sync_after_a_lazy_one_leaves_nothing_pending() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 30)) as pilot:
        table = app.query_one(KeyedTable)
        table.sync_lazy(keys(), cells_for(4, []))  # type: ignore[arg-type]
        await pilot.pause()
        table.sync([("a", (Cell.of("a"), Cell.of("x")))])
        await pilot.pause()
        assert table.keys == ("a",)
        assert table.shown("a") == ("a", "x")


def _by_position(lines: list[list[Segment]]) -> list[list[tuple[str, Style | None]]]:
    """Each line as (character, style) per position: how the segments are split does not
    matter on screen, what each cell of the terminal shows does."""
    return [[(ch, seg.style) for seg in line for ch in seg.text] for line in lines]


async def test_cells_are_drawn_exactly_as_textual_draws_them() -> None:
    cells = [
        Cell.of("node-0001"),
        Cell.of("ready", "green"),
        Cell((("█", "green"), ("▒", "cyan"), ("·", "grey50"))),
        Cell.of("a note far longer than its column is wide, cut at the edge", "bold red"),
        Cell(()),
        Cell((("GPU ", ""), ("日本", "magenta"), ("x", "bold"))),
    ]
    app = TableApp()
    async with app.run_test(size=(70, 12)) as pilot:
        table = app.query_one(KeyedTable)
        table.sync([(f"r{i}", (cell, Cell.of(str(i)))) for i, cell in enumerate(cells)])
        await pilot.pause()
        style = table.rich_style
        for row in range(len(cells)):
            for col in range(2):
                full = table.ordered_columns[col].get_render_width(table)
                for width in (full, 12, 3):  # 12 and 3: narrower than the long cells
                    for cursor in (False, True):
                        ours = table._render_cell(row, col, style, width, cursor)
                        table._cell_render_cache.clear()  # textual keys it without the width
                        textual = DataTable._render_cell(table, row, col, style, width, cursor)
                        where = (row, col, width, cursor)
                        assert _by_position(ours) == _by_position(textual), where


def rows_of(keys: list[str], tag: str = "") -> list[tuple[str, tuple[Cell, ...]]]:
    return [(k, (Cell.of(k), Cell.of(f"{k}{tag}"))) for k in keys]


def on_screen(table: KeyedTable) -> list[tuple[str, str]]:
    """Each row as the table shows it, top to bottom."""
    out = []
    for i in range(table.row_count):
        cells = table.get_row_at(i)
        out.append(tuple(c.plain for c in cells))
    return out  # type: ignore[return-value]


async def test_rows_that_come_and_go_land_in_order_and_the_cursor_stays_on_its_row() -> None:
    app = TableApp()
    async with app.run_test(size=(60, 30)) as pilot:
        table = app.query_one(KeyedTable)
        before = [f"r{i}" for i in range(20)]
        table.sync(rows_of(before))
        await pilot.pause()
        table.move_cursor(row=10, animate=False)
        assert table.cursor_key() == "r10"
        # an alert raised at the top, one in the middle, two cleared, the rest updated
        after = ["new0", *before[:5], "new1", *before[7:]]
        table.sync(rows_of(after, "!"))
        await pilot.pause()
        assert table.keys == tuple(after)
        assert on_screen(table) == [(k, f"{k}!") for k in after]
        assert table.cursor_key() == "r10"
        # the cursor's own row cleared: the cursor stays where it was on screen
        row = table.cursor_row
        table.sync(rows_of([k for k in after if k != "r10"]))
        await pilot.pause()
        assert "r10" not in table.keys
        assert table.cursor_row == row
        table.sync(rows_of(after))
        await pilot.pause()
        table.move_cursor(row=after.index("r10"), animate=False)
        # mostly new rows: rebuilt, still in order
        fresh = [f"x{i}" for i in range(15)] + ["r10"]
        table.sync(rows_of(fresh))
        await pilot.pause()
        assert on_screen(table) == [(k, k) for k in fresh]
        assert table.cursor_key() == "r10"
