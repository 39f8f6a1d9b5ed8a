"""The fleet's job numbers, computed by hand on small histories."""

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.core.jobs.figures import job_figures, percentile
from gpuctl.core.jobs.model import (
    Checkpoint,
    EndReason,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
)

NOW = 100_000.0
HOUR = 3600.0


def job(
    jid: str,
    state: JobState = JobState.RUNNING,
    *,
    submitted: float = NOW - HOUR,
    started: float | None = None,
    tier: str = "standard",
    updated: float = 0.0,
) -> Job:
    return Job(
        id=jid,
        name=jid,
        spec={},
        state=state,
        priority=0,
        tier=tier,
        submitted_at=submitted,
        first_started_at=started,
        updated_at=updated,
    )


def inc(
    jid: str,
    n: int,
    started: float,
    *,
    ended: float | None = None,
    reason: EndReason | None = None,
    pid: int | None = 100,
    state: IncarnationState = IncarnationState.RUNNING,
) -> Incarnation:
    return Incarnation(
        job_id=jid,
        n=n,
        node="gpu-01",
        cards=(0,),
        gpu_uuids=("GPU-0",),
        mib_per_card=1024,
        whole=False,
        state=state,
        started_at=started,
        run_dir="/r",
        pid=pid,
        ended_at=ended,
        end_reason=reason,
    )


def ckpt(jid: str, committed: float, step: int = 10) -> Checkpoint:
    return Checkpoint(jid, 1, step, "/c", committed, "shared")


def test_nearest_rank_percentiles() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 95) == 7.0
    assert percentile([40.0, 10.0, 30.0, 20.0], 50) == 20.0  # rank ceil(2) = 2
    assert percentile([float(i) for i in range(1, 21)], 95) == 19.0  # rank 19 of 20
    assert percentile([float(i) for i in range(1, 22)], 95) == 20.0  # rank ceil(19.95) = 20


def test_an_empty_store_has_every_number_undefined() -> None:
    n = job_figures([], [], {}, NOW)
    assert n.queue_wait_p50_s is None
    assert n.queue_oldest_wait_s is None
    assert n.checkpoint_age_max_s is None
    assert n.failover_success_pct is None
    assert n.preemptions_per_hour is None
    assert n.spot_preempted_pct is None
    assert (n.queue_waiting, n.failovers_attempted, n.preemptions) == (0, 0, 0)


def test_queue_wait_is_submit_to_first_start_within_the_window() -> None:
    jobs = [
        job("a", submitted=NOW - 500, started=NOW - 490),  # waited 10 s
        job("b", submitted=NOW - 500, started=NOW - 470),  # 30 s
        job("c", submitted=NOW - 500, started=NOW - 440),  # 60 s
        job("d", submitted=NOW - 500, started=NOW - 380),  # 120 s
        job("old", submitted=NOW - 3 * 86400, started=NOW - 2 * 86400),  # outside the window
        job("q1", JobState.QUEUED, submitted=NOW - 90),
        job("q2", JobState.QUEUED, submitted=NOW - 250),
        # requeued after a failover: it has started before, so it is not "still waiting"
        job("requeued", JobState.QUEUED, submitted=NOW - 2e5, started=NOW - 1e5),
    ]
    n = job_figures(jobs, [], {}, NOW)
    assert n.queue_started == 4
    assert n.queue_wait_p50_s == 30.0  # rank 2 of [10, 30, 60, 120]
    assert n.queue_wait_p95_s == 120.0  # rank 4
    assert (n.queue_waiting, n.queue_oldest_wait_s, n.queue_oldest_job) == (2, 250.0, "q2")


def test_checkpoint_age_is_max_and_p95_over_running_jobs() -> None:
    jobs = [
        job("a", started=NOW - 1000),
        job("b", started=NOW - 1000),
        job("fresh", started=NOW - 200),  # no checkpoint yet: counts from its first start
        job("done", JobState.SUCCEEDED, started=NOW - 5000),
    ]
    newest = {"a": ckpt("a", NOW - 60), "b": ckpt("b", NOW - 300), "done": ckpt("done", 0.0)}
    n = job_figures(jobs, [], newest, NOW)
    assert (n.checkpoint_running_jobs, n.checkpoint_missing) == (3, 1)
    assert n.checkpoint_age_max_s == 300.0
    assert n.checkpoint_oldest_job == "b"
    assert n.checkpoint_age_p95_s == 300.0  # rank 3 of [60, 200, 300]


def test_failover_success_counts_restarts_running_again_within_the_budget() -> None:
    t = NOW - 5000
    incs = [
        # a: node lost, running again 40 s later: success
        inc("a", 1, t - 100, ended=t, reason=EndReason.NODE_LOST, state=IncarnationState.LOST),
        inc("a", 2, t + 40),
        # b: preempted, relaunched 11 min later: failure (past the 10 min budget)
        inc("b", 1, t - 100, ended=t, reason=EndReason.PREEMPTED, state=IncarnationState.KILLED),
        inc("b", 2, t + 660),
        # c: lost; the first relaunch failed, the second ran 5 min later: success
        inc("c", 1, t - 100, ended=t, reason=EndReason.NODE_LOST, state=IncarnationState.LOST),
        inc("c", 2, t + 60, ended=t + 61, reason=EndReason.LAUNCH_FAILED, pid=None),
        inc("c", 3, t + 300),
        # d: lost and never restarted, budget long past: failure
        inc("d", 1, t - 100, ended=t, reason=EndReason.NODE_LOST, state=IncarnationState.LOST),
        # e: lost 2 minutes ago, not yet restarted: pending, not counted
        inc("e", 1, NOW - 500, ended=NOW - 120, reason=EndReason.NODE_LOST),
        # f: its own crash is not a failover
        inc("f", 1, t - 100, ended=t, reason=EndReason.EXITED, state=IncarnationState.EXITED),
        # g: lost, cancelled by the operator a minute later: not counted
        inc("g", 1, t - 100, ended=t, reason=EndReason.NODE_LOST, state=IncarnationState.KILLED),
    ]
    jobs = [job(j) for j in "abcdef"] + [job("g", JobState.CANCELLED, updated=t + 60)]
    n = job_figures(jobs, incs, {}, NOW)
    assert (n.failovers_attempted, n.failovers_succeeded, n.failovers_pending) == (4, 2, 1)
    assert n.failover_success_pct == 50.0


def test_a_drain_s_moves_are_no_failovers_and_are_counted_apart() -> None:
    t = NOW - 5000
    incs = []
    for name in "abcdef":  # a drain moved six jobs, each running again a minute later
        incs += [
            inc(name, 1, t - 100, ended=t, reason=EndReason.DRAINED, state=IncarnationState.KILLED),
            inc(name, 2, t + 60),
        ]
    n = job_figures([job(j) for j in "abcdef"], incs, {}, NOW)
    assert (n.failovers_attempted, n.failover_success_pct) == (0, None)  # nothing failed
    assert (n.drain_moves, n.drain_moves_restarted) == (6, 6)


def test_the_restart_budget_and_window_are_parameters() -> None:
    t = NOW - 5000
    incs = [
        inc("b", 1, t - 100, ended=t, reason=EndReason.PREEMPTED),
        inc("b", 2, t + 660),
    ]
    assert job_figures([job("b")], incs, {}, NOW, restart_budget_s=900).failover_success_pct == (
        100.0
    )
    outside = job_figures([job("b")], incs, {}, NOW, window_s=1000)
    assert (outside.failovers_attempted, outside.failover_success_pct) == (0, None)


def test_preemption_rate_per_hour_and_share_of_spot_jobs() -> None:
    two_hours_ago = NOW - 2 * HOUR
    jobs = [
        job("s1", tier="spot", submitted=two_hours_ago),
        job("s2", tier="spot", submitted=two_hours_ago),
        job("s3", tier="spot", submitted=two_hours_ago),
        job("s4", JobState.QUEUED, tier="spot", submitted=two_hours_ago),  # never ran
        job("std", submitted=two_hours_ago),
    ]
    incs = [
        inc("s1", 1, NOW - 7000, ended=NOW - 5000, reason=EndReason.PREEMPTED),
        inc("s1", 2, NOW - 4000, ended=NOW - 100, reason=EndReason.PREEMPTED),
        inc("s1", 3, NOW - 50),
        inc("s2", 1, NOW - 7000, ended=NOW - 3000, reason=EndReason.PREEMPTED),
        inc("s3", 1, NOW - 7000),
        inc("std", 1, NOW - 7000, ended=NOW - 10, reason=EndReason.PREEMPTED),  # not spot
    ]
    n = job_figures(jobs, incs, {}, NOW)
    # 3 spot preemptions over the 2 hours since the first submission (shorter than the window)
    assert n.preemptions == 3
    assert n.preemptions_per_hour == pytest.approx(1.5)
    assert (n.spot_jobs, n.spot_jobs_preempted) == (3, 2)
    assert n.spot_preempted_pct == pytest.approx(200 / 3)


def test_numbers_serialise_with_units_in_their_names() -> None:
    doc = job_figures([job("a", started=NOW - 10)], [], {}, NOW).to_dict()
    assert doc["checkpoint_age_max_s"] == 10.0
    assert doc["failover_success_pct"] is None
    assert all(isinstance(k, str) for k in doc)
    assert dataclasses.is_dataclass(job_figures([], [], {}, NOW))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # job
            st.floats(0, 7200),  # started, seconds before now
            st.one_of(st.none(), st.floats(0, 7200)),  # ended, seconds after start
            st.sampled_from([None, *EndReason]),
            st.booleans(),  # got a pid
        ),
        max_size=12,
    )
)
def test_failover_and_preemption_figures_stay_in_range(rows: list[Any]) -> None:
    incs = []
    seen: dict[str, int] = {}
    for j, ago, dur, reason, pid in rows:
        jid = f"j{j}"
        seen[jid] = seen.get(jid, 0) + 1
        ended = None if dur is None else min(NOW, NOW - ago + dur)
        incs.append(
            inc(jid, seen[jid], NOW - ago, ended=ended, reason=reason, pid=100 if pid else None)
        )
    jobs = [job(f"j{j}", tier="spot" if j % 2 else "standard") for j in range(4)]
    n = job_figures(jobs, incs, {}, NOW)
    assert 0 <= n.failovers_succeeded <= n.failovers_attempted
    assert (n.failover_success_pct is None) == (n.failovers_attempted == 0)
    if n.failover_success_pct is not None:
        assert 0.0 <= n.failover_success_pct <= 100.0
    assert 0 <= n.spot_jobs_preempted <= n.spot_jobs
    assert n.preemptions >= n.spot_jobs_preempted
