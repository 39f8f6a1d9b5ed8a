"""`gpuctl nodes list|show`."""

from __future__ import annotations

import dataclasses

import typer

from gpuctl.cli import fleet
from gpuctl.cli.fleet_view import fleet_document, render_fleet, status_of, stdout_console
from gpuctl.cli.node_view import node_detail
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document
from gpuctl.cli.status import store_view
from gpuctl.core.fleet.nodestate import NODE_STATES
from gpuctl.errors import UsageError, exit_for_poll

app = typer.Typer(help="Nodes of the inventory, as they answer now.", no_args_is_help=True)


@app.command("list")
def list_nodes(
    ctx: typer.Context,
    names: list[str] = typer.Argument(
        None,
        help="Nodes to poll: names and hostlist ranges, gpu[01-04,07] (default: all).",
        metavar="[NODE]...",
    ),
    selector: str | None = typer.Option(
        None,
        "--selector",
        "-l",
        help="Only nodes whose inventory labels match: pool=train,zone!=b (key, !key too).",
        metavar="SELECTOR",
        show_default=False,
    ),
    state: list[str] = typer.Option(
        None,
        "--state",
        "-t",
        help="Only nodes in these states (ready, cordoned, draining, down, unknown); repeat "
        "or separate with commas.",
        metavar="STATE",
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """One row per node: its state (a cordon's reason, who and when in NOTES), GPUs, memory,
    utilization, temperature. Exit 0 when all answered, 3 when some did not, 4 when none did, 5
    when a host key is unknown or changed (of the nodes polled, listed or not)."""
    wanted = _states(state or [])
    inventory = fleet.load_inventory(ctx)
    snapshot = fleet.gather(ctx, fleet.select(inventory, names or [], selector))
    states, _ = store_view(ctx, snapshot, numbers=False)
    shown = snapshot
    if wanted:
        kept = tuple(n for n in snapshot.nodes if status_of(n, states).state.value in wanted)
        shown = dataclasses.replace(snapshot, nodes=kept)
    render_fleet(shown, inventory.by_name(), output, states)
    raise typer.Exit(int(exit_for_poll(n.reach for n in snapshot.nodes)))


def _states(given: list[str]) -> frozenset[str]:
    wanted = {s.strip().lower() for text in given for s in text.split(",") if s.strip()}
    unknown = sorted(wanted - set(NODE_STATES))
    if unknown:
        raise UsageError(
            f"--state: unknown node state {unknown[0]!r}", hint=f"one of {', '.join(NODE_STATES)}"
        )
    return frozenset(wanted)


@app.command("show")
def show_node(ctx: typer.Context, name: str, output: Output = OUTPUT_OPTION) -> None:
    """Everything one node reported: its state (with a cordon's reason, who and when), facts,
    GPUs, processes, XID events, parse notes."""
    inventory = fleet.load_inventory(ctx)
    spec = fleet.select(inventory, [name])[0]
    snapshot = fleet.gather(ctx, (spec,))
    states, _ = store_view(ctx, snapshot, numbers=False)
    if output in (Output.JSON, Output.YAML):
        emit_document(fleet_document(snapshot, inventory.by_name(), states)["nodes"][0], output)
    else:
        node = snapshot.nodes[0]
        node_detail(stdout_console(), node, spec, status_of(node, states))
    raise typer.Exit(int(exit_for_poll(n.reach for n in snapshot.nodes)))
