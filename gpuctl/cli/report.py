"""`gpuctl report`: the fleet report (the five numbers now and over a window, the worst nodes,
stranded capacity, notable events) as Markdown for people or one JSON document."""

from __future__ import annotations

import enum
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpuctl.cli import context, fleet
from gpuctl.cli.render import safe
from gpuctl.core.timefmt import machine_times
from gpuctl.errors import StateError, exit_for_poll

if TYPE_CHECKING:
    from gpuctl.adapters.protocols import Store
    from gpuctl.ops.health import History


class ReportFormat(enum.StrEnum):
    MARKDOWN = "markdown"
    JSON = "json"
    HTML = "html"
    CSV = "csv"


def report(
    ctx: typer.Context,
    window: str = typer.Option("24h", "--window", help="The window: 24h, 90m, 7d, 1h30m."),
    output: ReportFormat = typer.Option(
        ReportFormat.MARKDOWN,
        "-o",
        "--output",
        help="markdown, json, html (one self-contained page of SVG charts of the store's "
        "history) or csv (the history's series).",
        case_sensitive=False,
    ),
    rules: Path | None = typer.Option(None, "--rules", help="A health rules file to merge."),
    out: Path | None = typer.Option(None, "--out", help="Write html or csv to this file."),
) -> None:
    """Poll the fleet and write the report on stdout.

    Exit 0 when every node answered, 3 when some did not, 4 when none did, 5 when a host key is
    unknown or changed."""
    from gpuctl.config.health_rules import load_rules
    from gpuctl.ops import report as service

    window_s = service.parse_window(window)
    if output in (ReportFormat.HTML, ReportFormat.CSV):
        _history_report(ctx, output, window_s, out)
        return
    health_rules = load_rules(rules)
    inventory = fleet.load_inventory(ctx)
    snapshot = fleet.gather(ctx, inventory.nodes)
    history = _history(ctx)

    def build(store: Store | None, error: str | None = None) -> dict[str, Any]:
        return service.build_report(
            snapshot,
            store,
            inventory=inventory,
            rules=health_rules,
            history=history,
            now=time.time(),
            window_s=window_s,
            store_error=error,
        )

    try:
        with fleet.open_state(ctx, write=False) as store:
            doc = build(store)
    except StateError as exc:
        sys.stderr.write(f"warning: job figures unavailable: {safe(exc.message)}\n")
        doc = build(None, exc.message)
    if output is ReportFormat.JSON:
        sys.stdout.write(json.dumps(machine_times(doc), indent=2, allow_nan=False) + "\n")
    else:
        sys.stdout.write(service.markdown(doc))
    raise typer.Exit(int(exit_for_poll(n.reach for n in snapshot.nodes)))


def _history_report(
    ctx: typer.Context, output: ReportFormat, window_s: float, out: Path | None
) -> None:
    """The store's history over the window, as HTML charts or CSV (no poll)."""
    from gpuctl.ops import report_html

    now = time.time()
    with fleet.open_state(ctx, write=False) as store:
        if output is ReportFormat.HTML:
            offset = time.localtime(now).tm_gmtoff  # times for people: local, zone named
            text = report_html.html_page(store, now, window_s, offset_s=offset)
        else:
            text = report_html.csv_text(store, now, window_s)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StateError(f"--out {out}: cannot write: {exc.strerror}") from None
    sys.stderr.write(f"wrote {out}\n")


def _history(ctx: typer.Context) -> History:
    """Earlier health samples `gpuctl health` recorded (read only; none when unreadable)."""
    from gpuctl.config import paths
    from gpuctl.ops.health import SampleHistory

    app_ctx = context.get(ctx)
    try:
        return SampleHistory.in_state_dir(paths.state_dir(app_ctx.env, app_ctx.state_dir)).load()
    except StateError as exc:
        sys.stderr.write(f"warning: health history ignored: {safe(exc.message)}\n")
        return {}


def register(app: typer.Typer) -> None:
    app.command("report")(report)
