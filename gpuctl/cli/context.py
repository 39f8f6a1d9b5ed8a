"""What every command receives: global options, resolved lazily."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import typer

from gpuctl.adapters.protocols import Transport
from gpuctl.errors import UsageError


@dataclasses.dataclass
class AppContext:
    inventory_path: Path | None = None
    state_dir: Path | None = None  # --state-dir; else GPUCTL_STATE_DIR, else the XDG state dir
    debug: bool = False
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    # Tests inject a transport here; commands otherwise build the SSH transport lazily.
    transport_factory: Callable[[], Transport] | None = None

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


def get(ctx: typer.Context) -> AppContext:
    obj = ctx.find_root().obj
    if not isinstance(obj, AppContext):
        obj = AppContext()
        ctx.find_root().obj = obj
    return obj
