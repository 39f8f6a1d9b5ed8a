"""CLI tables at 60, 80 and 100 columns: node names whole, no column squeezed to one character,
free text (NOTES, REASON) folded in what is left, low-priority columns dropped rather than cut."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console, RenderableType

from gpuctl.cli.fleet_view import fleet_table, gpu_table
from gpuctl.cli.health import health_table
from gpuctl.cli.node_view import node_detail
from gpuctl.cli.table_fit import FREE, KEY, Col, FitTable, layout
from gpuctl.core.health.model import Action, NodeVerdict, Reason, Severity, Verdict
from gpuctl.core.model import (
    FleetSnapshot,
    GpuSnapshot,
    NodeSnapshot,
    NodeSpec,
    NodeState,
    Observation,
    Reach,
)

NAMES = ("rack12-gpu-node-0007", "rack12-gpu-node-0008", "rack12-gpu-node-0009")
DOWN_ERROR = (
    "rack12-gpu-node-0009 did not answer: [Errno 111] Connect call failed "
    "('10.12.0.9', 22): connection refused; check sshd on the node"
)
WIDTHS = (60, 80, 100)


def _gpu(i: int) -> GpuSnapshot:
    return GpuSnapshot(
        index=i,
        uuid=f"GPU-{i}",
        model="NVIDIA H100 80GB HBM3",
        mem_total_mib=81559,
        mem_used_mib=4096,
        util_pct=37,
        temp_c=55,
        power_w=312.0,
        ecc_volatile_uncorrected=0,
    )


def _fleet() -> FleetSnapshot:
    up = tuple(
        NodeSnapshot(
            name=name,
            reach=Reach.OK,
            state=NodeState.READY,
            observation=Observation(gpus=tuple(_gpu(i) for i in range(8))),
            taken_at=1000.0,
        )
        for name in NAMES[:2]
    )
    down = NodeSnapshot(name=NAMES[2], reach=Reach.REFUSED, state=NodeState.DOWN, error=DOWN_ERROR)
    return FleetSnapshot(taken_at=1000.0, nodes=(*up, down))


def _specs() -> dict[str, NodeSpec]:
    return {n: NodeSpec(name=n, host="10.12.0.7", expected_gpus=8) for n in NAMES}


def _render(renderable: RenderableType, width: int) -> list[str]:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(renderable, crop=False)
    return [line.rstrip() for line in buf.getvalue().splitlines()]


def _columns(lines: list[str]) -> list[tuple[str, int]]:
    """Each header of the table's first line with the width up to the next header."""
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"(?:(?<=^)|(?<=  ))\S", header)]
    ends = [*(s - 2 for s in starts[1:]), max(len(line) for line in lines)]
    return [(header[s:e].strip(), e - s) for s, e in zip(starts, ends, strict=True)]


def _assert_fits(lines: list[str], width: int, names: tuple[str, ...]) -> None:
    text = "\n".join(lines)
    for name in names:
        assert re.search(rf"^{re.escape(name)}\b", text, re.M), f"{name} cut at {width}:\n{text}"
    for header, w in _columns(lines):
        assert w >= len(header) > 1, f"{header} squeezed to {w} at {width}:\n{text}"
    assert max(len(line) for line in lines) <= width, text


@pytest.mark.parametrize("width", WIDTHS)
def test_the_fleet_table_keeps_node_names_whole_and_folds_a_down_nodes_notes(width: int) -> None:
    lines = _render(fleet_table(_fleet(), _specs()), width)
    _assert_fits(lines, width, NAMES)
    headers = [h for h, _ in _columns(lines)]
    assert headers[:2] == ["NODE", "STATE"] and headers[-1] == "NOTES"
    notes = " ".join(line[lines[0].index("NOTES") :].strip() for line in lines[1:])
    assert "connection refused; check sshd on the node" in notes  # folded, not lost
    notes_lines = sum(1 for line in lines if line.strip() and len(line) > lines[0].index("NOTES"))
    assert notes_lines <= 8  # a few folded lines, never one character per line


def test_the_fleet_table_drops_the_model_before_anything_at_100_columns() -> None:
    headers = [h for h, _ in _columns(_render(fleet_table(_fleet(), _specs()), 100))]
    assert headers == ["NODE", "STATE", "GPUS", "MEM GiB", "UTIL", "TEMP", "NOTES"]
    wide = [h for h, _ in _columns(_render(fleet_table(_fleet(), _specs()), 200))]
    assert "MODEL" in wide


@pytest.mark.parametrize("width", WIDTHS)
def test_the_gpu_table_keeps_node_names_whole(width: int) -> None:
    lines = _render(gpu_table(_fleet()), width)
    _assert_fits(lines, width, NAMES)


@pytest.mark.parametrize("width", WIDTHS)
def test_nodes_show_keeps_the_name_whole_in_its_gpu_table(width: int) -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None)
    node = _fleet().nodes[0]
    node_detail(console, node, _specs()[node.name])
    lines = [line.rstrip() for line in buf.getvalue().splitlines()]
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("NODE")) :]
    _assert_fits(table, width, (node.name,))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_health_table_keeps_node_names_whole_and_folds_reasons(width: int) -> None:
    reason = Reason(
        rule="ecc_uncorrected",
        text="GPU 3 reports 2 uncorrected ECC errors since boot: drain the node and reset the card",
        severity=Severity.CRITICAL,
        action=Action.DRAIN,
        gpu=3,
    )
    verdicts = [
        NodeVerdict(
            name=name,
            verdict=Verdict.UNHEALTHY if i == 0 else Verdict.HEALTHY,
            severity=Severity.CRITICAL if i == 0 else Severity.OK,
            action=Action.DRAIN if i == 0 else Action.NONE,
            reasons=(reason,) if i == 0 else (),
            gpus=(),
        )
        for i, name in enumerate(NAMES)
    ]
    for wide in (False, True):
        lines = _render(health_table(verdicts, wide=wide), width)
        _assert_fits(lines, width, NAMES)
        assert "drain the node and reset the card" in " ".join(" ".join(lines).split())


def test_a_table_wider_than_the_terminal_keeps_its_key_columns_whole() -> None:
    table = FitTable((Col("NODE", KEY), Col("NOTES", FREE), Col("TEMP", drop=1)))
    table.add_row("a-very-long-node-name-that-does-not-fit-anywhere", "x " * 40, "55C")
    lines = _render(table, 40)
    assert lines[1].startswith("a-very-long-node-name-that-does-not-fit-anywhere")
    assert "TEMP" not in lines[0]  # dropped before anything is cut
    fit = layout(table.cols, table.rows, 40)
    assert fit.widths[fit.shown.index(1)] == 20  # the notes keep their floor width
