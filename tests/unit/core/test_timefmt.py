"""One way to write time: durations, ages, people's timestamps and RFC 3339 for machines."""

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuctl.core import timefmt

T = 1796184600.0  # 2026-12-02T04:10:00Z


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (None, "N/A"),
        (0, "0s"),
        (0.04, "0s"),
        (0.8, "0.8s"),
        (5.0, "5s"),
        (9.94, "9.9s"),
        (9.96, "10s"),
        (45, "45s"),
        (59, "59s"),
        (59.6, "1m00s"),
        (60, "1m00s"),
        (248, "4m08s"),
        (1800, "30m00s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (7500, "2h05m"),
        (86399, "23h59m"),
        (86400, "1d00h"),
        (273600, "3d04h"),
        (7 * 86400, "7d00h"),
        (-248, "-4m08s"),
        (-0.8, "-0.8s"),
        (float("nan"), "N/A"),
    ],
)
def test_a_duration_reads_the_same_everywhere(seconds: float | None, words: str) -> None:
    assert timefmt.duration(seconds) == words


def test_an_age_is_before_now_and_a_time_ahead_of_now_says_in() -> None:
    assert timefmt.ago(T - 248, T) == "4m08s ago"
    assert timefmt.ago(T, T) == "0s ago"
    assert timefmt.ago(T + 59, T) == "in 59s"
    assert timefmt.ago(None, T) == "N/A"


def test_a_timestamp_for_people_carries_its_zone_offset() -> None:
    assert timefmt.stamp(T) == "2026-12-02 04:10:00 +00:00"
    assert timefmt.stamp(T, 3600) == "2026-12-02 05:10:00 +01:00"
    assert timefmt.stamp(T, -(5 * 3600)) == "2026-12-01 23:10:00 -05:00"
    assert timefmt.stamp(T + 0.9, 19800) == "2026-12-02 09:40:00 +05:30"  # cut, not rounded
    assert timefmt.stamp(None) == "-"
    assert timefmt.clock(T, 3600) == "05:10:00"


def test_machines_get_rfc3339_in_utc_to_the_second() -> None:
    assert timefmt.rfc3339(T + 0.75) == "2026-12-02T04:10:00Z"
    assert timefmt.rfc3339(0) == "1970-01-01T00:00:00Z"
    assert timefmt.rfc3339(None) is None
    assert timefmt.parse_rfc3339("2026-12-02T04:10:00Z") == T
    assert timefmt.parse_rfc3339("2026-12-02T05:10:00.5+01:00") == T + 0.5
    for bad in ("2026-13-02T04:10:00Z", "2026-02-30T04:10:00Z", "yesterday", "2026-12-02"):
        with pytest.raises(ValueError):
            timefmt.parse_rfc3339(bad)


@given(st.integers(min_value=-(10**10), max_value=10**11), st.integers(-50400, 50400))
def test_the_calendar_agrees_with_the_standard_library(t: int, offset: int) -> None:
    zone = dt.timezone(dt.timedelta(seconds=offset))
    want = dt.datetime.fromtimestamp(t, zone).isoformat(sep=" ")
    got = timefmt.stamp(t, offset)
    assert got[:19] == want[:19]
    assert timefmt.parse_rfc3339(timefmt.rfc3339(t) or "") == t


def test_json_times_are_rfc3339_under_time_keys_and_durations_stay_numbers() -> None:
    doc = {
        "submitted_at": T,
        "queue_wait_s": 12.5,
        "state_since": None,
        "checkpoint": {"committed_at": T + 1, "age_s": 3.0, "step": 60},
        "events": [{"at": T, "message": "at 3"}],
        "xids": [{"at": "[ 12.3] kernel text"}],
        "flag": True,
    }
    assert timefmt.machine_times(doc) == {
        "submitted_at": "2026-12-02T04:10:00Z",
        "queue_wait_s": 12.5,
        "state_since": None,
        "checkpoint": {"committed_at": "2026-12-02T04:10:01Z", "age_s": 3.0, "step": 60},
        "events": [{"at": "2026-12-02T04:10:00Z", "message": "at 3"}],
        "xids": [{"at": "[ 12.3] kernel text"}],
        "flag": True,
    }


def test_a_saved_time_reads_back_from_either_form() -> None:
    assert timefmt.epoch("2026-12-02T04:10:00Z") == T
    assert timefmt.epoch(T) == T
    assert timefmt.epoch(None) is None
    with pytest.raises(ValueError):
        timefmt.epoch(True)
