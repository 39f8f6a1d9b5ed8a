"""The dashboard's pure formatting: what an operator reads in each cell."""

from __future__ import annotations

from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.jobs.figures import job_figures
from gpuctl.tui import format as fmt


def test_durations_read_like_a_clock_and_unknown_is_na() -> None:
    assert [fmt.duration(s) for s in (None, 0, 59.6, 185, 7500, 273600)] == [
        "N/A",
        "0s",
        "1m00s",
        "3m05s",
        "2h05m",
        "3d04h",
    ]


def test_sparkline_scales_to_the_given_range_and_leaves_gaps_for_unknown() -> None:
    assert fmt.sparkline([0, 50, 100, None], 4, lo=0, hi=100) == "▁▅█ "
    assert fmt.sparkline([3, 3, 3], 3) == "▁▁▁"  # flat: at the bottom, not a wall
    assert fmt.sparkline(list(range(100)), 5, lo=0, hi=99) == "█████"  # the last 5 only
    assert fmt.sparkline([None, None], 2) == "  "


def test_memory_bar_tells_used_within_allocation_from_idle_allocation_and_ghost() -> None:
    # 80 GiB card, 40 allocated, 20 in use: half used inside the slice, half idle, rest free
    bar = fmt.mem_bar(40 * 1024, 20 * 1024, 80 * 1024, 8)
    assert bar.plain == "██▒▒····"
    assert [piece for piece, style in bar.parts if style == "cyan"] == ["▒▒"]
    # nothing allocated, 40 GiB in use: ghost memory, in red
    ghost = fmt.mem_bar(0, 40 * 1024, 80 * 1024, 8)
    assert ghost.plain == "▓▓▓▓····"
    assert ("▓▓▓▓", fmt.BAR_STYLE["ghost"]) in ghost.parts
    assert ghost.text().spans[0].style == fmt.BAR_STYLE["ghost"]  # what the table renders
    # unknown capacity is never drawn as free
    assert fmt.mem_bar(0, None, None, 4).plain == "????"


def test_utilization_is_coloured_by_its_band() -> None:
    assert fmt.band_text(70.0, "target").style == "green"
    assert fmt.band_text(90.0, "over").style == "bold red"
    assert fmt.band_text(None, None).plain == "N/A"


def test_untrusted_text_loses_escape_sequences_and_is_never_markup() -> None:
    text = fmt.plain("gpu\x1b[31m-01\x1b]0;owned\x07 [bold]x[/bold]")
    assert text.plain == "gpu-01 [bold]x[/bold]"
    assert not text.text().spans  # shown as it is, not as markup


def test_the_numbers_as_text_name_each_number_with_its_detail() -> None:
    numbers = {
        "utilization_pct": 72.5,
        "band": "target",
        "observed_util_pct": 61.0,
        "allocated_mib": 7 * 1024,
        "capacity_mib": 10 * 1024,
        "fragmentation_pct": None,
        "stranded_gib": None,
        "queue_wait_p50_s": 30.0,
        "queue_wait_p95_s": 95.0,
        "queue_waiting": 2,
        "queue_oldest_wait_s": 600.0,
        "checkpoint_age_max_s": 300.0,
        "checkpoint_age_p95_s": 240.0,
        "checkpoint_running_jobs": 3,
        "failover_success_pct": 100.0,
        "failovers_succeeded": 1,
        "failovers_attempted": 1,
        "failovers_pending": 0,
        "preemptions_per_hour": 0.5,
        "spot_preempted_pct": 25.0,
    }
    jobs = job_figures((), (), {}, 0.0).to_dict()  # the fields this test leaves out
    lines = fmt.numbers_text(FleetNumbers.from_dict({**jobs, **numbers})).splitlines()
    assert lines == [
        # the share allocated, its band in words: never "72% target" (nor "46% idle")
        "UTILIZATION         72% allocated in the 60-80% band · SM 61% · 7/10 GiB",
        "FRAGMENTATION       N/A          not measured yet",
        "QUEUE WAIT p50      30s          p95 1m35s · 2 waiting, oldest 10m00s",
        "CHECKPOINT AGE max  5m00s        p95 4m00s · 3 running",
        "FAILOVER OK         100%         1 of 1 · 0 pending · 0 drained",
        "PREEMPTIONS         0.50/h       spot: 25% preempted",
    ]
