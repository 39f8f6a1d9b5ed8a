"""What every command receives: global options, resolved lazily."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

import typer

from gpuctl.errors import UsageError

DEFAULT_INVENTORY = Path("inventory")


@dataclasses.dataclass
class AppContext:
    inventory_path: Path | None = None
    debug: bool = False
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))

    def resolve_inventory_path(self) -> Path:
        """-i/--inventory, then GPUCTL_INVENTORY, then ./inventory."""
        if self.inventory_path is not None:
            return self.inventory_path
        from_env = self.env.get("GPUCTL_INVENTORY")
        if from_env:
            return Path(from_env)
        if DEFAULT_INVENTORY.exists():
            return DEFAULT_INVENTORY
        raise UsageError(
            "no inventory given",
            hint="pass -i/--inventory FILE|DIR, set GPUCTL_INVENTORY, or run in a folder "
            "that has inventory/",
        )


def get(ctx: typer.Context) -> AppContext:
    obj = ctx.find_root().obj
    if not isinstance(obj, AppContext):
        obj = AppContext()
        ctx.find_root().obj = obj
    return obj
