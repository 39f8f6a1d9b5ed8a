"""The utilization band: where fleet utilization (allocated / total GPU memory of schedulable
nodes) should sit, and what each side of it means.

One definition, read by placement (standard-tier admission stops at the upper edge: the default
`Settings.band_max`), by the fleet numbers (`band` of `gpuctl status`, the dashboard, metrics,
playbook conditions) and by the words that describe it. docs/design.md: < 50% idle silicon,
60–80% target, > 80% over-committed (failover cannot land); failover headroom 15% by default.
"""

from __future__ import annotations

import dataclasses
import enum


class BandName(enum.StrEnum):
    IDLE = "idle"  # below `idle_below`: idle silicon
    LOW = "low"  # between `idle_below` and the target's lower edge
    TARGET = "target"  # inside the target band (both edges included)
    OVER = "over"  # above the upper edge: over-committed, failover cannot land


@dataclasses.dataclass(frozen=True, slots=True)
class Band:
    """Edges as fractions of fleet GPU memory (0..1)."""

    idle_below: float
    lower: float
    upper: float

    def __post_init__(self) -> None:
        if not 0 <= self.idle_below <= self.lower <= self.upper <= 1:
            raise ValueError("band edges must rise within 0..1: idle_below <= lower <= upper")

    def of(self, utilization: float | None) -> BandName | None:
        """The band `utilization` (0..1) is in; None when it is unknown (no capacity)."""
        if utilization is None:
            return None
        if utilization < self.idle_below:
            return BandName.IDLE
        if utilization < self.lower:
            return BandName.LOW
        if utilization <= self.upper:
            return BandName.TARGET
        return BandName.OVER

    def words(self, name: BandName) -> str:
        """What `name` means, in words with this band's edges ("in the 60-80% band")."""
        target = f"{_pct(self.lower)}-{_pct(self.upper)}%"
        return {
            BandName.IDLE: f"idle silicon, < {_pct(self.idle_below)}%",
            BandName.LOW: f"below the {target} band",
            BandName.TARGET: f"in the {target} band",
            BandName.OVER: f"over-committed, > {_pct(self.upper)}%",
        }[name]

    def legend(self) -> str:
        """Every band with its range, in one line (metrics HELP, help screens)."""
        idle, low, up = _pct(self.idle_below), _pct(self.lower), _pct(self.upper)
        return (
            f"idle (< {idle}%), low ({idle}-{low}%), target ({low}-{up}%), "
            f"over (> {up}%: failover cannot land)"
        )


def _pct(fraction: float) -> str:
    return f"{100 * fraction:g}"


TARGET_BAND = Band(idle_below=0.50, lower=0.60, upper=0.80)
DEFAULT_HEADROOM = 0.15  # fleet memory kept free for failover (configurable 10-20%)


def band_of(utilization: float | None) -> BandName | None:
    """The design's band of `utilization` (0..1): `TARGET_BAND.of`."""
    return TARGET_BAND.of(utilization)
