from __future__ import annotations

import time

from gpuctl.core import timefmt


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


def local_offset_s(at: float) -> int:
    """The local zone's offset from UTC at `at` (seconds east; daylight saving as it was then),
    for `gpuctl.core.timefmt.stamp`. TZ set in the environment counts after `time.tzset()`."""
    return time.localtime(at).tm_gmtoff


def local_stamp(at: float | None) -> str:
    """`2026-12-02 05:10:00 +01:00`: a time for people, in the local zone with its offset."""
    return timefmt.stamp(at, 0 if at is None else local_offset_s(at))
