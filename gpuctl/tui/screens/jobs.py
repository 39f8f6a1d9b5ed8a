"""The queue (queued jobs: how long they wait and why) and the jobs (running and held)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import DataTable

from gpuctl.ops.dashboard import DashData
from gpuctl.tui import rows
from gpuctl.tui.messages import ActionRequested, OpenJob
from gpuctl.tui.screens.base import DashScreen
from gpuctl.tui.widgets.table import KeyedTable

JOB_ACTION_BINDINGS: list[BindingType] = [
    Binding("k", "cancel", "Cancel job"),
    Binding("K", "kill", "Kill now", key_display="K"),
]
JOB_ACTION_KEYS = (
    ("k", "cancel the job (plan, then confirm): a running one gets SIGTERM, KILL after its grace"),
    ("K", "kill a running job at once, no last checkpoint (cancel --force; plan, then confirm)"),
)


class _JobTable(DashScreen):
    COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = ()
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open", "Job"),
        *JOB_ACTION_BINDINGS,
    ]
    KEYS = (("enter", "open the job under the cursor (detail and log tail)"), *JOB_ACTION_KEYS)

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

    def _job_action(self, action: str) -> None:
        key = self.query_one(KeyedTable).cursor_key()
        if key is None:
            self.app.notify("no job selected", severity="warning")
            return
        self.post_message(ActionRequested(action, key))

    def action_cancel(self) -> None:
        self._job_action("cancel")

    def action_kill(self) -> None:
        self._job_action("kill")

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
