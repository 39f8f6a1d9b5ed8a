"""Durations and the fleet numbers as people read them."""

from __future__ import annotations

from gpuctl.core.band import TARGET_BAND, BandName
from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.jobs.figures import JobFigures
from gpuctl.core.timefmt import duration


def numbers_line(n: JobFigures) -> str:
    """The job figures in one line, for `gpuctl status`."""
    pct = "N/A" if n.failover_success_pct is None else f"{n.failover_success_pct:.0f}%"
    rate = "N/A" if n.preemptions_per_hour is None else f"{n.preemptions_per_hour:.2f}/h"
    spot = "" if n.spot_preempted_pct is None else f", {n.spot_preempted_pct:.0f}% of spot"
    return (
        f"jobs: queue wait p50 {duration(n.queue_wait_p50_s)}"
        f" p95 {duration(n.queue_wait_p95_s)}"
        f", {n.queue_waiting} waiting (oldest {duration(n.queue_oldest_wait_s)})"
        f" · checkpoint age max {duration(n.checkpoint_age_max_s)}"
        f" p95 {duration(n.checkpoint_age_p95_s)}"
        f" · failover {pct} ({n.failovers_succeeded} of {n.failovers_attempted})"
        f", {drain_moves(n)}"
        f" · preemptions {rate}{spot}\n"
    )


def drain_moves(n: JobFigures) -> str:
    """Planned moves off drained nodes, apart from the failovers: "6 drain moves"."""
    return f"{n.drain_moves} drain move{'' if n.drain_moves == 1 else 's'}"


def _pct(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.0f}%"


BAND_TEXT = {b.value: TARGET_BAND.words(b) for b in BandName}
BAND_TEXT[BandName.OVER.value] += ": failover cannot land"


def fleet_line(n: FleetNumbers) -> str:
    """Utilization (with its band), fragmentation and observed SM use in one line."""
    band = BAND_TEXT.get(n.band or "", "")
    util = _pct(n.utilization_pct) + " allocated" + (f" ({band})" if band else "")
    stranded = "" if n.stranded_gib is None else f", {n.stranded_gib:.1f} GiB stranded"
    return (
        f"fleet: utilization {util} · fragmentation {_pct(n.fragmentation_pct)}{stranded}"
        f" · observed SM {_pct(n.observed_util_pct)}\n"
    )
