"""When a running job counts as stalled: its newest commit is older than a few times the interval
it has been committing at (never sooner than a floor); a job with no known cadence never is."""

from __future__ import annotations

from gpuctl.core.jobs.model import Checkpoint, Incarnation, IncarnationState
from gpuctl.core.jobs.stall import StallPolicy, expected_interval, judge


def inc(n: int = 1, started_at: float = 0.0) -> Incarnation:
    return Incarnation(
        "a-1", n, "n1", (0,), (), 1024, False, IncarnationState.RUNNING, started_at, "/r"
    )


def ckpts(n: int, *times: float, location: str = "shared") -> list[Checkpoint]:
    return [Checkpoint("a-1", n, 10 * (i + 1), f"/c/{i}", t, location) for i, t in enumerate(times)]


def test_stalled_past_two_intervals_and_never_sooner_than_the_floor() -> None:
    every_5m = ckpts(1, 100, 400, 700, 1000)
    policy = StallPolicy()
    assert judge(inc(), every_5m, now=1000 + 600, policy=policy) is None  # 2 x 300 s: not past
    stall = judge(inc(), every_5m, now=1000 + 601, policy=policy)
    assert stall is not None and (stall.step, stall.interval_s, stall.threshold_s) == (40, 300, 600)
    every_5s = ckpts(1, 100, 105, 110)
    assert judge(inc(), every_5s, now=110 + 60, policy=policy) is None  # the 60 s floor
    assert judge(inc(), every_5s, now=110 + 61, policy=policy) is not None


def test_the_interval_is_the_median_of_the_latest_gaps_within_one_incarnation() -> None:
    history = ckpts(1, 0, 10, 20, 30) + ckpts(2, 1000, 1030, 1060)  # the restart is no gap
    assert expected_interval(history, gaps=5) == 10  # gaps 10, 10, 10, then 30, 30
    assert expected_interval(history, gaps=2) == 30  # the latest two
    pulled = ckpts(1, 0, 10) + ckpts(1, 0, 10, location="store")  # a copy is the same commit
    assert expected_interval(pulled, gaps=5) == 10
    assert expected_interval(ckpts(1, 0) + ckpts(2, 50), gaps=5) is None


def test_a_restarted_incarnation_is_judged_from_its_start_by_its_job_s_cadence() -> None:
    earlier = ckpts(1, 0, 20, 40)
    policy = StallPolicy()
    assert judge(inc(2, started_at=500), earlier, now=560, policy=policy) is None
    stall = judge(inc(2, started_at=500), earlier, now=561, policy=policy)
    assert stall is not None and stall.step is None and stall.since == 500
    assert (
        stall.reason == "stalled: no checkpoint committed for over 1m00s (it committed every 20s)"
    )


def test_a_job_stopped_for_70_s_between_checkpoint_scans_is_stalled() -> None:
    # it commits every 5 s; the loop's 30 s checkpoint scan records one commit in six
    recorded = ckpts(1, 0, 30, 60, 90, 120)
    assert judge(inc(), recorded, now=120 + 70, policy=StallPolicy()) is not None
