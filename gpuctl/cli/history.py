"""`gpuctl history prune|show`: the fleet's history in the state store, pruned now (what the
recorder does about once an hour) or printed as the series `report -o csv` writes."""

from __future__ import annotations

import enum
import sys
import time
from typing import TYPE_CHECKING

import typer

from gpuctl.cli import context, fleet
from gpuctl.cli.render import safe
from gpuctl.errors import UsageError

if TYPE_CHECKING:
    from gpuctl.core.history import PruneReport

app = typer.Typer(
    help="The fleet's history in the state store: prune it now, print its series.",
    no_args_is_help=True,
)


class PruneOutput(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


class ShowOutput(enum.StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


@app.command("prune")
def prune(
    ctx: typer.Context,
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Say what a prune would delete and change nothing (the prune runs in a transaction "
        "that is rolled back, so the counts are its own).",
    ),
    retention_flag: str | None = typer.Option(
        None,
        "--retention",
        help="How long samples are kept (default: the inventory's defaults: history_retention: "
        "when -i names one, else 30d), e.g. 30d, 12h, 7d12h.",
    ),
    output: PruneOutput = typer.Option(
        PruneOutput.TABLE, "-o", "--output", help="table or json.", case_sensitive=False
    ),
) -> None:
    """Prune the history now, saying per table and level what it deleted.

    Aged samples are averaged into 5-minute and hourly rows, those past the retention dropped,
    and events past theirs deleted (checkpoint events after 14 days, the rest after a year), in
    one transaction: what the control loop's recorder does about once an hour."""
    from gpuctl.ops.history import retention

    keep = retention(retention_flag, _inventory_retention(ctx), option="--retention")
    now = context.get(ctx).clock.now()
    with fleet.open_state(ctx, write=True) as store:
        report = store.prune_history_report(now, keep, dry_run=dry_run)
    if output is PruneOutput.JSON:
        from gpuctl.cli.render import Output, emit_document

        emit_document({"at": now, "retention_s": keep.keep_s, **report.to_dict()}, Output.JSON)
        return
    sys.stdout.write(_prune_text(report, keep.keep_s))


def _inventory_retention(ctx: typer.Context) -> int | None:
    """The inventory's `defaults: history_retention:` when -i or GPUCTL_INVENTORY names one
    (its nodes are not resolved: no Slurm is asked); None otherwise."""
    app_ctx = context.get(ctx)
    if app_ctx.inventory_path is None and not app_ctx.env.get("GPUCTL_INVENTORY"):
        return None
    from gpuctl.config.inventory import load_inventory

    return load_inventory(app_ctx.resolve_inventory_path()).history_retention_s


def _prune_text(report: PruneReport, keep_s: int) -> str:
    from gpuctl.core.history import DAY_S, step_level

    kept = f"{keep_s // DAY_S}d" if keep_s % DAY_S == 0 else step_level(keep_s)
    rows = [["TABLE", "LEVEL", "ROWS", "AFTER", "CHANGE"]]
    for t in report.tables:
        rows.append([t.table, t.level, str(t.before), str(t.after), f"{t.change:+d}"])
    p = report.pruned
    verb = "would average" if report.dry_run else "averaged"
    lines = _table(rows) if len(rows) > 1 else "the history is empty\n"
    lines += (
        f"{verb} {p.averaged} sample(s) into coarser ones, "
        f"{'would drop' if report.dry_run else 'dropped'} {p.dropped} past the retention "
        f"({kept}), "
        f"{'would delete' if report.dry_run else 'deleted'} {p.events} event(s)\n"
    )
    if report.dry_run:
        lines += "dry run: nothing changed\n"
    return lines


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )


@app.command("show")
def show(
    ctx: typer.Context,
    since: str = typer.Option("6h", "--since", help="How far back: 6h, 90m, 7d, 1h30m."),
    node: str | None = typer.Option(None, "--node", help="Only this node's series."),
    series: str | None = typer.Option(
        None,
        "--series",
        help="Only this series: a fleet number (utilization_pct, fragmentation_pct, ...) or a "
        "node column (util_pct, mem_used_mib, ...).",
    ),
    output: ShowOutput = typer.Option(
        ShowOutput.TABLE,
        "-o",
        "--output",
        help="table, json or csv (the columns of report -o csv).",
        case_sensitive=False,
    ),
) -> None:
    """Print the stored series of the last --since, in report -o csv's columns.

    Samples as stored (a minute apart, 5-minute and hourly averages when older): at, step,
    series, node (empty for a fleet number), value."""
    from gpuctl.ops.history import SERIES, series_rows, window
    from gpuctl.ops.report import parse_window

    try:
        seconds = parse_window(since)
    except UsageError:
        raise UsageError(
            f"--since: {since!r} is not a duration of more than 0 and at most 366d",
            hint="e.g. 6h, 90m, 7d, 1h30m",
        ) from None
    if series is not None and series not in SERIES:
        raise UsageError(f"--series: no series {series!r}", hint=f"one of: {', '.join(SERIES)}")
    now = context.get(ctx).clock.now()
    with fleet.open_state(ctx, write=False) as store:
        fleet_samples, node_samples = window(store, now, seconds, until=now, node=node)
    if output is ShowOutput.CSV:
        from gpuctl.ops.report_html import csv_of

        sys.stdout.write(csv_of(fleet_samples, node_samples, series))
        return
    rows = list(series_rows(fleet_samples, node_samples, series))
    if output is ShowOutput.JSON:
        from gpuctl.cli.render import Output, emit_document

        keys = ("at", "step_s", "series", "node", "value")
        doc = [dict(zip(keys, (*r[:3], r[3] or None, r[4]), strict=True)) for r in rows]
        emit_document(doc, Output.JSON)
        return
    if not rows:
        sys.stderr.write("no history in the window (gpuctl reconcile --watch records it)\n")
        return
    from gpuctl.core import timefmt
    from gpuctl.core.history import step_level

    offset = time.localtime(now).tm_gmtoff
    table = [["AT", "STEP", "SERIES", "NODE", "VALUE"]]
    for at, step_s, name, where, value in rows:
        shown = "N/A" if value is None else f"{value:g}"
        table.append([timefmt.stamp(at, offset), step_level(step_s), name, safe(where), shown])
    sys.stdout.write(_table(table))
