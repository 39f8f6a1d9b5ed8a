"""One node: its GPUs (memory allocated vs observed, util, temp, health), processes, health
reasons and cordon history."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Static

from gpuctl.ops.dashboard import DashData, NodeView, ProcessOwners, read_owners
from gpuctl.tui import format as fmt
from gpuctl.tui import rows
from gpuctl.tui.messages import ActionRequested
from gpuctl.tui.screens.base import DashScreen
from gpuctl.tui.widgets.table import KeyedTable


class NodeScreen(DashScreen):
    NAME = "node"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "cordon", "Cordon"),
        Binding("u", "uncordon", "Uncordon"),
        Binding("d", "drain", "Drain"),
    ]
    KEYS = (("c / u", "cordon / uncordon this node"), ("d", "drain this node"))

    def __init__(self, name: str) -> None:
        super().__init__()
        self.node_name = name
        self.owners: ProcessOwners | None = None  # whose each GPU process is, once read
        self._reading: frozenset[int] | None = None  # the pids being matched now

    def heading(self) -> str:
        return f"node {fmt.safe(self.node_name)}"

    def compose_body(self) -> Iterator[Widget]:
        yield Static(id="node-summary")
        yield KeyedTable(rows.GPU_COLUMNS, id="gpus")
        with Horizontal(id="node-lower"):
            yield KeyedTable(rows.PROCESS_COLUMNS, id="processes")
            yield Static(id="node-notes")

    def on_mount(self) -> None:
        self.query_one("#gpus", KeyedTable).focus()
        super().on_mount()

    def show(self, data: DashData) -> None:
        node = data.node(self.node_name)
        summary = self.query_one("#node-summary", Static)
        if node is None:
            summary.update(Text(f"{self.node_name}: not in this fleet", style="bold red"))
            self.query_one("#gpus", KeyedTable).sync([])
            self.query_one("#processes", KeyedTable).sync([])
            return
        head = Text()
        head.append(fmt.safe(node.name), style="bold")
        head.append("  ")
        head.append_text(fmt.state_text(node.state, node.reach).text())
        facts = node.snapshot.observation.facts if node.snapshot.observation else None
        if facts is not None:
            head.append(
                f"  driver {fmt.safe(facts.driver_version or '-')}"
                f"  CUDA {fmt.safe(facts.cuda_version or '-')}"
            )
        if node.snapshot.latency_s is not None:
            head.append(f"  answered in {node.snapshot.latency_s:.2f}s")
        if node.snapshot.error:
            head.append(f"\n{fmt.safe(node.snapshot.error)}", style="red")
        if node.jobs:
            head.append(f"\njobs here: {fmt.safe(', '.join(node.jobs))}")
        if self.owners is not None and self.owners.note:
            head.append(f"\n{fmt.safe(self.owners.note)}", style="yellow")
        summary.update(head)
        needle = self.filter
        self.query_one("#gpus", KeyedTable).sync(
            [
                r
                for r in rows.gpu_rows(node, self.dash.gpu_history.series(node.name))
                if rows.matches(needle, r[1])
            ]
        )
        self._read_owners(node)
        owners = self.owners.owners if self.owners is not None else None
        self.query_one("#processes", KeyedTable).sync(rows.process_rows(node, owners))
        notes = Text("Health\n", style="bold")
        notes.append("\n".join(rows.node_reasons(node)) or "no findings")
        notes.append("\n\nCordon history\n", style="bold")
        if node.cordon is not None:
            c = node.cordon
            notes.append(
                f"cordoned now by {fmt.safe(c.operator)} ({c.source}): {fmt.safe(c.reason)}\n",
                style="yellow",
            )
        history = rows.cordon_history(data, node.name, self.dash.offset_s)
        notes.append("\n".join(history) or "none recorded")
        self.query_one("#node-notes", Static).update(notes)

    def _read_owners(self, node: NodeView) -> None:
        """Match the GPU processes to jobs again when the probe's pids changed (one exec on
        the node, in a worker)."""
        obs = node.snapshot.observation
        pids = frozenset(p.pid for p in obs.processes) if obs is not None else frozenset()
        known = self.owners.pids if self.owners is not None else None
        if not pids or pids == known or pids == self._reading:
            return
        self._reading = pids
        services, name = self.dash.services, self.node_name
        self.dash.background(
            lambda: read_owners(services.open_store, services.processes, name, pids),
            self._owners_read,
            name="processes",
        )

    def _owners_read(self, owners: ProcessOwners) -> None:
        self.owners = owners
        if self._reading == owners.pids:
            self._reading = None
        data = self.dash.data
        if data is not None and self.is_attached:
            self.show(data)

    def action_cordon(self) -> None:
        self.post_message(ActionRequested("cordon", self.node_name))

    def action_uncordon(self) -> None:
        self.post_message(ActionRequested("uncordon", self.node_name))

    def action_drain(self) -> None:
        self.post_message(ActionRequested("drain", self.node_name))
