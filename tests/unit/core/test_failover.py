"""The control loop's pure decisions: liveness, mass failure, restarts, preemption, slices."""

from hypothesis import given
from hypothesis import strategies as st

from gpuctl.core.jobs.liveness import LivenessChange, suspect_own_network, update_liveness
from gpuctl.core.jobs.model import (
    EndReason,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    NodeLiveness,
)
from gpuctl.core.jobs.preemption import SpotVictim, choose_preemption, fits, without
from gpuctl.core.jobs.queue import queue_order
from gpuctl.core.jobs.restarts import RestartPolicy, RestartVerdict, RunEnd, restart_decision
from gpuctl.core.jobs.slices import slice_verdicts
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.model import GpuProcess
from gpuctl.core.placement.model import (
    Allocation,
    Card,
    FleetState,
    JobRequest,
    JobShape,
    PlacementNode,
    Settings,
    Tier,
)
from gpuctl.core.units import MemPerCard

GIB = 1024
CAP = 80 * GIB

# --- liveness --------------------------------------------------------------------------------


def test_a_node_is_not_down_at_its_first_failed_poll_even_with_no_grace() -> None:
    up = update_liveness(None, "n1", answered=False, now=100.0, grace_s=0.0)
    assert up.change is LivenessChange.FAILING
    assert not up.liveness.down
    assert up.liveness.failing_since == 100.0


def test_a_node_is_down_once_the_grace_passed_without_an_answer() -> None:
    live = NodeLiveness("n1", last_ok_at=90.0, failing_since=None)
    first = update_liveness(live, "n1", answered=False, now=100.0, grace_s=30.0)
    within = update_liveness(first.liveness, "n1", answered=False, now=129.0, grace_s=30.0)
    assert not within.liveness.down and within.change is LivenessChange.NONE
    past = update_liveness(within.liveness, "n1", answered=False, now=130.0, grace_s=30.0)
    assert past.liveness.down and past.change is LivenessChange.DOWN
    assert past.liveness.last_ok_at == 90.0
    still = update_liveness(past.liveness, "n1", answered=False, now=200.0, grace_s=30.0)
    assert still.liveness.down and still.change is LivenessChange.NONE


def test_an_answer_within_the_grace_recovers_and_after_it_brings_the_node_back() -> None:
    failing = NodeLiveness("n1", last_ok_at=0.0, failing_since=10.0)
    assert update_liveness(failing, "n1", answered=True, now=20.0, grace_s=30.0).change is (
        LivenessChange.RECOVERED
    )
    down = NodeLiveness("n1", last_ok_at=0.0, failing_since=10.0, down=True)
    back = update_liveness(down, "n1", answered=True, now=99.0, grace_s=30.0)
    assert back.change is LivenessChange.BACK
    assert back.liveness == NodeLiveness("n1", last_ok_at=99.0, failing_since=None, down=False)


@given(
    st.lists(st.tuples(st.booleans(), st.floats(0.0, 20.0)), min_size=1, max_size=30),
    st.floats(0.0, 60.0),
)
def test_down_means_silent_for_the_whole_grace(
    polls: list[tuple[bool, float]], grace: float
) -> None:
    live: NodeLiveness | None = None
    now = 0.0
    silent_since: float | None = None
    for answered, step in polls:
        now += step
        up = update_liveness(live, "n", answered=answered, now=now, grace_s=grace)
        live = up.liveness
        if answered:
            silent_since = None
            assert not live.down
        else:
            silent_since = now if silent_since is None else silent_since
            if live.down:
                assert now - silent_since >= grace and now > silent_since


def test_more_than_half_of_the_fleet_failing_at_once_is_suspected_to_be_our_network() -> None:
    assert not suspect_own_network(1, 2)
    assert suspect_own_network(2, 3)
    assert not suspect_own_network(5, 10)
    assert suspect_own_network(6, 10)
    assert suspect_own_network(3, 10, fraction=0.25)
    assert not suspect_own_network(0, 0)


# --- restarts --------------------------------------------------------------------------------


def crash(start: float, end: float, code: int = 1) -> RunEnd:
    return RunEnd(start, end, EndReason.EXITED, code)


def test_a_crash_is_restarted_within_the_budget_and_held_past_it() -> None:
    policy = RestartPolicy(budget=3, window_s=3600, thrash_window_s=10)
    runs = [crash(0, 100), crash(100, 300), crash(300, 500)]
    assert restart_decision(runs, 500, policy).verdict is RestartVerdict.RESTART
    held = restart_decision([*runs, crash(500, 700)], 700, policy)
    assert held.verdict is RestartVerdict.HOLD
    assert held.reason.startswith("restart budget spent: 4 failures within 1h00m")


def test_failures_older_than_the_window_do_not_count() -> None:
    policy = RestartPolicy(budget=1, window_s=600, thrash_window_s=10)
    runs = [crash(0, 100), crash(1000, 1200)]
    assert restart_decision(runs, 1200, policy).verdict is RestartVerdict.RESTART


def test_node_losses_preemptions_and_clean_exits_do_not_spend_the_budget() -> None:
    policy = RestartPolicy(budget=0, thrash_window_s=10)
    runs = [
        RunEnd(0, 5, EndReason.NODE_LOST),
        RunEnd(5, 6, EndReason.PREEMPTED, 143),
        RunEnd(6, 7, EndReason.FENCED, 137),
    ]
    assert restart_decision(runs, 7, policy).verdict is RestartVerdict.RESTART
    assert restart_decision([*runs, crash(7, 100)], 100, policy).verdict is RestartVerdict.HOLD


def test_a_job_failing_quickly_after_each_start_is_held_and_its_node_not_blamed() -> None:
    policy = RestartPolicy(budget=10, thrash_window_s=60, thrash_starts=3)
    quick = [crash(0, 5), crash(10, 12), crash(20, 21)]
    decision = restart_decision(quick, 21, policy)
    assert decision.verdict is RestartVerdict.HOLD and decision.thrashing
    assert not decision.blame_node
    assert decision.reason.startswith("crash loop: exited non-zero within 60s")
    one_slow = [crash(0, 5), crash(10, 500), crash(500, 501)]
    assert restart_decision(one_slow, 501, policy).verdict is RestartVerdict.RESTART


def test_launch_failures_count_as_the_job_failing() -> None:
    policy = RestartPolicy(budget=5, thrash_window_s=60, thrash_starts=2)
    runs = [RunEnd(0, 1, EndReason.LAUNCH_FAILED), RunEnd(2, 3, EndReason.LAUNCH_FAILED)]
    assert restart_decision(runs, 3, policy).thrashing


# --- queue order ------------------------------------------------------------------------------


def job(jid: str, priority: int = 0, at: float = 0.0, tier: str = "standard") -> Job:
    return Job(jid, jid, JobSpec(JobRequest(jid)), JobState.QUEUED, priority, tier, at)


def test_the_queue_is_ordered_by_priority_then_age_then_id() -> None:
    jobs = [job("c", 0, 5.0), job("b", 0, 5.0), job("a", 0, 9.0), job("z", 7, 99.0)]
    assert [j.id for j in queue_order(jobs)] == ["z", "b", "c", "a"]


# --- spot preemption --------------------------------------------------------------------------


def fleet(*nodes: tuple[str, int], allocs: tuple[Allocation, ...] = ()) -> FleetState:
    by_card: dict[tuple[str, int], int] = {}
    for a in allocs:
        for c in a.cards:
            by_card[(a.node, c)] = by_card.get((a.node, c), 0) + (
                CAP if a.whole else a.mib_per_card
            )
    return FleetState(
        nodes=tuple(
            PlacementNode(
                name,
                tuple(
                    Card(i, CAP, f"GPU-{name}-{i}", "H100", by_card.get((name, i), 0))
                    for i in range(gpus)
                ),
            )
            for name, gpus in nodes
        ),
        allocations=allocs,
    )


def spot(jid: str, node: str, card: int, mib: int = CAP, at: float | None = None) -> SpotVictim:
    whole = mib == CAP
    return SpotVictim(jid, Allocation(jid, node, (card,), mib, whole, tier=Tier.SPOT), at)


WHOLE_JOB = JobRequest("std", JobShape(1, MemPerCard(whole=True)))
LOOSE = Settings(band_max=1.0, headroom=0.0)


def test_the_most_recently_checkpointed_spot_job_is_preempted_first() -> None:
    victims = [spot("s1", "n1", 0, at=100.0), spot("s2", "n1", 1, at=500.0), spot("s3", "n2", 0)]
    state = fleet(("n1", 2), ("n2", 1), allocs=tuple(v.allocation for v in victims))
    chosen = choose_preemption(state, WHOLE_JOB, victims, LOOSE)
    assert chosen is not None and [v.job_id for v in chosen] == ["s2"]


def test_a_job_that_already_fits_preempts_nothing_and_an_impossible_one_gets_none() -> None:
    victims = [spot("s1", "n1", 0, at=1.0)]
    state = fleet(("n1", 2), allocs=(victims[0].allocation,))
    assert choose_preemption(state, WHOLE_JOB, victims, LOOSE) == ()
    big = JobRequest("big", JobShape(4, MemPerCard(whole=True)))
    assert choose_preemption(state, big, victims, LOOSE) is None


def test_fewest_moves_win_over_checkpoint_recency() -> None:
    # n1 holds two half-card spot jobs on card 0; n2 one whole-card spot job. A whole card needs
    # both of n1's jobs, or n2's one: one move wins, however fresh n1's checkpoints are.
    victims = [
        spot("a", "n1", 0, CAP // 2, at=900.0),
        spot("b", "n1", 0, CAP // 2, at=800.0),
        spot("c", "n2", 0, at=None),
    ]
    state = fleet(("n1", 1), ("n2", 1), allocs=tuple(v.allocation for v in victims))
    chosen = choose_preemption(state, WHOLE_JOB, victims, LOOSE)
    assert chosen is not None and [v.job_id for v in chosen] == ["c"]


def test_several_victims_on_one_node_when_no_single_one_makes_room() -> None:
    victims = [spot("a", "n1", 0, CAP // 2, at=1.0), spot("b", "n1", 0, CAP // 2, at=2.0)]
    state = fleet(("n1", 1), allocs=tuple(v.allocation for v in victims))
    chosen = choose_preemption(state, WHOLE_JOB, victims, LOOSE)
    assert chosen is not None and sorted(v.job_id for v in chosen) == ["a", "b"]


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), max_size=6, unique=True))
def test_after_the_chosen_preemptions_the_job_fits(cards: list[tuple[int, int]]) -> None:
    victims = [spot(f"s{k}", f"n{n}", c, at=float(k)) for k, (n, c) in enumerate(cards)]
    state = fleet(("n0", 2), ("n1", 2), ("n2", 2), allocs=tuple(v.allocation for v in victims))
    chosen = choose_preemption(state, WHOLE_JOB, victims, LOOSE)
    assert chosen is not None  # six cards, at most six victims: one stop always makes room
    assert len(chosen) <= 1
    freed = without(state, [v.job_id for v in chosen])
    assert fits(freed, WHOLE_JOB, LOOSE)


def test_without_releases_the_cards_cpu_and_memory_of_the_named_jobs() -> None:
    a = Allocation("a", "n1", (0,), CAP // 4, cpu_milli=2000, host_mem_mib=1024)
    b = Allocation("b", "n1", (0, 1), CAP, whole=True)
    state = fleet(("n1", 3), allocs=(a, b))
    state = FleetState(
        nodes=(
            PlacementNode(
                "n1",
                state.nodes[0].cards,
                cpu_milli=8000,
                cpu_allocated_milli=2000,
                host_mem_mib=4096,
                host_mem_allocated_mib=1024,
            ),
        ),
        allocations=(a, b),
    )
    after = without(state, ["a", "b"])
    assert [c.allocated_mib for c in after.nodes[0].cards] == [0, 0, 0]
    assert after.nodes[0].cpu_allocated_milli == 0 and after.nodes[0].host_mem_allocated_mib == 0
    assert after.allocations == ()


# --- slices -----------------------------------------------------------------------------------


def inc(
    jid: str, node: str, pid: int, uuids: tuple[str, ...], mib: int, whole: bool = False
) -> Incarnation:
    return Incarnation(
        jid,
        1,
        node,
        tuple(range(len(uuids))),
        uuids,
        mib,
        whole,
        IncarnationState.RUNNING,
        0.0,
        f"runs/{jid}/1",
        pid=pid,
    )


def test_a_job_over_its_slice_is_reported_by_how_much() -> None:
    incs = [inc("j1", "n1", 10, ("GPU-0",), 20 * GIB), inc("j2", "n1", 11, ("GPU-0",), 20 * GIB)]
    procs = {
        "n1": [
            GpuProcess(10, "GPU-0", 25 * GIB),
            GpuProcess(11, "GPU-0", 10 * GIB),
            GpuProcess(77, "GPU-0", 4 * GIB),
        ]
    }
    report = slice_verdicts(incs, procs)
    assert [(u.job_id, u.over_mib) for u in report.over] == [("j1", 5 * GIB)]
    assert [(g.node, g.pid, g.used_mib) for g in report.ghosts] == [("n1", 77, 4 * GIB)]


def test_memory_on_a_card_the_job_was_not_granted_is_all_over_its_slice() -> None:
    incs = [inc("j1", "n1", 10, ("GPU-0",), 20 * GIB)]
    report = slice_verdicts(incs, {"n1": [GpuProcess(10, "GPU-1", 3 * GIB)]})
    assert [(u.gpu_uuid, u.slice_mib, u.over_mib) for u in report.over] == [("GPU-1", 0, 3 * GIB)]


def test_the_same_pid_on_another_node_is_a_ghost_there() -> None:
    incs = [inc("j1", "n1", 10, ("GPU-0",), 20 * GIB)]
    report = slice_verdicts(incs, {"n2": [GpuProcess(10, "GPU-9", GIB)]})
    assert report.uses == () and [g.node for g in report.ghosts] == ["n2"]


def test_a_whole_card_job_is_never_over_on_its_own_cards() -> None:
    incs = [inc("j1", "n1", 10, ("GPU-0",), CAP, whole=True)]
    report = slice_verdicts(incs, {"n1": [GpuProcess(10, "GPU-0", CAP)]})
    assert report.over == () and report.uses[0].used_mib == CAP
