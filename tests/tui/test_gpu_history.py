"""Per-GPU history on the node screen: each GPU's utilization and memory in use over the last
polls (`gpuctl.ops.dashboard.GpuHistory`), drawn as sparklines."""

from __future__ import annotations

import dataclasses

from gpuctl.core.model import Observation, Reach
from gpuctl.ops.dashboard import GpuHistory, Services
from gpuctl.tui import format as fmt
from gpuctl.tui.rows import GPU_COLUMNS
from gpuctl.tui.screens.node import NodeScreen
from gpuctl.tui.widgets.table import KeyedTable

from .conftest import MIB, ScriptedSource, fleet, keys, make_app, node, screen_text, settle

SIZE = (200, 40)


def test_each_gpu_keeps_its_utilization_and_memory_per_poll_with_gaps() -> None:
    history = GpuHistory(points=3)
    for used in ([0, 0], [MIB // 2, 0], [MIB, 0], [MIB, MIB // 4]):
        history.record([node("gpu-01", gpus=2, used_mib=used)])
    history.record([node("gpu-01", reach=Reach.TIMEOUT)])  # no answer: a gap
    utils, mems = history.series("gpu-01")[0]
    assert utils == [50.0, 50.0, None] and mems == [100.0, 100.0, None]  # the last 3 polls
    assert history.series("gpu-01")[1] == ([0.0, 50.0, None], [0.0, 25.0, None])
    assert history.series("nowhere") == {}


def test_a_gpu_whose_use_could_not_be_read_has_a_gap_its_neighbours_do_not() -> None:
    history = GpuHistory()
    snap = node("gpu-01", gpus=2, used_mib=[MIB])
    assert snap.observation is not None
    unread = dataclasses.replace(snap.observation.gpus[0], util_pct=None, mem_used_mib=None)
    gpus = (unread, snap.observation.gpus[1])
    history.record([dataclasses.replace(snap, observation=Observation(gpus=gpus))])
    assert history.series("gpu-01") == {0: ([None], [None]), 1: ([0.0], [0.0])}


async def test_the_node_screen_draws_each_gpus_history(
    services: Services, source: ScriptedSource
) -> None:
    app = make_app(services)
    async with app.run_test(size=SIZE) as pilot:
        for used in (0, MIB // 4, MIB // 2, MIB):  # GPU 1 of gpu-02 fills up over four polls
            source.snapshot = fleet(node("gpu-01"), node("gpu-02", used_mib=[0, used]))
            await keys(app, pilot, "r")
        await settle(app, pilot)
        await keys(app, pilot, "colon", *"node gpu-02", "enter")
        assert isinstance(app.screen, NodeScreen)
        gpus = app.screen.query_one("#gpus", KeyedTable)
        column = dict(zip([k for k, _ in GPU_COLUMNS], range(len(GPU_COLUMNS)), strict=True))
        row1, row0 = gpus.shown("1"), gpus.shown("0")
        _, mems = app.gpu_history.series("gpu-02")[1]
        assert [m for m in mems if m][:3] == [25.0, 50.0, 100.0]  # one point per poll
        assert row1[column["mem_hist"]] == fmt.sparkline(mems, 20, lo=0, hi=100)
        assert "▁▃▅█" in row1[column["mem_hist"]]  # filling up, on a 0-100% scale
        assert "▁▅" in row1[column["util_hist"]]  # 0%, then 50% while in use
        assert set(row0[column["mem_hist"]]) == {"▁"}  # an idle card stays flat
        assert "UTIL history" in "\n".join(screen_text(app))
