"""What fleet commands share: load the inventory, gather with progress on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import typer

from gpuctl.cli import context
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSpec

if TYPE_CHECKING:
    from gpuctl.adapters.protocols import Store
    from gpuctl.ops.compose import Loop
    from gpuctl.ops.loop import Action, ReconcileSettings


def load_inventory(ctx: typer.Context) -> Inventory:
    """The inventory, with the nodes of its Slurm cluster when it has a `slurm:` section
    (`gpuctl.ops.slurm.resolve_inventory`: the commands run here or on its login node)."""
    from gpuctl.config.inventory import load_inventory as load

    inventory = load(context.get(ctx).resolve_inventory_path())
    if inventory.slurm is None:
        return inventory
    from gpuctl.ops.slurm import resolve_inventory

    if inventory.slurm.via == "local":
        return resolve_inventory(inventory, None)
    transport = context.root(ctx).transport()
    try:
        return resolve_inventory(inventory, transport)
    finally:
        transport.close()


def select(
    inventory: Inventory, names: list[str], labels: str | None = None
) -> tuple[NodeSpec, ...]:
    """The nodes `names` (names and hostlist ranges; all when empty) and the label selector
    `labels` pick (`gpuctl.config.node_selection`); UsageError (exit 2) when none match."""
    from gpuctl.config.node_selection import select_nodes

    return select_nodes(inventory, names, labels)


def gather(ctx: typer.Context, nodes: tuple[NodeSpec, ...]) -> FleetSnapshot:
    """One poll of `nodes`; a progress bar on stderr when it is a terminal."""
    with context.root(ctx).gatherer() as gatherer:
        if not sys.stderr.isatty() or len(nodes) < 2:
            return gatherer.gather(nodes)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(file=sys.stderr)
        with Progress(
            TextColumn("gathering"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task("gather", total=len(nodes))
            return gatherer.gather(nodes, progress=lambda *_: bar.advance(task))


def read(ctx: typer.Context, nodes: tuple[NodeSpec, ...], *, live: bool) -> FleetSnapshot:
    """The fleet as the control loop published it into the store while it is fresh (saying so
    on stderr: `fleet as the controller saw it 4s ago`), else, or with `live`, one poll of
    `nodes` (`gather`): N operators cost the fleet one poll (`gpuctl.ops.shared_fleet`)."""
    if not live:
        shared = context.root(ctx).shared_fleet(None)
        found = shared.published(nodes)
        said = shared.seen_line()
        if found is not None and said is not None:
            sys.stderr.write(f"{said} (--live polls the nodes)\n")
            return found
    return gather(ctx, nodes)


def open_state(ctx: typer.Context, *, write: bool) -> AbstractContextManager[Store]:
    """The state store of `--state-dir` / `GPUCTL_STATE_DIR` / the XDG state dir. Opened for
    writing it fails closed (`StateError`, exit 6); read-only on a folder without a store it is
    an empty view and creates nothing."""
    return context.root(ctx).store(write=write)


def open_loop(
    ctx: typer.Context,
    *,
    write: bool,
    settings: ReconcileSettings | None = None,
    on_action: Callable[[Action], None] | None = None,
    history_file: bool = False,
) -> Loop:
    """The control loop over the inventory (`gpuctl.ops.compose.Root.loop`): `write=False`: the
    store read-only (a dry run creates nothing); `history_file`: the health rules look back at
    the state dir's `health-history.json` (shared with `gpuctl health`)."""
    return context.root(ctx).loop(
        load_inventory(ctx),
        write=write,
        settings=settings,
        on_action=on_action,
        history_file=history_file,
    )
