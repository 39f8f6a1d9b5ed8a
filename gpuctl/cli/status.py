"""`gpuctl status`: the fleet at a glance, and the five numbers."""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from gpuctl.cli import fleet
from gpuctl.cli.fleet_view import fleet_document, print_table, render_fleet
from gpuctl.cli.numbers_view import fleet_line, numbers_line
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.core.model import FleetSnapshot
from gpuctl.errors import StateError, exit_for_poll


def status(ctx: typer.Context, output: Output = OUTPUT_OPTION) -> None:
    """Poll every node: reachability, GPUs, memory used/total, utilization, temperature, hints;
    then the fleet's numbers: utilization % (band), fragmentation %, queue wait, checkpoint age,
    failover success %, preemption rate.

    Exit 0 when every node answered, 3 when some did not, 4 when none did, 5 when a host key is
    unknown or changed.
    """
    inventory = fleet.load_inventory(ctx)
    snapshot = fleet.gather(ctx, inventory.nodes)
    specs = inventory.by_name()
    figures = _numbers(ctx, snapshot)
    if output in (Output.JSON, Output.YAML):
        doc = fleet_document(snapshot, specs)
        doc["numbers"] = figures
        emit_document(doc, output)
    else:
        render_fleet(snapshot, specs, output)
        if figures is not None:
            sys.stdout.write("\n" + fleet_line(figures) + numbers_line(figures))
    raise typer.Exit(int(exit_for_poll(n.reach for n in snapshot.nodes)))


def _numbers(ctx: typer.Context, snapshot: FleetSnapshot) -> dict[str, Any] | None:
    """The numbers from the snapshot and the store; a store that cannot be read leaves the fleet
    table intact and says why on stderr."""
    from gpuctl.ops.fleetstatus import numbers

    try:
        with fleet.open_state(ctx, write=False) as store:
            return numbers(snapshot, store, time.time())
    except StateError as exc:
        sys.stderr.write(f"warning: job figures unavailable: {safe(exc.message)}\n")
        return numbers(snapshot, None, time.time())


def register(app: typer.Typer) -> None:
    app.command("status")(status)


__all__ = ["print_table", "register", "status"]
