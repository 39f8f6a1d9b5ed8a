"""A DataTable of keyed rows, updated in place: the operator's cursor stays on its row."""

from __future__ import annotations

from collections.abc import Sequence

from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from gpuctl.tui.format import Cell

Row = tuple[str, tuple[Cell, ...]]


class KeyedTable(DataTable[Cell]):
    """`sync(rows)` makes the table show `rows`. When the keys are the same as before (the usual
    refresh), only cells that changed are updated; when rows come or go (a filter, a new node),
    the table is rebuilt and the cursor put back on the row it was on."""

    def __init__(self, columns: Sequence[tuple[str, str]], **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._columns = tuple(columns)
        self._shown: dict[str, tuple[Cell, ...]] = {}
        self._keys: list[str] = []
        self.rebuilds = 0  # how often rows came or went (tests: in-place updates do not rebuild)
        for key, label in self._columns:
            self.add_column(label, key=key)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def cursor_key(self) -> str | None:
        if not self._keys or not 0 <= self.cursor_row < len(self._keys):
            return None
        return self._keys[self.cursor_row]

    def shown(self, key: str) -> tuple[str, ...]:
        """The plain text of a row's cells."""
        return tuple(c.plain for c in self._shown[key])

    def sync(self, rows: Sequence[Row]) -> None:
        keys = [k for k, _ in rows]
        if keys != self._keys:
            self._rebuild(rows)
            return
        changed: list[tuple[str, str, Cell]] = []
        for key, cells in rows:
            old = self._shown[key]
            if cells == old:
                continue
            for (col, _), new, was in zip(self._columns, cells, old, strict=True):
                if new != was:
                    changed.append((key, col, new))
            self._shown[key] = cells
        if changed:
            self._update_cells(changed)

    def _update_cells(self, changed: Sequence[tuple[str, str, Cell]]) -> None:
        """Put new values in cells, widening columns as needed, then refresh once.

        `DataTable.update_cell` refreshes the widget at every call (about 15 µs each: a fleet of
        1,000 nodes changes thousands of cells per poll); with textual pinned (8.2.8), the same
        three steps it takes are done here once per batch. Without those internals, the public
        call is used.
        """
        data = getattr(self, "_data", None)
        for key, col, new in changed:
            column = self.columns[ColumnKey(col)]
            if new.cell_len > column.content_width:
                column.content_width = new.cell_len
            if data is None:
                self.update_cell(key, col, new)
            else:
                data[RowKey(key)][ColumnKey(col)] = new
        if data is not None:
            self._update_count += 1
            self.refresh()

    def _rebuild(self, rows: Sequence[Row]) -> None:
        at = self.cursor_key()
        row_before = self.cursor_row
        self.rebuilds += 1
        self.clear()
        # Widths are set before the rows go in: the table caches rendered rows by its update
        # count only, so widths it measured later would not reach rows already rendered.
        for i, (col, label) in enumerate(self._columns):
            column = self.columns[ColumnKey(col)]
            widest = max((cells[i].cell_len for _, cells in rows), default=0)
            column.content_width = max(len(label), widest)
        self._shown = {}
        self._keys = []
        for key, cells in rows:
            self.add_row(*cells, key=key)
            self._shown[key] = cells
            self._keys.append(key)
        if not self._keys:
            return
        target = self._keys.index(at) if at in self._keys else min(row_before, len(self._keys) - 1)
        self.move_cursor(row=max(0, target), animate=False)
