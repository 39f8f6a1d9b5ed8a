"""The shared invariant checker reports each invariant broken on purpose, and nothing on a sound
history."""

import dataclasses
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from gpuctl.adapters.store import open_store
from gpuctl.core.jobs.migration import Reservation
from gpuctl.core.jobs.model import (
    Checkpoint,
    EndReason,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
)
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.ops.invariants import check_invariants

R, L, X = IncarnationState.RUNNING, IncarnationState.LOST, IncarnationState.EXITED
CAP = {("n1", 0): 40_000, ("n2", 0): 40_000}


def job(job_id: str = "a-000001", state: JobState = JobState.RUNNING, n: int = 1) -> Job:
    return Job(job_id, "a", JobSpec(JobRequest("a")), state, 0, "standard", 1.0, incarnation=n)


def inc(
    n: int = 1,
    state: IncarnationState = R,
    *,
    job_id: str = "a-000001",
    node: str = "n1",
    mib: int = 10_000,
    whole: bool = False,
    at: float = 10.0,
    resume: int | None = None,
) -> Incarnation:
    return Incarnation(job_id, n, node, (0,), (), mib, whole, state, at, "/r", resume_step=resume)


@dataclasses.dataclass
class Records:
    """What the checker reads of a store, set up directly (a store refuses to break them)."""

    job_list: list[Job]
    inc_list: list[Incarnation]
    checkpoint_list: list[Checkpoint] = dataclasses.field(default_factory=list)
    reservation_list: list[Reservation] = dataclasses.field(default_factory=list)
    event_list: list[Event] = dataclasses.field(default_factory=list)

    def reservations(self) -> list[Reservation]:
        return self.reservation_list

    def jobs(self) -> list[Job]:
        return self.job_list

    def incarnations(self) -> list[Incarnation]:
        return self.inc_list

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        return [c for c in self.checkpoint_list if c.job_id == job_id]

    def events(self, *, job_id: str | None = None, kinds: Sequence[str] = ()) -> list[Event]:
        return [e for e in self.event_list if e.job_id == job_id and e.kind in kinds]


def check(records: Records, capacity: dict[tuple[str, int], int] | None = None) -> list[str]:
    return check_invariants(records, capacity_mib=capacity)  # type: ignore[arg-type]


def test_a_sound_history_checks_clean() -> None:
    records = Records(
        [job(n=2), job("b-000002", JobState.QUEUED, 0), job("c-000003", JobState.SUCCEEDED)],
        [inc(1, L), inc(2, R, node="n2", at=20.0, resume=100), inc(1, X, job_id="c-000003")],
        [Checkpoint("a-000001", 1, 100, "/ck/100", 15.0, "shared")],
    )
    assert check(records, CAP) == []


def test_a_running_job_whose_incarnation_is_missing_is_lost() -> None:
    assert check(Records([job(n=2)], [inc(1, X)])) == [
        "job a-000001: at incarnation 2, but the newest is 1",
        "job a-000001: running, but its incarnation 2 is missing",
    ]


def test_a_running_job_whose_only_copy_ended_is_lost() -> None:
    assert check(Records([job()], [inc(1, L)])) == [
        "job a-000001: running, but its incarnation 1 is lost: nothing runs it (a lost job)"
    ]


def test_an_exit_recorded_before_its_job_was_settled_is_pending_not_lost() -> None:
    exited = dataclasses.replace(inc(1, X), ended_at=20.0, exit_code=0)
    assert check(Records([job()], [exited])) == []  # the next pass settles the job
    unrecorded = inc(1, X)  # exited, but when is unknown: not a recorded end
    assert check(Records([job()], [unrecorded])) == [
        "job a-000001: running, but its incarnation 1 is exited: nothing runs it (a lost job)"
    ]


def test_two_live_incarnations_of_one_job_are_reported() -> None:
    problems = check(Records([job(n=2)], [inc(1, R), inc(2, R, node="n2")]))
    assert "job a-000001: 2 live incarnations (1, 2); at most one may run" in problems
    assert "job a-000001: incarnation 1 still live beside the current one" in problems


def test_a_live_copy_of_a_job_that_is_not_running_is_an_orphan() -> None:
    assert check(Records([job(state=JobState.CANCELLED)], [inc(1, IncarnationState.STOPPING)])) == [
        "job a-000001: cancelled, but incarnation 1 is still stopping (an orphan copy)"
    ]


def test_a_double_booked_card_is_reported() -> None:
    records = Records(
        [job(), job("b-000002")],
        [inc(mib=30_000), inc(job_id="b-000002", mib=20_000)],
    )
    assert check(records) == []  # without capacities only whole cards can be judged
    assert check(records, CAP) == [
        "card 0 of n1: 50000 MiB held (a-000001#1, b-000002#1) on a 40000 MiB card"
    ]


def test_a_shared_whole_card_is_reported_and_a_lost_copy_still_counts() -> None:
    records = Records(
        [job(n=2), job("b-000002")],
        [inc(1, L, whole=True, mib=40_000), inc(2, node="n2"), inc(job_id="b-000002", mib=1)],
    )
    assert check(records, CAP) == [
        "card 0 of n1: a whole card is held by 2 (a-000001#1, b-000002#1)"
    ]


def test_a_gap_in_incarnation_numbers_is_reported() -> None:
    assert check(Records([job(n=3)], [inc(1, X), inc(3, R)])) == [
        "job a-000001: incarnations [1, 3] are not numbered 1..2"
    ]


def test_incarnations_of_no_job_are_reported() -> None:
    assert check(Records([], [inc(1, X, job_id="z-000009")])) == [
        "job z-000009: incarnations 1 belong to no job"
    ]


def test_a_restart_that_did_not_resume_from_the_last_committed_checkpoint_is_reported() -> None:
    cps = [
        Checkpoint("a-000001", 1, 100, "/ck/100", 12.0, "shared"),
        Checkpoint("a-000001", 1, 200, "/ck/200", 18.0, "shared"),
        Checkpoint("a-000001", 2, 300, "/ck/300", 30.0, "shared"),  # after incarnation 2 began
    ]
    incs = [inc(1, L), inc(2, R, node="n2", at=20.0, resume=100)]
    assert check(Records([job(n=2)], incs, cps)) == [
        "job a-000001: incarnation 2 started from step 100, but the newest committed "
        "checkpoint before it was step 200"
    ]
    fresh = [inc(1, L), inc(2, R, node="n2", at=20.0)]
    assert check(Records([job(n=2)], fresh, cps)) == [
        "job a-000001: incarnation 2 started fresh, but the newest committed checkpoint "
        "before it was step 200"
    ]


def test_a_recorded_checkpoint_found_damaged_before_the_restart_may_be_skipped() -> None:
    cps = [
        Checkpoint("a-000001", 1, 100, "/ck/100", 12.0, "shared"),
        Checkpoint("a-000001", 1, 200, "/ck/200", 18.0, "shared"),
    ]
    incs = [inc(1, L), inc(2, R, node="n2", at=20.0, resume=100)]
    damaged = Event(19.0, "gpuctl", "checkpoint_invalid", "step 200 is not usable", "a-000001",
                    data={"incarnation": 1, "step": 200})  # fmt: skip
    assert check(Records([job(n=2)], incs, cps, event_list=[damaged])) == []
    late = dataclasses.replace(damaged, at=25.0)  # found damaged only after the restart
    assert len(check(Records([job(n=2)], incs, cps, event_list=[late]))) == 1


def test_the_checker_reads_a_real_store(tmp_path: Path) -> None:
    with open_store(tmp_path / "state", write=True) as store:
        for jid in ("a-000001", "b-000002"):
            store.add_job(job(jid, JobState.QUEUED, 0), Event(1.0, "t", "submit", "m", jid))
        event = Event(2.0, "t", "launch", "m")
        launching = inc(1, IncarnationState.LAUNCHING, mib=30_000)
        store.begin_launch(launching, capacity_mib=CAP, event=event)
        store.update_incarnation("a-000001", 1, state=IncarnationState.RUNNING, pid=7)
        assert check_invariants(store, capacity_mib=CAP) == []
        # what a store refuses, forced in behind its back: a second holder on a full card
        raw = sqlite3.connect(store.path)
        with raw:
            raw.execute(
                "INSERT INTO incarnations (job_id, n, node, cards, gpu_uuids, mib_per_card, whole, "
                "state, started_at, run_dir) VALUES ('b-000002', 1, 'n1', '[0]', '[]', 20000, 0, "
                "'running', 3.0, '/r')"
            )
            raw.execute(  # every writer of a job row raises its version (schema v7)
                "UPDATE jobs SET state = 'running', incarnation = 1, version = version + 1 "
                "WHERE id = 'b-000002'"
            )
        raw.close()
        assert check_invariants(store, capacity_mib=CAP) == [
            "card 0 of n1: 50000 MiB held (a-000001#1, b-000002#1) on a 40000 MiB card"
        ]
        store.update_incarnation(
            "a-000001", 1, state=IncarnationState.KILLED, end_reason=EndReason.FENCED
        )
        assert check_invariants(store, capacity_mib=CAP) == [
            "job a-000001: running, but its incarnation 1 is killed: nothing runs it (a lost job)"
        ]


def reserved(
    job_id: str = "a-000001",
    *,
    node: str = "n2",
    mib: int = 10_000,
    whole: bool = False,
    n: int = 1,
) -> Reservation:
    return Reservation(
        job_id, n, "n1", node, (0,), mib, whole, (40_000,), 5.0, 600.0, 30.0, 30.0, "drain", "op"
    )


def test_a_reservation_is_not_a_second_live_incarnation_but_holds_its_cards() -> None:
    records = Records([job(), job("b-000002")], [inc(), inc(job_id="b-000002", node="n2")])
    records.reservation_list = [reserved(mib=30_000)]
    assert check(records, CAP) == []  # a running job and its reserved target: sound
    records.reservation_list = [reserved(whole=True, mib=40_000)]
    assert check(records, CAP) == [
        "card 0 of n2: a whole card is held by 2 (b-000002#1, a-000001#reserved)"
    ]


def test_a_reservation_of_a_job_that_moved_on_or_ended_is_reported() -> None:
    stale = Records([job(n=2)], [inc(1, X), inc(2, R, node="n2")], [], [reserved(n=1)])
    assert check(stale) == [
        "job a-000001: at incarnation 2, but its reservation on n2 moves incarnation 1"
    ]
    done = Records([job(state=JobState.SUCCEEDED)], [inc(1, X)], [], [reserved()])
    assert check(done) == ["job a-000001: succeeded, but it still holds a reservation on n2"]
