"""Time as gpuctl writes it: one formatter for every surface. Pure: the current time and the
zone's offset are arguments, never read here (the shells pass `clock.now()` and the local offset,
`gpuctl.adapters.clock.local_offset_s`).

- Durations in two units, the second always two digits, so a column of them lines up as a clock:
  `0.8s`, `9.5s` (a tenth under 10 s), `45s`, `4m08s`, `30m00s`, `2h05m`, `3d04h`, `7d00h`.
- Ages: `4m08s ago`; a time ahead of `now` (a clock ahead of ours) is `in 4m08s`.
- People's timestamps: local time with its offset from UTC, `2026-12-02 04:10:00 +01:00`, so a
  time is unambiguous wherever it is read and still the operator's own clock.
- Machines' timestamps (`-o json`, CSV): RFC 3339 in UTC to the second, `2026-12-02T04:10:00Z`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

NA = "N/A"
_DAY = 86400

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)


def duration(seconds: float | None) -> str:
    """`0.8s`, `45s`, `4m08s`, `2h05m`, `3d04h`; a negative span keeps its sign; N/A for None.
    Under 10 s to a tenth; above, whole seconds, then minutes, hours and days with the next unit."""
    if seconds is None or not math.isfinite(seconds):
        return NA
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    tenths = round(s * 10)
    if tenths < 100:
        whole, tenth = divmod(tenths, 10)
        if tenths == 0:
            sign = ""
        return f"{sign}{whole}s" if tenth == 0 else f"{sign}{whole}.{tenth}s"
    n = round(s)
    if n < 60:
        return f"{sign}{n}s"
    if n < 3600:
        return sign + _two(n // 60, "m", n % 60, "s")
    if n < _DAY:
        return sign + _two(n // 3600, "h", n % 3600 // 60, "m")
    return sign + _two(n // _DAY, "d", n % _DAY // 3600, "h")


def _two(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit}{small:02d}{small_unit}"


def ago(at: float | None, now: float) -> str:
    """How long before `now` `at` was: `4m08s ago`; `in 4m08s` when it is ahead; N/A for None."""
    if at is None:
        return NA
    span = now - at
    if round(span * 10) < 0:
        return f"in {duration(-span)}"
    return f"{duration(span)} ago"


def stamp(at: float | None, offset_s: int = 0) -> str:
    """`2026-12-02 04:10:00 +01:00`: `at` (epoch seconds) at `offset_s` east of UTC, to the
    second (cut, not rounded, as clocks are read); `-` for None."""
    if at is None:
        return "-"
    y, mo, d, h, mi, s = _civil(math.floor(at) + offset_s)
    return f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d} {_offset(offset_s)}"


def clock(at: float | None, offset_s: int = 0) -> str:
    """The time of day alone, `04:10:00` (where the date and zone are said once around it)."""
    if at is None:
        return "--:--:--"
    _, _, _, h, mi, s = _civil(math.floor(at) + offset_s)
    return f"{h:02d}:{mi:02d}:{s:02d}"


def rfc3339(at: float | None) -> str | None:
    """`2026-12-02T04:10:00Z`: `at` in UTC to the second, for machines; None stays None."""
    if at is None:
        return None
    y, mo, d, h, mi, s = _civil(math.floor(at))
    return f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}Z"


def parse_rfc3339(text: str) -> float:
    """Epoch seconds of an RFC 3339 time (`Z` or an offset, fractions kept). ValueError if not."""
    m = _RFC3339.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time (e.g. 2026-12-02T04:10:00Z)")
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    if not (1 <= mo <= 12 and 1 <= d <= _days_in(y, mo) and h < 24 and mi < 60 and s < 61):
        raise ValueError(f"{text!r} is not a valid date and time")
    zone = m.group(8)
    offset = 0
    if zone not in ("Z", "z"):
        zh, zm = int(zone[1:3]), int(zone[4:6])
        offset = (zh * 3600 + zm * 60) * (-1 if zone[0] == "-" else 1)
    fraction = float(m.group(7)) if m.group(7) else 0.0
    return _days_from_civil(y, mo, d) * _DAY + h * 3600 + mi * 60 + s - offset + fraction


def epoch(value: object) -> float | None:
    """A time as documents hold it: an RFC 3339 string (what `-o json` prints; `place
    --snapshot` reads a saved `status -o json`) or epoch seconds (older saves); None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a time")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return parse_rfc3339(value)
    raise ValueError(f"{value!r} is not a time")


def is_time_key(key: str) -> bool:
    """Document keys that hold an instant, by the house's naming: `at`, `*_at`, `since`,
    `*_since` (as `_s` says seconds and `_mib` MiB), and `now`, the instant the fleet numbers
    describe (a name playbook conditions use)."""
    return key in ("at", "since", "now") or key.endswith(("_at", "_since"))


def machine_times(doc: Any) -> Any:
    """`doc` with every number under a time key (`is_time_key`) written as RFC 3339 UTC: what
    `-o json` and `-o yaml` print. Durations (`*_s`) stay numbers; the rest is left as it is."""
    if isinstance(doc, Mapping):
        return {
            k: _machine_time(v) if isinstance(k, str) and is_time_key(k) else machine_times(v)
            for k, v in doc.items()
        }
    if isinstance(doc, list | tuple):
        return [machine_times(v) for v in doc]
    return doc


def _machine_time(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return rfc3339(value)
    return machine_times(value)


def _offset(offset_s: int) -> str:
    sign = "-" if offset_s < 0 else "+"
    minutes = abs(offset_s) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _civil(t: int) -> tuple[int, int, int, int, int, int]:
    """Year, month, day, hour, minute, second of `t` seconds from 1970-01-01 00:00:00."""
    days, rest = divmod(t, _DAY)
    y, mo, d = _civil_from_days(days)
    return y, mo, d, rest // 3600, rest % 3600 // 60, rest % 60


def _civil_from_days(z: int) -> tuple[int, int, int]:
    """The proleptic Gregorian date `z` days after 1970-01-01 (Howard Hinnant's algorithm)."""
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def _days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _days_in(y: int, m: int) -> int:
    if m == 2:
        return 29 if y % 4 == 0 and (y % 100 != 0 or y % 400 == 0) else 28
    return 30 if m in (4, 6, 9, 11) else 31
