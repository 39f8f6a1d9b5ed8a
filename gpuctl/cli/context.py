"""What every command receives: global options, resolved lazily."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.protocols import Clock, Transport
from gpuctl.errors import UsageError
from gpuctl.ops.parts import LinkFactory, ssh_link
from gpuctl.ops.stores import StoreOpener, open_sqlite, url_opener

if TYPE_CHECKING:
    from gpuctl.ops.compose import Root


@dataclasses.dataclass
class AppContext:
    inventory_path: Path | None = None
    state_dir: Path | None = None  # --state-dir; else GPUCTL_STATE_DIR, else the XDG state dir
    state_url: str | None = None  # --state-url; else GPUCTL_STATE_URL; else SQLite in state_dir
    debug: bool = False
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    # Tests inject a transport here; commands otherwise build the SSH transport lazily.
    transport_factory: Callable[[], Transport] | None = None
    # How the parts are made (`gpuctl.ops.compose.Root`); tests inject their own here. A clock
    # with a `sleep` method (a test's manual clock) also decides how waits pass.
    clock: Clock = dataclasses.field(default_factory=SystemClock)
    store_opener: StoreOpener = open_sqlite  # the SQLite store of the state folder
    fleet_link: LinkFactory | None = (
        None  # None: the gatherer and SSH job runner over the transport
    )
    pollers: int | None = None  # --pollers of the polling services (None: by the fleet's size)

    def root(self) -> Root:
        """The composition root for this run: the state folder of --state-dir /
        GPUCTL_STATE_DIR / the XDG state dir, the store of --state-url / GPUCTL_STATE_URL if
        one is given (else SQLite in that folder), and the parts above."""
        from gpuctl.config.paths import state_dir
        from gpuctl.ops import compose

        opener = self.store_opener
        url = self.resolve_state_url()
        if url is not None and opener is open_sqlite:  # a test's own opener stays
            opener = url_opener(url)
        return compose.Root(
            env=self.env,
            state_dir=state_dir(self.env, self.state_dir),
            clock=self.clock,
            open_store=opener,
            transport=self.transport_factory or compose.default_transport,
            link=self.fleet_link or ssh_link,
            pollers=self.pollers,
        )

    def resolve_state_url(self) -> str | None:
        """--state-url, then GPUCTL_STATE_URL (checked: no password in it); None: SQLite."""
        from gpuctl.ops.stores import state_url

        return state_url(self.env, self.state_url)

    def resolve_inventory_path(self) -> Path:
        """-i/--inventory, then GPUCTL_INVENTORY. No implicit default: gpuctl never scans a fleet
        the operator did not name."""
        if self.inventory_path is not None:
            return self.inventory_path
        from_env = self.env.get("GPUCTL_INVENTORY")
        if from_env:
            return Path(from_env)
        raise UsageError(
            "no inventory given",
            hint="pass -i/--inventory FILE|DIR or set GPUCTL_INVENTORY",
        )


def root(ctx: typer.Context) -> Root:
    return get(ctx).root()


def get(ctx: typer.Context) -> AppContext:
    obj = ctx.find_root().obj
    if not isinstance(obj, AppContext):
        obj = AppContext()
        ctx.find_root().obj = obj
    return obj


POLLERS_OPTION = typer.Option(
    None,
    "--pollers",
    min=1,
    help="Poller processes that share the fleet's polls, each with its own SSH connections "
    "(2,000 nodes each at most): 1 polls in this process (default under 200 nodes, else one "
    "per core, 16 at most).",
    show_default=False,
)


def use_pollers(ctx: typer.Context, pollers: int | None) -> None:
    """--pollers for the fleet link this command builds (None: by the fleet's size)."""
    get(ctx).pollers = pollers
