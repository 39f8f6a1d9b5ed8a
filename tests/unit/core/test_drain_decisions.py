"""The pure decisions behind drains: a migration's next step, and what a pass does about node
health (cordon at first sight, unknown cordons only, hysteresis, rate limit, mass-unhealthy guard,
cool-down, never a person's cordon)."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gpuctl.core.health.autodrain import (
    AutoDrainPolicy,
    NodeHealth,
    NodeStep,
    decide,
    flapping,
    track,
)
from gpuctl.core.health.model import Action, NodeVerdict, Reason, Severity
from gpuctl.core.jobs.migration import Phase, Reservation, StepKind, next_step
from gpuctl.core.jobs.model import Cordon, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest

RES = Reservation(
    "a-1", 1, "n1", "n2", (0,), 1024, False, (4096,), 100.0, 700.0, 30.0, 20.0, "r", "op"
)
JOB = Job("a-1", "a", JobSpec(JobRequest("a")), JobState.RUNNING, 0, "standard", 1.0, incarnation=1)
SRC = Incarnation("a-1", 1, "n1", (0,), (), 1024, False, IncarnationState.RUNNING, 50.0, "/r")


def step(
    res: Reservation = RES,
    job: Job | None = JOB,
    source: Incarnation | None = SRC,
    alive: bool | None = True,
    newest: int | None = None,
    now: float = 110.0,
    cordoned: bool = False,
) -> StepKind:
    return next_step(
        res,
        job=job,
        source=source,
        alive=alive,
        newest_step=newest,
        now=now,
        target_cordoned=cordoned,
    ).kind


def test_a_migration_goes_reserve_checkpoint_stop_kill_launch() -> None:
    asked = dataclasses.replace(
        RES, phase=Phase.CHECKPOINTING, checkpoint_requested_at=110.0, baseline_step=40
    )
    stopping = dataclasses.replace(SRC, state=IncarnationState.STOPPING)
    stopped = dataclasses.replace(asked, phase=Phase.STOPPING, stop_requested_at=120.0)
    assert step() is StepKind.REQUEST_CHECKPOINT
    assert step(asked, newest=40, now=115.0) is StepKind.WAIT_CHECKPOINT
    assert step(asked, newest=50, now=115.0) is StepKind.STOP  # a newer checkpoint
    assert step(asked, newest=40, now=130.0) is StepKind.STOP  # the wait is over
    assert step(stopped, source=stopping, now=140.0) is StepKind.WAIT_STOP
    assert step(stopped, source=stopping, now=150.0) is StepKind.KILL  # grace: 30 s
    assert step(stopped, source=stopping, alive=False, now=125.0) is StepKind.RECORD_END
    queued = dataclasses.replace(JOB, state=JobState.QUEUED)
    ended = dataclasses.replace(SRC, state=IncarnationState.EXITED)
    assert step(stopped, job=queued, source=ended) is StepKind.LAUNCH


def test_a_migration_rolls_back_only_before_its_source_was_asked_to_stop() -> None:
    assert step(now=700.0) is StepKind.ROLLBACK  # the deadline, source still running
    assert step(alive=None, now=700.0) is StepKind.ROLLBACK
    assert step(cordoned=True) is StepKind.ROLLBACK
    stopping = dataclasses.replace(SRC, state=IncarnationState.STOPPING)
    assert step(source=stopping, now=10_000.0) is StepKind.KILL  # past it: finished, not undone
    for state in (JobState.SUCCEEDED, JobState.HELD, JobState.CANCELLED):
        assert step(job=dataclasses.replace(JOB, state=state)) is StepKind.ROLLBACK
    assert step(job=dataclasses.replace(JOB, cancel_requested=True)) is StepKind.ROLLBACK
    assert step(job=dataclasses.replace(JOB, incarnation=2)) is StepKind.ROLLBACK
    assert step(job=None) is StepKind.ROLLBACK


def test_a_node_that_does_not_answer_is_waited_for() -> None:
    assert step(alive=None) is StepKind.WAIT
    stopping = dataclasses.replace(SRC, state=IncarnationState.STOPPING)
    assert step(source=stopping, alive=None, now=10_000.0) is StepKind.WAIT


# --- node health -----------------------------------------------------------------------------


def verdict(name: str, action: Action, severity: Severity = Severity.CRITICAL) -> NodeVerdict:
    if action is Action.NONE:
        severity = Severity.OK
    reasons = () if action is Action.NONE else (Reason("r", f"{action} reason", severity, action),)
    return NodeVerdict(name, severity.verdict, severity, action, reasons, ())


Said = Action | tuple[Action, Severity]


def run(
    actions: list[dict[str, Said]],
    *,
    policy: AutoDrainPolicy | None = None,
    cordons: dict[str, Cordon] | None = None,
    dt: float = 5.0,
) -> list[tuple[set[str], set[str], set[str]]]:
    """Passes of (node -> action); per pass: (cordoned, drained, uncordoned) nodes."""
    policy = policy or AutoDrainPolicy()
    cordons = dict(cordons or {})
    health: dict[str, NodeHealth] = {}
    out = []
    now = 0.0
    for i, pass_actions in enumerate(actions):
        now = i * dt
        for name, said in pass_actions.items():
            v = verdict(name, *said) if isinstance(said, tuple) else verdict(name, said)
            health[name] = track(health.get(name), v, reachable=True, now=now, cap=10)
        plan = decide(health, cordons, drains_last_hour=0, policy=policy, now=now)
        for s in plan.cordon:
            cordons[s.node] = Cordon(s.node, s.why, "gpuctl", "health", now)
        for s in plan.uncordon:
            del cordons[s.node]
        for name in plan.start_drain:
            health[name] = dataclasses.replace(health[name], drain_started_at=now)
        out.append(
            (
                {s.node for s in plan.cordon},
                {s.node for s in plan.drain},
                {s.node for s in plan.uncordon},
            )
        )
    return out


def test_cordon_at_first_sight_drain_after_the_hysteresis() -> None:
    d, ok = Action.DRAIN, Action.NONE
    sick: dict[str, Said] = {"a": d, "b": ok, "c": ok}
    passes = run([sick] * 3, policy=AutoDrainPolicy(drain_after_passes=2))
    assert passes == [({"a"}, set(), set()), (set(), {"a"}, set()), (set(), {"a"}, set())]


def test_unknown_health_cordons_and_never_drains() -> None:
    unknown = verdict("a", Action.DRAIN, Severity.UNKNOWN)
    h = track(None, unknown, reachable=True, now=0.0, cap=5)
    assert h.action is Action.CORDON and not h.healthy


def test_a_node_that_does_not_answer_is_neither_healthy_nor_drained() -> None:
    h = track(None, verdict("a", Action.DRAIN), reachable=False, now=0.0, cap=5)
    assert h.action is Action.NONE and not h.healthy


def test_the_rate_limit_and_the_mass_unhealthy_guard() -> None:
    policy = AutoDrainPolicy(drain_after_passes=1, max_drains_per_hour=1)
    two = run(
        [{"a": Action.DRAIN, "b": Action.DRAIN, "c": Action.NONE, "d": Action.NONE}], policy=policy
    )
    assert two[0][1] in ({"a"}, {"b"})  # one of the two, the other waits
    three = run([{"a": Action.DRAIN, "b": Action.DRAIN, "c": Action.DRAIN, "d": Action.NONE}])
    assert three[0] == ({"a", "b", "c"}, set(), set())  # most unhealthy: cordons, no drain


def test_a_drain_of_an_empty_node_neither_waits_for_nor_spends_the_rate_limit() -> None:
    policy = AutoDrainPolicy(drain_after_passes=1, max_drains_per_hour=1)
    health = {
        n: track(None, verdict(n, Action.DRAIN), reachable=True, now=0.0, cap=5)
        for n in ("a", "b", "c")
    }
    health |= {
        n: track(None, verdict(n, Action.NONE), reachable=True, now=0.0, cap=5) for n in "def"
    }
    plan = decide(health, {}, drains_last_hour=1, policy=policy, now=0.0, loaded={"c"})
    assert plan.free_drain == ("a", "b") and plan.start_drain == ("a", "b")  # budget spent
    assert [s.node for s in plan.held] == ["c"]
    plan = decide(health, {}, drains_last_hour=0, policy=policy, now=0.0, loaded={"c"})
    assert plan.start_drain == ("a", "b", "c") and plan.free_drain == ("a", "b")


def test_a_flapping_node_is_cordoned_and_its_cordon_kept_while_it_still_flaps() -> None:
    policy = AutoDrainPolicy(flap_outages=3, flap_window_s=600.0, cool_down_s=60.0)
    assert flapping({"a": 2, "b": 3}, policy) == {
        "b": "flapping: stopped answering and came back 3 times within 10m00s (limit 3)"
    }
    assert flapping({"b": 9}, AutoDrainPolicy(flap_outages=0)) == {}
    well = {n: track(None, verdict(n, Action.NONE), reachable=True, now=0.0, cap=5) for n in "abc"}
    plan = decide(well, {}, drains_last_hour=0, policy=policy, now=0.0, flaps={"b": "flaps"})
    assert plan.quarantine == (NodeStep("b", "flaps"),) and plan.cordon == ()
    mine = {"b": Cordon("b", "flaps", "gpuctl", "health", 0.0)}
    kept = decide(well, mine, drains_last_hour=0, policy=policy, now=900.0, flaps={"b": "x"})
    assert kept.uncordon == () and kept.quarantine == ()  # healthy for 900 s, yet still flapping
    lifted = decide(well, mine, drains_last_hour=0, policy=policy, now=900.0)
    assert [s.node for s in lifted.uncordon] == ["b"]


def test_the_cool_down_lifts_only_gpuctl_s_own_cordon() -> None:
    person = Cordon("b", "rma", "alice", "operator", 0.0)
    policy = AutoDrainPolicy(cool_down_s=60.0)
    sick: dict[str, Said] = {"a": Action.CORDON, "b": Action.CORDON, "c": Action.NONE}
    well: dict[str, Said] = {"a": Action.NONE, "b": Action.NONE, "c": Action.NONE}
    passes = run([sick] + [well] * 20, policy=policy, cordons={"b": person}, dt=5.0)
    lifted = [u for _, _, u in passes]
    assert passes[0][0] == {"a"}  # b was cordoned by a person already
    assert lifted.index({"a"}) == 13  # healthy from pass 1 (t=5): 60 s later, at t=65
    assert all("b" not in u for u in lifted)


@given(st.lists(st.sampled_from(list(Action)), min_size=1, max_size=30))
def test_a_person_s_cordon_is_never_lifted_and_unknown_never_drains(actions: list[Action]) -> None:
    person = Cordon("p", "maintenance", "alice", "operator", 0.0)
    passes = run(
        [{"p": a, "u": (Action.DRAIN, Severity.UNKNOWN), "x": Action.NONE} for a in actions],
        policy=AutoDrainPolicy(drain_after_passes=1, cool_down_s=0.0),
        cordons={"p": person},
    )
    assert all("p" not in c and "p" not in u for c, _, u in passes)
    assert all("u" not in d for _, d, _ in passes)
