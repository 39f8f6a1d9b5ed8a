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

from gpuctl.ops.dashboard import DashData
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
        summary.update(head)
        needle = self.filter
        self.query_one("#gpus", KeyedTable).sync(
            [r for r in rows.gpu_rows(node) if rows.matches(needle, r[1])]
        )
        self.query_one("#processes", KeyedTable).sync(rows.process_rows(node))
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

    def action_cordon(self) -> None:
        self.post_message(ActionRequested("cordon", self.node_name))

    def action_uncordon(self) -> None:
        self.post_message(ActionRequested("uncordon", self.node_name))

    def action_drain(self) -> None:
        self.post_message(ActionRequested("drain", self.node_name))
