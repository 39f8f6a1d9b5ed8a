"""The dashboard over a fleet that Slurm runs: a node Slurm drains shows cordoned with Slurm's
reason and who set it, and a Slurm job's cards count as allocated."""

from __future__ import annotations

import dataclasses

from gpuctl.core.model import NodeState
from gpuctl.core.scheduler import SchedJob, SchedNode, SchedulerView
from gpuctl.ops.dashboard import Services, collect
from tests.tui.conftest import ScriptedSource


def test_a_slurm_drain_and_a_slurm_jobs_cards_show_in_the_dashboard(
    services: Services, source: ScriptedSource
) -> None:
    view = SchedulerView(
        nodes=(
            SchedNode("gpu-02", "IDLE", ("DRAIN",), reason="bad fan", reason_by="root"),
            SchedNode("gpu-03", "MIXED"),
        ),
        jobs=(SchedJob("77", "gpu-03", (0, 1), user="bob", name="train"),),
    )
    source.snapshot = dataclasses.replace(source.snapshot, scheduler=view)
    data = collect(services)
    drained = data.node("gpu-02")
    assert drained is not None
    assert drained.status.state is NodeState.CORDONED
    assert drained.status.reason == "Slurm IDLE+DRAIN: bad fan"
    assert drained.status.by == "root"
    busy = data.node("gpu-03")
    assert busy is not None and busy.placement is not None
    assert [c.allocated_mib > 0 for c in busy.placement.cards] == [True, True]
