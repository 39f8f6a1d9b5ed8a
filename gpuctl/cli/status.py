"""`gpuctl status`: the fleet at a glance."""

from __future__ import annotations

import sys

import typer

from gpuctl.cli import fleet
from gpuctl.cli.fleet_view import (
    fleet_document,
    fleet_table,
    gpu_table,
    print_table,
)
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document


def status(ctx: typer.Context, output: Output = OUTPUT_OPTION) -> None:
    """Poll every node: reachability, GPUs, memory used/total, utilization, temperature, hints.

    Exit 0 when every node answered, 3 when some did not, 4 when none did.
    """
    inventory = fleet.load_inventory(ctx)
    snapshot = fleet.gather(ctx, inventory.nodes)
    specs = inventory.by_name()
    if output in (Output.JSON, Output.YAML):
        emit_document(fleet_document(snapshot, specs), output)
    else:
        print_table(fleet_table(snapshot, specs))
        if output is Output.WIDE:
            sys.stdout.write("\n")
            print_table(gpu_table(snapshot))
    raise typer.Exit(int(fleet.exit_code_for(snapshot)))


def register(app: typer.Typer) -> None:
    app.command("status")(status)
