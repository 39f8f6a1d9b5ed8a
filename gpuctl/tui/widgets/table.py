"""A DataTable of keyed rows, updated in place: the operator's cursor stays on its row."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.segment import Segment
from rich.style import Style
from textual.cache import LRUCache
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

try:  # textual's own map of row keys to positions (pinned): reordering without a rebuild
    from textual._two_way_dict import TwoWayDict
except ImportError:  # pragma: no cover - another textual: rows that come or go rebuild
    TwoWayDict = None  # type: ignore[assignment,misc]

from gpuctl.tui.format import Cell

Cells = tuple[Cell, ...]
Row = tuple[str, Cells]
WINDOW_MARGIN = 1.0  # rows worked out beyond the visible ones, in screens (above and below)
UNSIZED_ROWS = 100  # rows worked out before the table has a size
CELL_CACHE = 1024  # rendered cells kept per generation, two kept (a screen: ~600 cells)
LINE_CACHE = 400  # textual's row, line and cell caches (1,000 to 10,000 each): a few screens


class KeyedTable(DataTable[Cell]):
    """`sync(rows)` makes the table show `rows`. When the keys are the same as before (the usual
    refresh), only cells that changed are updated; when rows come or go (a filter, a new node),
    the table is rebuilt and the cursor put back on the row it was on.

    `sync_lazy(keys, cells_of)` does the same for a large table whose rows cost something to
    format (the fleet: a thousand nodes): only the rows on screen, and a screen's worth above and
    below, are formatted at once; the others when they scroll into view, or when read."""

    def __init__(self, columns: Sequence[tuple[str, str]], **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._columns = tuple(columns)
        self._shown: dict[str, tuple[Cell, ...]] = {}
        self._keys: list[str] = []
        self.rebuilds = 0  # how often rows came or went (tests: in-place updates do not rebuild)
        self.formatted = 0  # rows formatted by `sync_lazy` so far (tests, benchmarks)
        self._pending: set[str] = set()  # rows whose newest cells are not formatted yet
        self._cells_of: Callable[[str], Cells] | None = None
        self._rendered: dict[object, list[list[Segment]]] = {}
        self._rendered_before: dict[object, list[list[Segment]]] = {}
        # textual keys these by the table's update count, which moves at every refresh: the
        # entries of earlier refreshes are never read again, only kept (and walked by the
        # garbage collector). A few screens' worth is all they ever serve.
        # The header's cells go through textual's cell cache (10,000 entries, each refresh adds
        # a row of them): kept to the same few screens, it no longer grows for hours.
        for name in (
            "_row_render_cache",
            "_row_renderable_cache",
            "_line_cache",
            "_cell_render_cache",
        ):
            if isinstance(getattr(self, name, None), LRUCache):
                setattr(self, name, LRUCache(LINE_CACHE))
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
        """The plain text of a row's cells (formatted now if it was not yet)."""
        if key in self._pending:
            self._format([key])
        return tuple(c.plain for c in self._shown[key])

    def sync(self, rows: Sequence[Row]) -> None:
        self._pending = set()
        self._cells_of = None
        keys = [k for k, _ in rows]
        if keys != self._keys:
            self._rebuild(rows)
            return
        self._apply(rows)

    def sync_lazy(self, keys: Sequence[str], cells_of: Callable[[str], Cells]) -> None:
        """Show the rows `keys`, formatting a row's cells with `cells_of(key)` only when it is
        (nearly) on screen."""
        self._cells_of = cells_of
        window = self._window(len(keys))
        if list(keys) != self._keys:
            blank = tuple(Cell(()) for _ in self._columns)
            now = set(keys[window.start : window.stop])
            self.formatted += len(now)
            self._rebuild(
                [(k, cells_of(k) if k in now else self._shown.get(k, blank)) for k in keys]
            )
            self._pending = set(keys) - now
            return
        self._pending = set(keys)
        self._format(self._keys[window.start : window.stop])

    def _window(self, count: int) -> range:
        """The rows on screen, and a margin above and below."""
        height = self.size.height
        if height <= 0:
            return range(min(count, UNSIZED_ROWS))
        margin = int(height * WINDOW_MARGIN)
        top = int(self.scroll_y)
        return range(max(0, top - margin), min(count, top + height + margin))

    def _format(self, keys: Sequence[str]) -> None:
        cells_of = self._cells_of
        todo = [k for k in keys if k in self._pending]
        if cells_of is None or not todo:
            return
        self._pending.difference_update(todo)
        self.formatted += len(todo)
        self._apply([(k, cells_of(k)) for k in todo])

    def watch_scroll_y(self, old: float, new: float) -> None:
        self._format_window()
        super().watch_scroll_y(old, new)

    def on_resize(self) -> None:
        self._format_window()

    def _format_window(self) -> None:
        if self._pending:
            window = self._window(len(self._keys))
            self._format(self._keys[window.start : window.stop])

    def _apply(self, rows: Sequence[Row]) -> None:
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
        if self._reorder(rows):
            self._put_cursor(at, row_before)
            return
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
        self._put_cursor(at, row_before)

    def _put_cursor(self, at: str | None, row_before: int) -> None:
        if not self._keys:
            return
        target = self._keys.index(at) if at in self._keys else min(row_before, len(self._keys) - 1)
        self.move_cursor(row=max(0, target), animate=False)

    def _reorder(self, rows: Sequence[Row]) -> bool:
        """A few rows came or went (an alert raised or cleared): remove those gone, append those
        new, update the rest in place and put all in the new order, rather than rebuilding every
        row. False (rebuild) when most rows are new, or without textual's internals."""
        if TwoWayDict is None or not self._keys or not hasattr(self, "_row_locations"):
            return False
        keys = [k for k, _ in rows]
        old = set(self._keys)
        new = [(k, cells) for k, cells in rows if k not in old]
        gone = old.difference(keys)
        if len(set(keys)) != len(keys) or len(new) + len(gone) > len(keys) // 2:
            return False
        # Gone rows go at once (textual's remove_row re-indexes every row at each call)
        for key in gone:
            del self.rows[RowKey(key)]
            del self._data[RowKey(key)]
            del self._shown[key]
        stayed = [k for k in self._keys if k not in gone]
        self._row_locations = TwoWayDict({RowKey(k): i for i, k in enumerate(stayed)})
        self._require_update_dimensions = True
        self._apply([(k, cells) for k, cells in rows if k in old])
        for key, cells in new:
            for (col, _), cell in zip(self._columns, cells, strict=True):
                column = self.columns[ColumnKey(col)]
                if cell.cell_len > column.content_width:
                    column.content_width = cell.cell_len
            self.add_row(*cells, key=key)
            self._shown[key] = cells
        self._row_locations = TwoWayDict({RowKey(k): i for i, k in enumerate(keys)})
        self._keys = keys
        self._update_count += 1
        self.hover_coordinate = self.hover_coordinate  # within the rows left, as remove_row does
        self.refresh(layout=True)
        return True

    # --- rendering ------------------------------------------------------------------------

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> list[list[Segment]]:
        """A data cell, straight from its styled pieces to one line of segments.

        `DataTable` renders every cell through rich's console (padding, styling, wrapping and
        cropping renderables: ~100 µs a cell), and again for every visible cell whenever any
        cell of the table changed; the fleet table changes at every poll. A `Cell` is one line
        of styled text, so its line is built here directly (the same segments: a test compares
        both) and kept by value: a cell that did not change is not built again. Anything else
        (the header, a cell that is not a `Cell`, a row taller than one line) goes to textual.
        """
        if row_index < 0 or column_index < 0 or row_index < self.fixed_rows:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row_key = self._row_locations.get_key(row_index)
        column_key = self._column_locations.get_key(column_index)
        if row_key is None or column_key is None:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        row = self.rows.get(row_key)
        cell = self._data.get(row_key, {}).get(column_key)
        if (
            row is None
            or row.height != 1
            or not isinstance(cell, Cell)
            or column_index < self.fixed_columns
        ):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key = (
            cell,
            row_index,
            column_index,
            base_style,
            width,
            cursor,
            hover,
            self.show_cursor,
            self._show_hover_cursor,
            self._pseudo_class_state,
        )
        lines = self._rendered.get(key) or self._rendered_before.get(key)
        if lines is None:
            component, post = self._get_styles_to_render_cell(
                False,
                False,
                False,
                hover,
                cursor,
                self.show_cursor,
                self._show_hover_cursor,
                self.cursor_foreground_priority == "css",
                self.cursor_background_priority == "css",
            )
            meta = Style.from_meta({"row": row_index, "column": column_index})
            pre = base_style + meta + component
            lines = [self._cell_line(cell, pre, post, width)]
        if key not in self._rendered:
            if len(self._rendered) >= CELL_CACHE:
                self._rendered_before, self._rendered = self._rendered, {}
            self._rendered[key] = lines
        return lines

    def _cell_line(self, cell: Cell, pre: Style, post: Style, width: int) -> list[Segment]:
        get_style = self.app.console.get_style
        bare = pre + post
        pad = self.cell_padding
        inner = [
            Segment(text, pre + get_style(style) + post if style else bare)
            for text, style in cell.parts
            if text
        ]
        inner = Segment.adjust_line_length(inner, max(0, width - 2 * pad), bare)
        if pad <= 0:
            return Segment.adjust_line_length(inner, width, bare)
        edge = Segment(" " * pad, bare)
        return Segment.adjust_line_length([edge, *inner, edge], width, bare)
