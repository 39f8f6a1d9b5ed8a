"""The HTML report's time axes are in the reader's local time and say their zone (the house
convention for times shown to people: `core.timefmt`), not UTC unnamed."""

from __future__ import annotations

import re

from gpuctl.core.history import FLEET_SERIES, FleetSample, NodeSample
from gpuctl.ops.report_html import html_page
from gpuctl.testing.memstore import MemoryStore

T0 = 1_767_225_600  # 2026-01-01 00:00 UTC


def test_the_charts_time_axes_are_local_time_with_the_zone_named() -> None:
    store = MemoryStore()
    for m in range(0, 180, 5):
        at = T0 + m * 60
        store.record_samples(
            FleetSample(at, 300, dict.fromkeys(FLEET_SERIES, 10.0)),
            [NodeSample(at, 300, "n1", 50.0, 1, 1, 0, 10)],
        )
    page = html_page(store, T0 + 3 * 3600, 4 * 3600, offset_s=3600)
    texts = re.findall(r"<!-- ([^>]*?) -->", page)  # matplotlib names each text it draws
    assert "local time (UTC+01:00)" in texts  # fragmentation over time
    assert "hour, local time (UTC+01:00)" in texts  # the heatmap
    assert "01 01:00" in texts and "01-01 01:00" in texts  # 00:00 UTC read as 01:00 there
    assert "<p>2026-01-01 00:00:00 +01:00 to 2026-01-01 04:00:00 +01:00</p>" in page
