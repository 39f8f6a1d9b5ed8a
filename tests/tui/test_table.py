"""KeyedTable.sync_lazy: a thousand-row table formats only what is (nearly) on screen, and a row
scrolled into view shows its newest cells, never stale ones."""

from __future__ import annotations

from textual.app import App, ComposeResult

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
