"""`gpuctl dash`: the live dashboard (Textual), or its numbers and fleet table as text."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpuctl.cli import context, fleet
from gpuctl.errors import exit_for_poll


def dash(
    ctx: typer.Context,
    snapshot: Path | None = typer.Option(
        None,
        "--snapshot",
        help="Review a saved `gpuctl status -o json` instead of polling (read-only).",
        show_default=False,
    ),
    refresh: float = typer.Option(
        2.0, "--refresh", min=1.0, help="Seconds between polls (at least 1)."
    ),
    readonly: bool = typer.Option(
        False, "--readonly", help="No actions: cordon, uncordon, drain and consolidate are off."
    ),
    once: bool = typer.Option(
        False, "--once", help="Print the numbers and the fleet table once, without a terminal UI."
    ),
    live: bool = typer.Option(
        False,
        "--live",
        help="Poll every node at each refresh, even while a control loop publishes the fleet "
        "into the store (read instead, saying how old it is, by default).",
    ),
    history: str = typer.Option(
        "6h",
        "--history",
        help="The sparklines' window: 1h, 6h or 24h of the store's history (the h key changes "
        "it); the last polls when the store has none.",
    ),
) -> None:
    """The fleet, live: the five numbers, nodes and GPUs, queue, jobs, alerts; actions with a plan
    and a confirmation. Keys: ? help, / filter, : command, enter, esc, r refresh, q quit.

    With --once, or when stdout is not a terminal: one poll, printed as text; exit 0 when every
    node answered, 3 when some did not, 4 when none did, 5 when a host key is unknown or changed.
    """
    from gpuctl.ops.dashboard import parse_history_window
    from gpuctl.tui import entry

    window = parse_history_window(history)
    app_ctx = context.get(ctx)
    root = app_ctx.root()
    if snapshot is not None:
        services = root.saved_dashboard(snapshot)
    else:
        services = root.dashboard(
            fleet.load_inventory(ctx),
            label=f"live {app_ctx.resolve_inventory_path()}",
            readonly=readonly,
            live=live,
        )
    if once or not sys.stdout.isatty():
        text, data = entry.once(services, window)
        sys.stdout.write(text)
        raise typer.Exit(int(exit_for_poll(n.reach for n in data.snapshot.nodes)))
    entry.run(services, refresh_s=refresh, readonly=readonly, history=window)


def register(app: typer.Typer) -> None:
    app.command("dash")(dash)
