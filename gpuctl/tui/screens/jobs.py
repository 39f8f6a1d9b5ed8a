"""The queue (queued jobs: how long they wait and why) and the jobs (running and held)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import DataTable

from gpuctl.ops.dashboard import DashData
from gpuctl.tui import rows
from gpuctl.tui.messages import OpenJob
from gpuctl.tui.screens.base import DashScreen
from gpuctl.tui.widgets.table import KeyedTable


class _JobTable(DashScreen):
    COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = ()
    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "open", "Job")]
    KEYS = (("enter", "open the job under the cursor (detail and log tail)"),)

    def compose_body(self) -> Iterator[Widget]:
        yield KeyedTable(self.COLUMNS, id="table")

    def on_mount(self) -> None:
        self.query_one(KeyedTable).focus()
        super().on_mount()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        key = self.query_one(KeyedTable).cursor_key()
        if key is not None:
            self.post_message(OpenJob(key))

    def table_rows(self, data: DashData) -> list[rows.Row]:
        raise NotImplementedError

    def show(self, data: DashData) -> None:
        self.query_one(KeyedTable).sync(self.table_rows(data))


class QueueScreen(_JobTable):
    NAME = "queue"
    COLUMNS = rows.QUEUE_COLUMNS

    def table_rows(self, data: DashData) -> list[rows.Row]:
        return rows.queue_rows(data, self.filter)


class JobsScreen(_JobTable):
    NAME = "jobs"
    COLUMNS = rows.JOB_COLUMNS

    def table_rows(self, data: DashData) -> list[rows.Row]:
        return rows.job_rows(data, self.filter)
