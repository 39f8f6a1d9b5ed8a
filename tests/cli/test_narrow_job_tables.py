"""`jobs list`, `place` and `consolidate` at 60, 80 and 100 columns: job and node names whole,
REASON folded in what is left, no column squeezed to one character (as status and nodes list,
tests/cli/test_narrow_tables.py)."""

from __future__ import annotations

import re

import pytest

from gpuctl.cli.jobs import render_list
from gpuctl.cli.plan_view import (
    consolidation_table,
    consolidation_text,
    placement_table,
    placement_text,
)
from gpuctl.cli.table_fit import FitTable
from gpuctl.core.consolidation import ConsolidationPlan, FleetFigures, Migration
from gpuctl.core.jobs.model import Checkpoint, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import Allocation, JobRequest, Settings, Tier
from gpuctl.core.placement.plan import Placed, Plan, Rejection, RunnerUp, Unplaced, plan_to_dict
from gpuctl.ops.jobs import JobView
from tests.cli.test_narrow_tables import WIDTHS, _assert_fits, _columns, _render

NOW = 10_000.0
NODE = "rack12-gpu-node-0007"
WAITING = (
    "no node can take 2 × 80.0 GiB: 3 nodes: cards smaller than 80.0 GiB; "
    "1 node: cordoned by alice (fan)"
)


def _job(name: str, state: JobState, reason: str | None = None) -> Job:
    return Job(
        id=f"{name}-3f9a2c",
        name=name,
        spec=JobSpec(request=JobRequest(name=name), command=("python", "train.py", "--epochs=90")),
        state=state,
        priority=10,
        tier="standard",
        submitted_at=NOW - 3600,
        reason=reason,
        incarnation=1 if state is JobState.RUNNING else 0,
        first_started_at=NOW - 3000 if state is JobState.RUNNING else None,
        owner="alice",
    )


def _views() -> list[JobView]:
    running = _job("llama-sft", JobState.RUNNING)
    inc = Incarnation(
        job_id=running.id,
        n=1,
        node=NODE,
        cards=(0, 1, 2, 3),
        gpu_uuids=(),
        mib_per_card=81559,
        whole=True,
        state=IncarnationState.RUNNING,
        started_at=NOW - 3000,
        run_dir="/runs/x",
    )
    ckpt = Checkpoint(running.id, 1, 1200, "/ckpt/1200", NOW - 65, "shared")
    queued = _job("resnet-big", JobState.QUEUED, reason=WAITING)
    return [JobView(running, inc, ckpt), JobView(queued, None, None)]


def _listed(*, wide: bool = False) -> FitTable:
    table = render_list(_views(), NOW, wide=wide)
    assert isinstance(table, FitTable)  # a table laid out at the terminal's width
    return table


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("wide", [False, True])
def test_jobs_list_keeps_ids_and_nodes_whole_and_folds_the_reason(width: int, wide: bool) -> None:
    lines = _render(_listed(wide=wide), width)
    _assert_fits(lines, width, ("llama-sft-3f9a2c", "resnet-big-3f9a2c"))
    assert NODE in "\n".join(lines)
    headers = [h for h, _ in _columns(lines)]
    assert headers[0] == "ID" and "STATE" in headers and "NODE" in headers
    assert "REASON" in headers
    reason = " ".join(line[lines[0].index("REASON") :].strip() for line in lines[1:])
    assert "1 node: cordoned by alice (fan)" in " ".join(reason.split())  # folded, not lost


def test_jobs_list_drops_the_tier_before_the_name_and_shows_all_when_wide() -> None:
    headers = [h for h, _ in _columns(_render(_listed(), 100))]
    assert "TIER" not in headers and "NAME" in headers
    piped = [h for h, _ in _columns(_render(_listed(), 200))]
    assert piped[:9] == ["ID", "NAME", "OWNER", "STATE", "TIER", "PRI", "NODE", "CARDS", "INC"]


# --- place and consolidate ----------------------------------------------------------------------

OTHER = "rack12-gpu-node-0008"
NOT_PLACED = (
    "no node can take 8 × whole cards of model H100: 1 node: cordoned; 1 node: health unknown; "
    "1 node: unreachable (timeout); 1 node: fewer than 8 empty usable cards"
)


def _plan() -> Plan:
    alloc = Allocation(job="llama-sft", node=NODE, cards=(0, 1, 2, 3), mib_per_card=81559)
    placed = Placed(
        job="llama-sft",
        allocation=alloc,
        card_uuids=("GPU-0", "GPU-1", "GPU-2", "GPU-3"),
        score=87.5,
        runner_up=RunnerUp(OTHER, 80.1),
        feasible_nodes=3,
        shape="4 × whole cards",
        rejections=(Rejection("unschedulable", "cordoned", ("gpu01", "gpu02", "gpu03", "gpu07")),),
    )
    unplaced = Unplaced(
        job="resnet-big",
        tier=Tier.STANDARD,
        priority=0,
        shape="8 × whole cards",
        reason=NOT_PLACED,
        rejections=(Rejection("gpu_count", "fewer than 8 empty usable cards", (NODE, OTHER)),),
    )
    return Plan("v1", Settings(), (placed, unplaced), 0.1, 0.3, (), "v2", 4, 3)


def _fits_lines(text: str, width: int) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("wide", [False, True])
def test_place_keeps_job_and_node_names_whole_and_folds_why_not(width: int, wide: bool) -> None:
    lines = _render(placement_table(_plan(), wide=wide), width)
    _assert_fits(lines, width, ("llama-sft", "resnet-big"))
    assert NODE in "\n".join(lines)
    text = placement_text(_plan(), explain=True, wide=wide, width=width)
    _fits_lines(text, width)
    assert "fewer than 8 empty usable cards" in " ".join(text.split())  # folded, not lost
    assert "  resnet-big: no node can take" in text


def test_place_explain_folds_each_list_of_nodes_and_json_keeps_them() -> None:
    text = placement_text(_plan(), explain=True, wide=False, width=None)
    assert "4 nodes [unschedulable] cordoned: gpu[01-03,07]" in text
    cards = "2 nodes [gpu_count] fewer than 8 empty usable cards"
    assert f"{cards}: rack12-gpu-node-[0007-0008]" in text
    doc = plan_to_dict(_plan())
    assert doc["jobs"][0]["rejections"][0]["nodes"] == ["gpu01", "gpu02", "gpu03", "gpu07"]


def _moves() -> ConsolidationPlan:
    figures = FleetFigures(2, 0, 100_000, 20_000.0, 640_000)
    moves = tuple(
        Migration(
            job=f"{name}-3f9a2c",
            tier=Tier.STANDARD,
            from_node=src,
            from_cards=(4, 5, 6, 7),
            to_node=NODE,
            to_cards=cards,
            mib_per_card=20480,
            whole=False,
            checkpoint_age_s=65.0,
            stranded_freed_mib=1024.0,
        )
        for name, src, cards in (
            ("llama-sft", OTHER, (0, 1, 2, 3)),
            ("resnet", "rack12-gpu-node-0009", (4, 5)),
        )
    )
    return ConsolidationPlan("v1", "v2", "s1", 10, moves, figures, figures, (), "done")


@pytest.mark.parametrize("width", WIDTHS)
def test_consolidate_keeps_job_and_node_names_whole(width: int) -> None:
    lines = _render(consolidation_table(_moves()), width)
    _assert_fits(lines, width, ("llama-sft-3f9a2c", "resnet-3f9a2c"))
    text = "\n".join(lines)
    for node in (NODE, OTHER, "rack12-gpu-node-0009"):
        assert re.search(rf"(^|  ){re.escape(node)}\b", text, re.M), text
    _fits_lines(consolidation_text(_moves(), width), width)


def test_consolidate_says_which_nodes_it_empties_and_fills_folded() -> None:
    text = consolidation_text(_moves(), None)
    assert f"moves jobs off rack12-gpu-node-[0008-0009] onto {NODE}\n" in text
