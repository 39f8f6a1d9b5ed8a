"""Placement as a service: the fleet to place on, from a snapshot (live or saved), and a plan.

The fleet view itself (ghost memory, schedulability, cordons) is the core's
(`gpuctl.core.fleet.view`); `fleetstatus.fleet_state` adds the store's allocations and cordons.
Nothing here changes the fleet.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuctl.adapters.protocols import Store, Transport
from gpuctl.core import timefmt
from gpuctl.core.fleet.scheduler import SbatchOptions, sbatch_options
from gpuctl.core.model import FleetSnapshot, Inventory, fleet_from_dict
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.model import WHOLE, JobRequest, Settings
from gpuctl.core.placement.plan import Plan
from gpuctl.errors import GpuctlError, UsageError

MAX_SNAPSHOT_BYTES = 64 << 20


def load_snapshot(path: Path) -> FleetSnapshot:
    """A saved `gpuctl status -o json` document. Raises UsageError naming the file."""
    hint = "save one with `gpuctl status -o json > FILE`"
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_SNAPSHOT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the snapshot: {exc.strerror or exc}") from None
    if len(raw) > MAX_SNAPSHOT_BYTES:
        raise UsageError(f"{path}: the snapshot is larger than {MAX_SNAPSHOT_BYTES >> 20} MiB")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{path}: the snapshot is not UTF-8 text", hint=hint) from None
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path}:{exc.lineno}: the snapshot is not JSON: {exc.msg}", hint=hint
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise UsageError(f"{path}: not a fleet snapshot (no 'nodes' list)", hint=hint)
    try:
        return fleet_from_dict(_epoch_times(data))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise UsageError(f"{path}: not a fleet snapshot: {detail}", hint=hint) from None


def _epoch_times(data: dict[str, Any]) -> dict[str, Any]:
    """`taken_at` as `fleet_from_dict` reads it (epoch seconds) from the RFC 3339 that `-o json`
    prints; a snapshot saved before that holds epoch seconds already."""
    nodes = [
        {**n, "taken_at": timefmt.epoch(n.get("taken_at"))} if isinstance(n, dict) else n
        for n in data["nodes"]
    ]
    return {**data, "taken_at": timefmt.epoch(data.get("taken_at")), "nodes": nodes}


def gather_snapshot(
    inventory: Inventory, *, transport_factory: Callable[[], Transport] | None = None
) -> FleetSnapshot:
    """One live poll of the inventory (read-only)."""
    from gpuctl.ops.gather import gather_fleet

    transport = transport_factory() if transport_factory else None
    return gather_fleet(inventory, transport=transport)


def place(
    jobs: Sequence[JobRequest],
    settings: Settings,
    snapshot: FleetSnapshot,
    store: Store | None = None,
) -> Plan:
    """Where `jobs` would go on the fleet of `snapshot` as the control loop sees it: with the
    cards gpuctl granted and the cordons in `store` (`fleetstatus.fleet_state`, the loop's own
    view; none without a store). Changes nothing."""
    from gpuctl.ops.fleetstatus import fleet_state

    return plan(fleet_state(snapshot, store), jobs, settings)


def place_for_slurm(
    jobs: Sequence[JobRequest],
    settings: Settings,
    snapshot: FleetSnapshot,
    store: Store | None = None,
) -> tuple[Plan, tuple[SbatchOptions, ...]]:
    """`place` on Slurm's nodes alone, each job on whole cards (Slurm gives a GPU whole), and
    the `sbatch` options of each placed job (`gpuctl place --emit sbatch`). UsageError when
    the snapshot has no Slurm view; GpuctlError when Slurm could not be read."""
    view = snapshot.scheduler
    if view is None:
        raise UsageError(
            "--emit sbatch: the inventory reads no Slurm cluster",
            hint="add a slurm: section to the inventory (docs/slurm.md)",
        )
    if view.error is not None:
        raise GpuctlError(f"--emit sbatch: Slurm could not be read: {view.error}")
    names = {n.name for n in view.nodes}
    on_slurm = dataclasses.replace(
        snapshot, nodes=tuple(n for n in snapshot.nodes if n.name in names)
    )
    whole = [
        dataclasses.replace(j, shape=dataclasses.replace(j.shape, mem_per_card=WHOLE)) for j in jobs
    ]
    result = place(whole, settings, on_slurm, store)
    shapes = {j.name: j.shape for j in whole}
    emitted = tuple(sbatch_options(p, shapes[p.job], view.node(p.node)) for p in result.placed)
    return result, emitted
