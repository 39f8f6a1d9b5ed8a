"""Rendering of fleet snapshots: tables for people, documents for scripts. No business rules:
each node's state comes from `core.fleet.nodestate` (`ops.fleetstatus.node_states` with the
store)."""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, RenderableType

from gpuctl.cli.render import Output, emit_document, safe
from gpuctl.cli.table_fit import FREE, KEY, Col, FitTable
from gpuctl.core.fleet.nodestate import NodeStatus, node_status
from gpuctl.core.health.poll_hints import gpu_hints, node_hints
from gpuctl.core.model import FleetSnapshot, NodeSnapshot, NodeSpec, Reach, fleet_to_dict
from gpuctl.core.timefmt import ago

States = Mapping[str, NodeStatus]  # node name -> its state (`ops.fleetstatus.node_states`)


def stdout_console() -> Console:
    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, width=None if tty else 200, highlight=False, soft_wrap=False)


def print_table(table: RenderableType) -> None:
    """Print a table on stdout; when piped, without colour and without trailing blanks."""
    if sys.stdout.isatty():  # wider than the terminal only if the names alone are
        stdout_console().print(table, crop=False)
        return
    buf = io.StringIO()
    Console(file=buf, width=200, highlight=False, color_system=None).print(table, crop=False)
    sys.stdout.write("\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n")


def _mib_gib(mib: int | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f}"


def _na(value: object, suffix: str = "") -> str:
    return "-" if value is None else f"{value}{suffix}"


def render_fleet(
    fleet: FleetSnapshot,
    specs: Mapping[str, NodeSpec],
    output: Output,
    states: States | None = None,
) -> None:
    """The fleet on stdout: one document for json/yaml, the node table (and for wide the GPU
    table) otherwise. `states`: each node's state with the store's cordons (None: no store)."""
    if output in (Output.JSON, Output.YAML):
        emit_document(fleet_document(fleet, specs, states), output)
        return
    print_table(fleet_table(fleet, specs, states))
    if output is Output.WIDE:
        sys.stdout.write("\n")
        print_table(gpu_table(fleet))


def summary(fleet: FleetSnapshot) -> dict[str, Any]:
    answered = [n for n in fleet.nodes if n.reach is Reach.OK]
    gpus = [g for n in answered for g in n.gpus]
    totals = [g.mem_total_mib for g in gpus if g.mem_total_mib is not None]
    used = [g.mem_used_mib for g in gpus if g.mem_used_mib is not None]
    return {
        "nodes": len(fleet.nodes),
        "nodes_answered": len(answered),
        "gpus": len(gpus),
        "mem_total_mib": sum(totals),
        "mem_used_mib": sum(used),
    }


def status_of(node: NodeSnapshot, states: States | None) -> NodeStatus:
    found = states.get(node.name) if states is not None else None
    return found if found is not None else node_status(node)


def fleet_document(
    fleet: FleetSnapshot, specs: Mapping[str, NodeSpec], states: States | None = None
) -> dict[str, Any]:
    """`fleet_to_dict` with each node's address, expected GPUs, hints, and its state (`state`,
    with `state_reason`, `state_by`, `state_source`, `state_since`)."""
    doc = fleet_to_dict(fleet)
    for node, data in zip(fleet.nodes, doc["nodes"], strict=True):
        data.update(status_of(node, states).to_dict())
        spec = specs.get(node.name)
        data["host"] = spec.host if spec else None
        data["port"] = spec.port if spec else None
        data["expected_gpus"] = spec.expected_gpus if spec else None
        data["hints"] = list(node_hints(node, spec.expected_gpus if spec else None))
    doc["summary"] = summary(fleet)
    return doc


def state_cell(node: NodeSnapshot, status: NodeStatus) -> str:
    if node.reach is Reach.OK:
        return status.state.value
    return f"{status.state.value} ({node.reach.value})"


def cordon_note(status: NodeStatus, now: float | None = None) -> str | None:
    """`cordoned by bob 5m08s ago: maintenance` for a node a cordon keeps from new work."""
    if not status.cordoned:
        return None
    by = status.by or "-"
    if status.source == "health":
        by += " (health)"
    when = ""
    if status.since is not None:
        when = " " + ago(status.since, time.time() if now is None else now)
    return f"cordoned by {by}{when}: {status.reason or '-'}"


# Node names whole; NOTES folds in what is left; when too narrow MODEL goes first, then TEMP…
FLEET_COLUMNS = (
    Col("NODE", KEY),
    Col("STATE"),
    Col("GPUS", drop=2),
    Col("MODEL", drop=5),
    Col("MEM GiB", drop=1),
    Col("UTIL", drop=3),
    Col("TEMP", drop=4),
    Col("NOTES", FREE),
)
GPU_COLUMNS = (
    Col("NODE", KEY),
    Col("GPU"),
    Col("MODEL", drop=6),
    Col("MEM MiB", drop=1),
    Col("UTIL", drop=4),
    Col("TEMP", drop=5),
    Col("POWER", drop=7),
    Col("ECC U", drop=3),
    Col("PROCS", drop=2),
    Col("NOTES", FREE),
)


def fleet_table(
    fleet: FleetSnapshot, specs: Mapping[str, NodeSpec], states: States | None = None
) -> FitTable:
    now = time.time()
    table = FitTable(FLEET_COLUMNS)
    for node in fleet.nodes:
        spec = specs.get(node.name)
        expected = spec.expected_gpus if spec else None
        gpus = node.gpus
        models = sorted({g.model for g in gpus if g.model})
        used = [g.mem_used_mib for g in gpus if g.mem_used_mib is not None]
        total = [g.mem_total_mib for g in gpus if g.mem_total_mib is not None]
        utils = [g.util_pct for g in gpus if g.util_pct is not None]
        temps = [g.temp_c for g in gpus if g.temp_c is not None]
        count = "-" if node.observation is None else str(len(gpus))
        if expected is not None and node.observation is not None:
            count = f"{len(gpus)}/{expected}"
        status = status_of(node, states)
        cordon = cordon_note(status, now)
        hints = node_hints(node, expected)
        notes = node.error or "; ".join([cordon, *hints] if cordon else hints)
        table.add_row(
            safe(node.name),
            state_cell(node, status),
            count,
            safe(", ".join(models)) or "-",
            f"{_mib_gib(sum(used))}/{_mib_gib(sum(total))}" if total else "-",
            f"{sum(utils) / len(utils):.0f}%" if utils else "-",
            f"{max(temps)}C" if temps else "-",
            safe(notes),
        )
    return table


def gpu_table(fleet: FleetSnapshot) -> FitTable:
    table = FitTable(GPU_COLUMNS)
    for node in fleet.nodes:
        if not node.gpus:
            table.add_row(
                safe(node.name), "-", "-", "-", "-", "-", "-", "-", "-", safe(node.error or "")
            )
            continue
        procs = node.observation.processes if node.observation else ()
        for gpu in node.gpus:
            n_procs = sum(1 for p in procs if p.gpu_uuid == gpu.uuid)
            table.add_row(
                safe(node.name),
                str(gpu.index),
                safe(gpu.model or "-"),
                f"{_na(gpu.mem_used_mib)}/{_na(gpu.mem_total_mib)}",
                _na(gpu.util_pct, "%"),
                _na(gpu.temp_c, "C"),
                "-" if gpu.power_w is None else f"{gpu.power_w:.0f}W",
                _na(gpu.ecc_volatile_uncorrected),
                str(n_procs),
                safe("; ".join(gpu_hints(gpu))),
            )
    return table
