"""`gpuctl nodes list|show`."""

from __future__ import annotations

import typer

from gpuctl.cli import fleet
from gpuctl.cli.fleet_view import fleet_document, render_fleet, stdout_console
from gpuctl.cli.node_view import node_detail
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document
from gpuctl.errors import exit_for_poll

app = typer.Typer(help="Nodes of the inventory, as they answer now.", no_args_is_help=True)


@app.command("list")
def list_nodes(
    ctx: typer.Context,
    names: list[str] = typer.Argument(
        None, help="Nodes to poll (default: all).", metavar="[NODE]..."
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """One row per node. Exit 0 when all answered, 3 when some did not, 4 when none did, 5 when a
    host key is unknown or changed."""
    inventory = fleet.load_inventory(ctx)
    snapshot = fleet.gather(ctx, fleet.select(inventory, names or []))
    specs = inventory.by_name()
    render_fleet(snapshot, specs, output)
    raise typer.Exit(int(exit_for_poll(n.reach for n in snapshot.nodes)))


@app.command("show")
def show_node(ctx: typer.Context, name: str, output: Output = OUTPUT_OPTION) -> None:
    """Everything one node reported: facts, GPUs, processes, XID events, parse notes."""
    inventory = fleet.load_inventory(ctx)
    spec = fleet.select(inventory, [name])[0]
    snapshot = fleet.gather(ctx, (spec,))
    if output in (Output.JSON, Output.YAML):
        emit_document(fleet_document(snapshot, inventory.by_name())["nodes"][0], output)
    else:
        node_detail(stdout_console(), snapshot.nodes[0], spec)
    raise typer.Exit(int(exit_for_poll(n.reach for n in snapshot.nodes)))
