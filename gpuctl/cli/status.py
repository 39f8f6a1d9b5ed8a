"""`gpuctl status`: the fleet at a glance, each node's state, and the five numbers."""

from __future__ import annotations

import sys
import time

import typer

from gpuctl.cli import fleet
from gpuctl.cli.fleet_view import fleet_document, print_table, render_fleet
from gpuctl.cli.numbers_view import fleet_line, numbers_line
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.core.fleet.nodestate import NodeStatus
from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.model import FleetSnapshot
from gpuctl.errors import StateError, exit_for_poll

LIVE = typer.Option(
    False,
    "--live",
    help="Poll every node now, even while a control loop publishes the fleet into the store.",
)


def status(ctx: typer.Context, output: Output = OUTPUT_OPTION, live: bool = LIVE) -> None:
    """Poll every node: state (ready, cordoned, draining, down, unknown, with the cordon's reason,
    who and when), reachability, GPUs, memory used/total, utilization, temperature, hints; then
    the fleet's numbers: utilization % (band), fragmentation %, queue wait, checkpoint age,
    failover success %, preemption rate.

    While a control loop (`gpuctl reconcile --watch`, `gpuctl controller run`) publishes its
    polls into the store, the newest is shown instead of polling again, saying how old it is on
    stderr; --live polls the nodes anyway.

    Exit 0 when every node answered, 3 when some did not, 4 when none did, 5 when a host key is
    unknown or changed.

    Example: gpuctl status --live -o json
    """
    inventory = fleet.load_inventory(ctx)
    snapshot = fleet.read(ctx, inventory.nodes, live=live)
    specs = inventory.by_name()
    states, figures = store_view(ctx, snapshot, numbers=True)
    if output in (Output.JSON, Output.YAML):
        doc = fleet_document(snapshot, specs, states)
        doc["numbers"] = None if figures is None else figures.to_dict()
        emit_document(doc, output)
    else:
        render_fleet(snapshot, specs, output, states)
        if figures is not None:
            sys.stdout.write("\n" + fleet_line(figures) + numbers_line(figures.jobs))
    raise typer.Exit(int(exit_for_poll(n.reach for n in snapshot.nodes)))


def store_view(
    ctx: typer.Context, snapshot: FleetSnapshot, *, numbers: bool
) -> tuple[dict[str, NodeStatus], FleetNumbers | None]:
    """Each node's state (the store's cordons, drains and moves) and, with `numbers`, the five
    numbers, from the snapshot and the store read-only (none there: no cordons, no job figures).
    A store that cannot be read leaves the fleet view intact and says why on stderr."""
    from gpuctl.ops import fleetstatus

    now = time.time()
    try:
        with fleet.open_state(ctx, write=False) as store:
            states = fleetstatus.node_states(snapshot, store)
            return states, fleetstatus.numbers(snapshot, store, now) if numbers else None
    except StateError as exc:
        lost = "cordons and job figures" if numbers else "cordons"
        sys.stderr.write(f"warning: {lost} unavailable: {safe(exc.message)}\n")
    states = fleetstatus.node_states(snapshot, None)
    return states, fleetstatus.numbers(snapshot, None, now) if numbers else None


def register(app: typer.Typer) -> None:
    app.command("status")(status)


__all__ = ["print_table", "register", "status", "store_view"]
