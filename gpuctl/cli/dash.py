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
) -> None:
    """The fleet, live: the five numbers, nodes and GPUs, queue, jobs, alerts; actions with a plan
    and a confirmation. Keys: ? help, / filter, : command, enter, esc, r refresh, q quit.

    With --once, or when stdout is not a terminal: one poll, printed as text; exit 0 when every
    node answered, 3 when some did not, 4 when none did, 5 when a host key is unknown or changed.
    """
    from gpuctl.adapters.clock import SystemClock
    from gpuctl.config.paths import state_dir
    from gpuctl.ops.jobs import operator
    from gpuctl.tui.services import KeptStore, live_services, saved_services

    app_ctx = context.get(ctx)
    folder = state_dir(app_ctx.env, app_ctx.state_dir)
    opener = KeptStore(folder)
    clock = SystemClock()
    if snapshot is not None:
        services = saved_services(snapshot, open_store=opener, clock=clock)
    else:
        inventory = fleet.load_inventory(ctx)
        services = live_services(
            inventory,
            label=f"live {app_ctx.resolve_inventory_path()}",
            open_store=opener,
            clock=clock,
            operator=operator(app_ctx.env),
            transport_factory=app_ctx.transport_factory,
            readonly=readonly,
            env=app_ctx.env,
            state_dir=folder,
        )
    if once or not sys.stdout.isatty():
        from gpuctl.tui.data import collect
        from gpuctl.tui.rows import once_text

        try:
            data = collect(services)
        finally:
            services.close()
        sys.stdout.write(once_text(data))
        raise typer.Exit(int(exit_for_poll(n.reach for n in data.snapshot.nodes)))
    from gpuctl.tui.app import DashApp

    DashApp(services, refresh_s=refresh, readonly=readonly).run()


def register(app: typer.Typer) -> None:
    app.command("dash")(dash)
