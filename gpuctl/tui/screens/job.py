"""One job: its state, where it runs, its incarnations and events, and the tail of its log."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from gpuctl.ops.dashboard import DashData, Services
from gpuctl.ops.jobs import JobDetail
from gpuctl.tui import format as fmt
from gpuctl.tui import rows
from gpuctl.tui.messages import ActionRequested
from gpuctl.tui.screens.base import DashScreen
from gpuctl.tui.screens.jobs import JOB_ACTION_BINDINGS, JOB_ACTION_KEYS

LOG_LINES = 200


@dataclasses.dataclass(frozen=True, slots=True)
class JobPage:
    detail: JobDetail
    log: str | None  # None: no log reader (offline), or the job never started
    log_note: str | None = None


def load_job(services: Services, job_id: str) -> JobPage:
    """In a worker: the job from the store, then its log tail from its node."""
    from gpuctl.errors import GpuctlError
    from gpuctl.ops.jobs import show_job

    with services.open_store(False) as store:
        detail = show_job(store, job_id)
        if services.logs is None:
            return JobPage(detail, None, "no log: offline review (no nodes to ask)")
        if detail.view.job.incarnation == 0:
            return JobPage(detail, None, "no log: the job has not started")
        try:
            return JobPage(detail, services.logs.tail(store, job_id))
        except GpuctlError as exc:
            return JobPage(detail, None, f"cannot read the log: {exc.message}")


class JobScreen(DashScreen):
    NAME = "job"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("l", "reload", "Reload log"),
        *JOB_ACTION_BINDINGS,
    ]
    KEYS = (("l", "read the job and its log again"), *JOB_ACTION_KEYS)

    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id = job_id
        self.page: JobPage | None = None

    def heading(self) -> str:
        return f"job {fmt.safe(self.job_id)}"

    def compose_body(self) -> Iterator[Widget]:
        yield Static(id="job-summary")
        with VerticalScroll(id="job-log-box"):
            yield Static(id="job-log")

    def on_mount(self) -> None:
        super().on_mount()
        self.action_reload()

    def action_reload(self) -> None:
        self.query_one("#job-log", Static).update(Text("reading the log ...", style="dim"))
        services = self.dash.services
        self.dash.background(lambda: load_job(services, self.job_id), self.loaded, name="job")

    def action_cancel(self) -> None:
        self.post_message(ActionRequested("cancel", self.job_id))

    def action_kill(self) -> None:
        self.post_message(ActionRequested("kill", self.job_id))

    def loaded(self, page: JobPage) -> None:
        self.page = page
        self.render_page()

    def show(self, data: DashData) -> None:
        self.render_page()

    def render_page(self) -> None:
        data, page = self.dash.data, self.page
        text = Text()
        line = data.job(self.job_id) if data is not None else None
        if line is not None and data is not None:
            cells = rows.job_row(line, data.now)
            for (_, head), cell in zip(rows.JOB_COLUMNS, cells, strict=True):
                text.append(f"{head}: ", style="dim")
                text.append_text(cell.text())
                text.append("  ")
            if line.why:
                text.append(f"\nwaits: {fmt.safe(line.why)}", style="yellow")
            if line.view.job.reason:
                text.append(f"\nreason: {fmt.safe(line.view.job.reason)}")
        elif page is not None:
            job = page.detail.view.job
            text.append(f"{fmt.safe(job.id)} {fmt.safe(job.name)} {job.state.value}")
            if job.reason:
                text.append(f": {fmt.safe(job.reason)}")
        else:
            text.append(f"{fmt.safe(self.job_id)}: reading ...", style="dim")
        if page is not None:
            offset = self.dash.offset_s
            text.append("\n\nIncarnations\n", style="bold")
            text.append("\n".join(rows.incarnation_lines(page.detail.incarnations, offset)) or "-")
            text.append("\n\nEvents\n", style="bold")
            for e in reversed(page.detail.events[-10:]):
                text.append(f"{fmt.clock_hms(e.at, offset)}  {e.kind:<10} {fmt.safe(e.message)}\n")
        self.query_one("#job-summary", Static).update(text)
        if page is None:
            return
        log = Text("Log tail\n", style="bold")
        if page.log is not None:
            lines = fmt.safe_lines(page.log)[-LOG_LINES:]
            log.append("\n".join(lines) or "(empty)")
        else:
            log.append(page.log_note or "no log", style="dim")
        self.query_one("#job-log", Static).update(log)
        self.query_one("#job-log-box", VerticalScroll).scroll_end(animate=False)
