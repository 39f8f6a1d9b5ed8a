"""The overview: the numbers, the fleet table, alerts and recent events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import DataTable

from gpuctl.ops.dashboard import DashData
from gpuctl.tui import rows
from gpuctl.tui.messages import ActionRequested, NextHistoryWindow, OpenNode, ToggleCheckpoints
from gpuctl.tui.screens.base import DashScreen
from gpuctl.tui.widgets.fleet import EventsList, FleetTable
from gpuctl.tui.widgets.numbers import NumbersPanel


class OverviewScreen(DashScreen):
    NAME = "nodes"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Node"),
        Binding("c", "cordon", "Cordon"),
        Binding("u", "uncordon", "Uncordon"),
        Binding("d", "drain", "Drain"),
        Binding("x", "consolidate", "Consolidate"),
        Binding("e", "events", "Events filter"),
        Binding("h", "history", "History window"),
        Binding("tab", "app.focus_next", "Next pane", show=False),
    ]
    KEYS = (
        ("enter", "open the node under the cursor"),
        ("c / u", "cordon / uncordon that node (plan, then confirm)"),
        ("d", "drain that node (plan, then confirm)"),
        ("x", "consolidate the fleet (plan, then confirm)"),
        ("e", "events: hide checkpoint events, or show every event again (:events KINDS)"),
        ("h", "history: the sparklines over 1h, 6h or 24h (the store's history, --history)"),
        ("tab", "switch between the fleet table and the events"),
    )

    def compose_body(self) -> Iterator[Widget]:
        yield NumbersPanel(id="numbers")
        yield FleetTable(id="fleet")
        yield EventsList(id="events")

    def heading(self) -> str:
        data = self.dash.data
        if data is None or not data.event_filter.active:
            return "nodes"
        return f"nodes · events {data.event_filter.describe()}"

    def on_mount(self) -> None:
        self.query_one(FleetTable).focus()
        super().on_mount()

    def show(self, data: DashData) -> None:
        self.query_one(NumbersPanel).show(data.numbers, data.history)
        table = self.query_one(FleetTable)
        if self.filter:  # a filter reads every row's text
            table.sync(rows.fleet_rows(data, self.filter))
        else:
            views = {n.name: n for n in data.nodes}
            table.sync_lazy(list(views), lambda name: rows.fleet_row(views[name], data.history))
        self.query_one(EventsList).sync(rows.event_rows(data, self.dash.offset_s))

    def selected(self) -> str | None:
        return self.query_one(FleetTable).cursor_key()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, FleetTable):
            event.stop()
            self.action_open()

    def action_open(self) -> None:
        name = self.selected()
        if name is not None:
            self.post_message(OpenNode(name))

    def _node_action(self, action: str) -> None:
        name = self.selected()
        if name is None:
            self.app.notify("no node selected", severity="warning")
            return
        self.post_message(ActionRequested(action, name))

    def action_cordon(self) -> None:
        self._node_action("cordon")

    def action_uncordon(self) -> None:
        self._node_action("uncordon")

    def action_drain(self) -> None:
        self._node_action("drain")

    def action_events(self) -> None:
        self.post_message(ToggleCheckpoints())

    def action_history(self) -> None:
        self.post_message(NextHistoryWindow())

    def action_consolidate(self) -> None:
        self.post_message(ActionRequested("consolidate", None))
