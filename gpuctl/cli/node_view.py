"""`gpuctl nodes show` rendering."""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from gpuctl.adapters.clock import local_stamp
from gpuctl.cli.fleet_view import gpu_table
from gpuctl.cli.render import safe
from gpuctl.cli.table_fit import FREE, Col, FitTable
from gpuctl.core.fleet.nodestate import NodeStatus, node_status
from gpuctl.core.health.poll_hints import node_hints
from gpuctl.core.model import FleetSnapshot, NodeSnapshot, NodeSpec, NodeState
from gpuctl.core.timefmt import ago


def node_detail(
    console: Console, node: NodeSnapshot, spec: NodeSpec, status: NodeStatus | None = None
) -> None:
    status = status or node_status(node)
    facts = node.observation.facts if node.observation else None
    rows = [
        ("node", node.name),
        ("address", f"{spec.user + '@' if spec.user else ''}{spec.address}"),
        ("state", f"{status.state.value} ({node.reach.value})"),
        *_state_rows(status),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(spec.labels.items())) or "-"),
        ("latency", "-" if node.latency_s is None else f"{node.latency_s * 1000:.0f} ms"),
    ]
    if node.error:
        rows.append(("error", node.error))
    if facts is not None:
        rows += [
            ("hostname", facts.hostname or "-"),
            ("driver", facts.driver_version or "-"),
            ("cuda", facts.cuda_version or "-"),
            ("cpus", "-" if facts.cpu_count is None else str(facts.cpu_count)),
            (
                "host memory",
                "-"
                if facts.host_mem_total_mib is None
                else f"{facts.host_mem_available_mib or 0} MiB free of {facts.host_mem_total_mib}",
            ),
        ]
    hints = node_hints(node, spec.expected_gpus)
    if hints:
        rows.append(("hints", "; ".join(hints)))
    head = Table.grid(padding=(0, 2))
    head.add_column(no_wrap=True)
    head.add_column(overflow="fold")
    for key, value in rows:
        head.add_row(key, safe(value))
    console.print(head)
    if node.observation is None:
        return
    console.print()
    gpus = gpu_table(FleetSnapshot(taken_at=node.taken_at or 0.0, nodes=(node,)))
    console.print(gpus, crop=False)  # wider than the terminal only if the node's name is
    obs = node.observation
    if obs.processes:
        procs = FitTable((Col("PID"), Col("GPU"), Col("MEM MiB"), Col("NAME", FREE)))
        by_uuid = {g.uuid: g.index for g in obs.gpus}
        for p in obs.processes:
            gpu = by_uuid.get(p.gpu_uuid)
            procs.add_row(
                str(p.pid),
                "-" if gpu is None else str(gpu),
                "-" if p.used_mib is None else str(p.used_mib),
                safe(p.name or "-"),
            )
        console.print()
        console.print(procs)
    if obs.xids:
        console.print()
        for x in obs.xids:
            console.print(safe(f"XID {x.xid} {x.pci_bus_id or ''} {x.at or ''} {x.message}"))
    for note in obs.notes:
        console.print(safe(f"note: {note}"))


def _state_rows(status: NodeStatus) -> list[tuple[str, str]]:
    """Why a node is cordoned, draining or unknown, by whom and since when (a down node's reason
    is its error row)."""
    if status.state is NodeState.UNKNOWN:
        return [("reason", status.reason or "-")]
    if not status.cordoned:
        return []
    by = status.by or "-"
    when = "-"
    if status.since is not None:
        when = f"{local_stamp(status.since)} ({ago(status.since, time.time())})"
    return [
        ("reason", status.reason or "-"),
        ("by", f"{by} ({status.source})" if status.source else by),
        ("since", when),
    ]
