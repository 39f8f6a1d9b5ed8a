"""What fleet commands share: load the inventory, gather with progress on stderr."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuctl.cli import context
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSpec
from gpuctl.errors import UsageError

if TYPE_CHECKING:
    from gpuctl.adapters.protocols import Store, Transport
    from gpuctl.ops.gather import Gatherer
    from gpuctl.ops.reconcile import Action, Reconciler, ReconcileSettings


def load_inventory(ctx: typer.Context) -> Inventory:
    from gpuctl.config.inventory import load_inventory as load

    return load(context.get(ctx).resolve_inventory_path())


def select(inventory: Inventory, names: list[str]) -> tuple[NodeSpec, ...]:
    if not names:
        return inventory.nodes
    by_name = inventory.by_name()
    missing = [n for n in names if n not in by_name]
    if missing:
        raise UsageError(
            f"unknown node {missing[0]!r}",
            hint=f"the inventory has {len(by_name)} node(s); see `gpuctl inventory list`",
        )
    return tuple(by_name[n] for n in names)


def gather(ctx: typer.Context, nodes: tuple[NodeSpec, ...]) -> FleetSnapshot:
    """One poll of `nodes`; a progress bar on stderr when it is a terminal."""
    from gpuctl.ops.gather import Gatherer, default_transport

    app_ctx = context.get(ctx)
    transport = app_ctx.transport_factory() if app_ctx.transport_factory else default_transport()
    with Gatherer(transport) as gatherer:
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


@contextlib.contextmanager
def open_state(ctx: typer.Context, *, write: bool) -> Iterator[Store]:
    """The state store of `--state-dir` / `GPUCTL_STATE_DIR` / the XDG state dir. Opened for
    writing it fails closed (`StateError`, exit 6); read-only on a folder without a store it is
    an empty view and creates nothing."""
    from gpuctl.adapters.store import open_store
    from gpuctl.config.paths import state_dir

    app_ctx = context.get(ctx)
    store = open_store(state_dir(app_ctx.env, app_ctx.state_dir), write=write)
    try:
        yield store
    finally:
        store.close()


@dataclasses.dataclass
class Loop:
    """The control loop as `gpuctl reconcile` runs it, and its parts: the store, the gatherer and
    the job runner over one SSH transport. `close()` closes the gatherer (and the transport) and
    the store."""

    loop: Reconciler
    gatherer: Gatherer
    transport: Transport
    inventory: Inventory
    state_dir: Path

    def close(self) -> None:
        try:
            self.gatherer.close()
        finally:
            self.loop.store.close()


def open_loop(
    ctx: typer.Context,
    *,
    write: bool,
    settings: ReconcileSettings | None = None,
    on_action: Callable[[Action], None] | None = None,
    history_file: bool = False,
) -> Loop:
    """`write=False`: the store read-only (a dry run creates nothing). `history_file`: the
    health rules look back at the state dir's `health-history.json` (shared with `gpuctl
    health`), not at samples kept in memory. Nothing is left open when building any part
    fails."""
    from gpuctl.adapters.clock import SystemClock
    from gpuctl.adapters.node import SshJobRunner
    from gpuctl.adapters.store import open_store
    from gpuctl.config.paths import state_dir
    from gpuctl.ops.gather import Gatherer, default_transport
    from gpuctl.ops.health import SampleHistory
    from gpuctl.ops.reconcile import Reconciler, ReconcileSettings

    app_ctx = context.get(ctx)
    inventory = load_inventory(ctx)
    folder = state_dir(app_ctx.env, app_ctx.state_dir)
    store = open_store(folder, write=write)
    try:
        transport = (
            app_ctx.transport_factory() if app_ctx.transport_factory else default_transport()
        )
        gatherer = Gatherer(transport)
    except BaseException:
        store.close()
        raise
    try:
        loop = Reconciler(
            store,
            gatherer,
            SshJobRunner(transport),
            inventory,
            SystemClock(),
            settings or ReconcileSettings(dry_run=not write),
            environ=app_ctx.env,
            state_dir=str(folder),
            on_action=on_action,
            health_history=SampleHistory.in_state_dir(folder) if history_file else None,
        )
    except BaseException:
        gatherer.close()
        store.close()
        raise
    return Loop(loop, gatherer, transport, inventory, folder)
