"""`jobs list`, `place` and `consolidate` at 60, 80 and 100 columns: job and node names whole,
REASON folded in what is left, no column squeezed to one character (as status and nodes list,
tests/cli/test_narrow_tables.py)."""

from __future__ import annotations

import pytest

from gpuctl.cli.jobs import render_list
from gpuctl.cli.table_fit import FitTable
from gpuctl.core.jobs.model import Checkpoint, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
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
