"""`gpuctl status`: the fleet at a glance."""

from __future__ import annotations

import typer

from gpuctl.cli import fleet
from gpuctl.cli.fleet_view import render_fleet
from gpuctl.cli.render import OUTPUT_OPTION, Output


def status(ctx: typer.Context, output: Output = OUTPUT_OPTION) -> None:
    """Poll every node: reachability, GPUs, memory used/total, utilization, temperature, hints.

    Exit 0 when every node answered, 3 when some did not, 4 when none did.
    """
    inventory = fleet.load_inventory(ctx)
    snapshot = fleet.gather(ctx, inventory.nodes)
    specs = inventory.by_name()
    render_fleet(snapshot, specs, output)
    raise typer.Exit(int(fleet.exit_code_for(snapshot)))


def register(app: typer.Typer) -> None:
    app.command("status")(status)
