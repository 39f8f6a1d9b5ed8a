"""The control loop records the jobs Slurm runs (`ops.loop._slurm`): each pass reads Slurm
through its poll's view (a scripted `SchedulerView` here) and writes each state change into the
store once, with the loop's events, so status, metrics and `jobs` read the same state; it never
launches, fences nor fails over such a job."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.jobs.model import EndReason, Event, IncarnationState, Job, JobState
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSpec
from gpuctl.core.scheduler import SchedJob, SchedQueued, SchedulerView
from gpuctl.ops import fleetstatus
from gpuctl.ops import jobs as jobs_service
from gpuctl.ops.actions import drain_text
from gpuctl.ops.fleetcheck import check_fleet
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.loop import _slurm
from gpuctl.ops.loop.model import Pass
from gpuctl.ops.metrics._jobs import read_jobs
from gpuctl.ops.moves import nodeops
from gpuctl.ops.moves.consolidate import facts_for
from gpuctl.ops.moves.migrate import migrate
from gpuctl.ops.moves.nodeops import cordon, uncordon
from gpuctl.testing.fakerunner import FakeFleet
from gpuctl.testing.memstore import MemoryStore
from tests.pg import STORES, open_test_store
from tests.unit.ops.test_reconcile import Loop, make
from tests.unit.ops.test_slurm_jobs import slurm_job

T0 = 1_000.0


class SlurmFleet:
    """The fake fleet's poll with a Slurm view the test sets (`view`)."""

    def __init__(self, inner: FakeFleet) -> None:
        self.inner = inner
        self.view = SchedulerView(cluster="hpc1")
        self.polls = 0

    def gather(self, nodes: Inventory | Iterable[NodeSpec]) -> FleetSnapshot:
        self.polls += 1
        return dataclasses.replace(self.inner.gather(nodes), scheduler=self.view)


@pytest.fixture
def markers(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[int, int] | None]:
    """The exit markers the batch scripts wrote, by gpuctl job id (none: not there)."""
    found: dict[str, tuple[int, int] | None] = {}

    def read(p: Pass, jobs: list[Job]) -> dict[str, tuple[int, int] | None]:
        return {j.id: found.get(j.id) for j in jobs}

    monkeypatch.setattr(_slurm, "exit_markers", read)
    return found


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


def setup(store: Store | None = None) -> tuple[Loop, SlurmFleet]:
    t = make(store or MemoryStore())
    fleet = SlurmFleet(t.fleet)
    t.loop.fleet = fleet
    job = slurm_job(t.submit("template"))
    t.store.add_job(job, Event(0.0, "alice", "submit", "to Slurm", job_id=job.id))
    t.store.update_job("template-000001", state=JobState.CANCELLED)
    return t, fleet


def running(restarts: int = 0, cards: tuple[int, ...] = (1,)) -> SchedulerView:
    job = SchedJob("42", "n2", cards, "alice", "sjob", "RUNNING", restarts, T0 + restarts)
    return SchedulerView(cluster="hpc1", jobs=(job,))


def queued(
    state: str = "PENDING", reason: str | None = "Resources", restarts: int = 0
) -> SchedulerView:
    return SchedulerView(cluster="hpc1", queue=(SchedQueued("42", state, reason, restarts),))


def slurm_events(t: Loop) -> list[str]:
    return [e.kind for e in t.store.events(job_id="sjob-1") if e.actor == "gpuctl"]


def test_a_pending_job_keeps_queued_with_slurms_reason_and_no_event() -> None:
    t, fleet = setup()
    fleet.view = queued()
    t.step()
    t.step()
    job = t.job("sjob-1")
    assert (job.state, job.reason) == (JobState.QUEUED, "Slurm job 42: PENDING (Resources)")
    assert slurm_events(t) == [] and t.store.incarnations("sjob-1") == []


def test_running_is_recorded_once_with_slurms_node_cards_and_start_and_counted_once() -> None:
    t, fleet = setup()
    fleet.view = running()
    t.step()
    t.step()  # idempotent: the same reading writes nothing again
    job, inc = t.job("sjob-1"), t.inc("sjob-1")
    assert job.state is JobState.RUNNING and job.incarnation == 1
    assert (inc.state, inc.node, inc.cards, inc.started_at) == (
        IncarnationState.RUNNING,
        "n2",
        (1,),
        T0,
    )
    assert slurm_events(t) == ["slurm_running"]
    # the loop neither launched, fenced nor ended Slurm's run (its node lists no run of it)
    assert [r.job_id for _, r in t.runner.launches] == []
    assert t.runner.fences == []
    # status, metrics and jobs read the same: running on n2 card 1, the card counted once
    snapshot = fleet.gather(t.cluster.inventory())
    state = fleetstatus.fleet_state(snapshot, t.store)
    assert [a.job for a in state.allocations if a.node == "n2" and 1 in a.cards] == ["slurm:42"]
    series = {r.id: r for r in read_jobs(t.store, t.clock.now(), None).jobs}
    assert (series["sjob-1"].state, series["sjob-1"].node, series["sjob-1"].cards) == (
        "running",
        "n2",
        1,
    )
    assert jobs_service.fleet_numbers(t.store, t.clock.now()).checkpoint_running_jobs == 1
    assert check_invariants(t.store) == []


def test_a_down_node_never_fails_over_a_job_slurm_runs() -> None:
    t, fleet = setup()
    fleet.view = running()
    t.step()
    t.cluster.partition("n2")
    t.step(advance_s=120.0)  # past the grace: gpuctl's own jobs there would be lost
    assert t.inc("sjob-1").state is IncarnationState.RUNNING
    assert t.job("sjob-1").state is JobState.RUNNING


def test_a_requeue_ends_the_run_and_the_next_run_is_the_next_incarnation(
    markers: dict[str, tuple[int, int] | None],
) -> None:
    t, fleet = setup()
    fleet.view = running()
    t.step()
    fleet.view = queued("PENDING", "BeginTime", restarts=1)
    t.step()
    first = t.inc("sjob-1", 1)
    assert (first.state, first.end_reason) == (IncarnationState.EXITED, EndReason.NODE_LOST)
    assert t.job("sjob-1").state is JobState.QUEUED
    fleet.view = running(restarts=1, cards=(0,))
    t.step()
    t.step()
    second = t.inc("sjob-1", 2)
    assert (second.state, second.cards) == (IncarnationState.RUNNING, (0,))
    assert slurm_events(t) == ["slurm_running", "slurm_exit", "requeue", "slurm_running"]
    figures = jobs_service.fleet_numbers(t.store, t.clock.now())
    assert (figures.failovers_attempted, figures.failovers_succeeded) == (1, 1)


def test_runs_slurm_made_between_two_passes_keep_the_jobs_incarnation_numbers() -> None:
    t, fleet = setup()
    fleet.view = running(restarts=2)
    t.step()
    assert [(i.n, i.state) for i in t.store.incarnations("sjob-1")] == [
        (1, IncarnationState.EXITED),
        (2, IncarnationState.EXITED),
        (3, IncarnationState.RUNNING),
    ]
    assert t.job("sjob-1").incarnation == 3


@pytest.mark.parametrize(
    ("marker", "state", "reason"),
    [
        ((1, 0), JobState.SUCCEEDED, None),
        ((1, 3), JobState.FAILED, "Slurm job 42: exited 3"),
        (None, JobState.FAILED, "Slurm job 42: Slurm lists it no more and its batch script "
         "wrote no exit status"),
    ],
)  # fmt: skip
def test_a_job_slurm_lists_no_more_ends_by_its_exit_marker(
    markers: dict[str, tuple[int, int] | None],
    marker: tuple[int, int] | None,
    state: JobState,
    reason: str | None,
) -> None:
    t, fleet = setup()
    fleet.view = running()
    t.step()
    markers["sjob-1"] = marker
    fleet.view = SchedulerView(cluster="hpc1")
    t.step()
    t.step()
    job, inc = t.job("sjob-1"), t.inc("sjob-1")
    assert (job.state, job.reason) == (state, reason)
    assert (inc.state, inc.exit_code) == (
        IncarnationState.EXITED,
        None if marker is None else marker[1],
    )
    assert not inc.state.holds_cards
    end = "succeeded" if state is JobState.SUCCEEDED else "failed"
    assert slurm_events(t) == ["slurm_running", "slurm_exit", end]
    counts = jobs_service.fleet_numbers(t.store, t.clock.now())
    assert counts.checkpoint_running_jobs == 0


def test_a_job_cancelled_through_gpuctl_has_its_run_closed_when_slurm_lets_it_go(
    markers: dict[str, tuple[int, int] | None],
) -> None:
    t, fleet = setup()
    fleet.view = running()
    t.step()
    t.store.update_job("sjob-1", state=JobState.CANCELLED, cancel_requested=True)
    t.step()  # Slurm still lists it running (scancel takes a moment): nothing yet
    assert t.inc("sjob-1").state is IncarnationState.RUNNING
    fleet.view = queued("CANCELLED", None)
    t.step()
    inc = t.inc("sjob-1")
    assert (inc.state, inc.end_reason) == (IncarnationState.KILLED, EndReason.CANCELLED)
    assert t.job("sjob-1").state is JobState.CANCELLED


def test_without_slurms_view_the_jobs_keep_their_states() -> None:
    t, fleet = setup()
    fleet.view = running()
    t.step()
    fleet.view = SchedulerView(cluster="hpc1", error="squeue: timed out")
    report = t.step()
    assert t.inc("sjob-1").state is IncarnationState.RUNNING
    assert any("Slurm not read this pass (squeue: timed out)" in a.message for a in report.actions)


def test_a_drain_plan_moves_gpuctls_job_and_leaves_slurms_to_slurm() -> None:
    t, fleet = setup()
    fleet.view = running()  # Slurm's job on n2, card 1
    t.step()
    cordon(t.store, "n1", reason="keep gpuctl's job on n2", operator="alice", clock=t.clock)
    ours = t.submit("train")
    t.step()
    assert t.inc(ours.id).node == "n2"
    uncordon(t.store, "n1", operator="alice", clock=t.clock)
    p = nodeops.tick(t.loop, fleet.gather(t.cluster.inventory()))
    plan = nodeops.plan_drain(p, "n2", reason="fan noise")
    assert [(m.job_id, m.to_node) for m in plan.moves] == [(ours.id, "n1")]
    assert plan.left_to_slurm == (("sjob-1", "42"),)
    assert plan.to_dict()["left_to_slurm"] == [{"job_id": "sjob-1", "slurm_job_id": "42"}]
    text = drain_text(plan)
    assert "move 1 of 1 job(s) off it" in text
    assert "left to Slurm: sjob-1 (Slurm job 42): Slurm's jobs are Slurm's to move" in text
    # consolidation leaves it where Slurm put it, saying why; a move asked anyway is refused
    facts = {f.job: f for f in facts_for(t.store, t.clock.now())}
    assert facts["sjob-1"].hold == "Slurm runs it: Slurm's jobs are Slurm's to move"
    assert facts[ours.id].hold is None
    moved = migrate(t.loop, "sjob-1", None, reason="asked", actor="alice", sleep=t.clock.advance)
    assert (moved.outcome, moved.message) == ("not_started", "Slurm runs it: Slurm's to move")
    assert t.inc("sjob-1").state is IncarnationState.RUNNING and t.runner.signals == []


def test_a_run_slurm_started_on_a_node_gpuctl_cordoned_is_recorded_running(store: Store) -> None:
    t, fleet = setup(store)
    cordon(store, "n2", reason="fan noise", operator="alice", clock=t.clock)
    fleet.view = running()  # Slurm runs job 42 on n2 all the same (its drain lets jobs finish)
    t.step()
    job = t.job("sjob-1")
    assert (job.state, job.incarnation, job.reason) == (JobState.RUNNING, 1, None)
    inc = t.inc("sjob-1")
    assert (inc.state, inc.node, inc.cards) == (IncarnationState.RUNNING, "n2", (1,))
    assert slurm_events(t) == ["slurm_running"]
    assert check_invariants(store) == []
    t.step()
    assert slurm_events(t) == ["slurm_running"] and len(store.incarnations("sjob-1")) == 1


def test_a_slurm_run_on_a_card_gpuctl_gives_another_job_is_recorded_as_two_owners(
    store: Store,
) -> None:
    t, fleet = setup(store)
    cordon(store, "n1", reason="keep gpuctl's job on n2", operator="alice", clock=t.clock)
    ours = t.submit("train", resources={"gpus": 1, "mem_per_gpu": "whole"})
    t.step()
    theirs = t.inc(ours.id)
    assert theirs.node == "n2"
    fleet.view = running(cards=theirs.cards)  # Slurm says its job 42 has that very card
    t.step()
    assert t.job("sjob-1").state is JobState.RUNNING
    inc = t.inc("sjob-1")
    assert (inc.state, inc.cards) == (IncarnationState.RUNNING, theirs.cards)
    card = theirs.cards[0]
    (clash,) = store.events(kinds=["card_clash"])
    assert (clash.job_id, clash.node, clash.outcome) == ("sjob-1", "n2", "failed")
    assert clash.message == (
        f"card {card} of n2 has two owners: Slurm runs sjob-1 (Slurm job 42) incarnation 1 "
        f"there, and gpuctl's store gives it to job {ours.id} incarnation 1"
    )
    snapshot = fleet.gather(t.cluster.inventory())
    found = check_fleet(store, t.cluster.inventory(), t.runner, snapshot)
    assert (
        f"card {card} of n2: two owners: Slurm runs sjob-1#1 there, and gpuctl gives it to "
        f"{ours.id}#1"
    ) in found.problems
    t.step()  # said once: the next pass records nothing more
    assert len(store.events(kinds=["card_clash"])) == 1
