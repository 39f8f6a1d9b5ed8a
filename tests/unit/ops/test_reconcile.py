"""The control loop over a scripted fleet (fake runner, fake gather, a clock the test advances),
against the in-memory store and the SQLite store alike."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.adapters.node import LaunchFailed
from gpuctl.adapters.protocols import Store
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import (
    Cordon,
    EndReason,
    Event,
    Incarnation,
    IncarnationState,
    JobState,
)
from gpuctl.core.jobs.restarts import RestartPolicy
from gpuctl.core.model import GpuProcess
from gpuctl.core.placement.model import Settings
from gpuctl.errors import StoreConflict
from gpuctl.ops import jobs as jobs_service
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.loop import PassReport, Reconciler, ReconcileSettings
from gpuctl.testing.drainkit import Kit, LoopKit
from gpuctl.testing.fakerunner import FakeCluster, FakeFleet, FakeRunner, ManualClock
from tests.pg import STORES, open_test_store

GIB = 1024
CKPT = "/shared/ckpt"


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path / "state")
    yield s
    s.close()


@dataclasses.dataclass
class Loop(LoopKit[FakeRunner, FakeFleet]):
    """The loop over the plain fakes; `kinds` are gpuctl's own events only."""

    def live(self, job_id: str) -> list[Incarnation]:
        return [i for i in self.store.incarnations(job_id) if i.state.holds_cards]

    def kinds(self, job_id: str | None = None) -> list[str]:
        return [e.kind for e in self.store.events(job_id=job_id) if e.actor == "gpuctl"]


def make(
    store: Store,
    nodes: tuple[str, ...] = ("n1", "n2"),
    *,
    gpus: int = 2,
    grace_s: float = 30.0,
    restarts: RestartPolicy | None = None,
    placement: Settings | None = None,
    state_dir: str | None = None,
) -> Loop:
    clock = ManualClock()
    cluster = FakeCluster.of(*nodes, gpus=gpus, clock=clock)
    runner, fleet = FakeRunner(cluster), FakeFleet(cluster)
    settings = ReconcileSettings(
        placement=placement or Settings(policy="best-fit", band_max=1.0, headroom=0.0),
        grace_s=grace_s,
        restarts=restarts or RestartPolicy(),
        checkpoint_scan_s=0.0,
    )
    loop = Reconciler(
        store, fleet, runner, cluster.inventory(), clock, settings, state_dir=state_dir
    )
    return Loop(store, clock, cluster, runner, fleet, loop)


def test_a_queued_job_is_placed_and_launched_with_the_checkpoint_contract(store: Store) -> None:
    t = make(store)
    job = t.submit("train")
    report = t.step()
    assert t.job(job.id).state is JobState.RUNNING
    inc = t.inc(job.id)
    assert inc.state is IncarnationState.RUNNING and inc.n == 1 and inc.pid is not None
    node, request = t.runner.launches[0]
    assert node == inc.node and request.incarnation == 1
    assert request.mib_per_card == 20 * GIB and request.mps_limit_mib == 20 * GIB
    assert request.cuda_visible_devices == ",".join(str(c) for c in inc.cards)
    assert request.checkpoint_dir == f"{CKPT}/{job.id}" and request.resume_from == ""
    assert [a.kind for a in report.actions if a.job_id == job.id] == ["launch", "launched"]
    assert t.kinds(job.id) == ["launch", "launched"]
    assert store.check() == [] and check_invariants(store) == []


def test_exit_zero_means_succeeded_and_the_cards_are_free(store: Store) -> None:
    t = make(store)
    job = t.submit("train")
    t.step()
    t.cluster.finish(job.id, 1, 0)
    t.step()
    assert t.job(job.id).state is JobState.SUCCEEDED
    assert t.inc(job.id).state is IncarnationState.EXITED and t.inc(job.id).exit_code == 0
    assert t.live(job.id) == []


def test_a_crash_restarts_with_the_next_incarnation_until_the_budget_then_holds(
    store: Store,
) -> None:
    t = make(store, restarts=RestartPolicy(budget=2, thrash_window_s=1.0))
    job = t.submit("train", restart_budget=2)
    t.step()
    for n in (1, 2, 3):
        t.clock.advance(100)  # long runs: no crash loop
        t.cluster.finish(job.id, n, 1)
        t.step()  # records the exit; restarts within the budget
        if n < 3:
            assert t.job(job.id).state is JobState.RUNNING
            assert t.inc(job.id).n == n + 1
    held = t.job(job.id)
    assert held.state is JobState.HELD
    assert held.reason is not None and "restart budget spent: 3 failures" in held.reason
    assert held.restarts == 2
    assert [r.incarnation for _, r in t.runner.launches] == [1, 2, 3]


def test_a_crash_loop_is_held_with_a_reason_and_its_node_is_not_cordoned(store: Store) -> None:
    t = make(store, restarts=RestartPolicy(budget=10, thrash_window_s=60, thrash_starts=3))
    job = t.submit("train")
    t.step(1)
    for n in (1, 2, 3):
        t.cluster.finish(job.id, n, 2)
        t.step(1)
    held = t.job(job.id)
    assert held.state is JobState.HELD
    assert held.reason is not None and "crash loop" in held.reason
    assert "node is not blamed" in held.reason
    assert store.cordons() == []
    assert len(t.runner.launches) == 3


def test_a_node_silent_for_less_than_the_grace_changes_nothing(store: Store) -> None:
    t = make(store, grace_s=30)
    job = t.submit("train")
    t.step()
    node = t.inc(job.id).node
    t.cluster.partition(node)
    first = t.step(5)
    assert [a.kind for a in first.actions] == ["node_failing"]
    second = t.step(20)
    assert t.job(job.id).state is JobState.RUNNING
    assert t.inc(job.id).state is IncarnationState.RUNNING
    assert second.nodes[0 if node == "n1" else 1].liveness == "failing"
    t.cluster.heal(node)
    t.step(1)
    assert t.inc(job.id).state is IncarnationState.RUNNING
    assert len(t.runner.launches) == 1
    assert "node_recovered" in t.kinds()


def test_past_the_grace_the_job_restarts_elsewhere_from_its_newest_committed_checkpoint(
    store: Store,
) -> None:
    t = make(store, grace_s=30)
    job = t.submit("train")
    t.step()
    first = t.inc(job.id)
    folder = f"{CKPT}/{job.id}"
    t.clock.advance(10)
    t.cluster.commit(folder, step=100, incarnation=1, committed_at=t.clock.now())
    t.clock.advance(10)
    t.cluster.commit(folder, step=200, incarnation=1, committed_at=t.clock.now())
    t.cluster.commit(folder, step=300, incarnation=1, committed_at=t.clock.now(), valid=False)
    t.step()  # the loop records the newest valid one
    t.cluster.kill_node(first.node)
    t.step(5)  # failing
    t.step(31)  # down: lost and requeued, relaunched elsewhere at once
    lost = t.inc(job.id, 1)
    assert lost.state is IncarnationState.LOST and lost.end_reason is EndReason.NODE_LOST
    second = t.inc(job.id, 2)
    assert second.node != first.node and second.state is IncarnationState.RUNNING
    assert second.resume_step == 200
    request = t.runner.launches[-1][1]
    assert request.resume_from == f"{folder}/step-00000200"
    assert t.job(job.id).state is JobState.RUNNING and t.job(job.id).incarnation == 2
    assert "checkpoint_skipped" in t.kinds(job.id)  # the corrupt step 300, loudly
    assert [c.step for c in store.checkpoints(job.id)][:1] == [200]
    assert check_invariants(store) == []


def test_a_node_whose_clock_is_ten_minutes_behind_keeps_its_checkpoints_good(
    store: Store,
) -> None:
    # The job stamps its checkpoints with its node's clock; gpuctl measured the node at launch.
    t = make(store, grace_s=30)
    for node in t.cluster.nodes.values():
        node.clock_offset_s = -600.0
    job = t.submit("train")
    t.step()
    first = t.inc(job.id)
    assert first.clock_offset_s == -600.0
    folder = f"{CKPT}/{job.id}"
    t.clock.advance(10)
    committed = t.clock.now()
    t.cluster.commit(folder, step=100, incarnation=1, committed_at=committed - 600)
    t.step()
    # recorded on gpuctl's clock (its age is not 600 s off)
    assert [c.committed_at for c in store.checkpoints(job.id)] == [committed]
    t.cluster.kill_node(first.node)
    t.step(5)
    t.step(31)  # lost, relaunched elsewhere
    second = t.inc(job.id, 2)
    assert second.state is IncarnationState.RUNNING and second.resume_step == 100
    assert "checkpoint_skipped" not in t.kinds(job.id)
    assert check_invariants(store) == []


def test_a_node_that_returns_has_its_stale_incarnation_killed_and_cards_released(
    store: Store,
) -> None:
    t = make(store, grace_s=30)
    job = t.submit("train")
    t.step()
    old = t.inc(job.id).node
    t.cluster.partition(old)  # the job keeps running behind the partition
    t.step(5)
    t.step(31)
    assert t.inc(job.id).n == 2
    assert len(t.live(job.id)) == 2  # the lost copy keeps its cards until fenced
    t.cluster.heal(old)
    report = t.step(1)
    fenced = t.inc(job.id, 1)
    assert fenced.state is IncarnationState.KILLED
    assert (old, job.id, 1, "KILL") in t.runner.signals
    assert not t.cluster.run(job.id, 1).alive
    assert [i.n for i in t.live(job.id)] == [2]
    assert report.of("fence") and report.of("node_back")
    assert store.check() == [] and check_invariants(store) == []


def test_a_node_back_before_its_job_could_restart_elsewhere_keeps_its_copy(store: Store) -> None:
    t = make(store, ("n1", "n2"), gpus=1, grace_s=30)
    whole = {"gpus": 1, "mem_per_gpu": "whole"}
    a, b = t.submit("a", resources=whole), t.submit("b", resources=whole)
    t.step()
    node = t.inc(a.id).node
    t.cluster.partition(node)
    t.step(5)
    t.step(31)
    assert t.job(a.id).state is JobState.QUEUED  # lost, and no room elsewhere
    t.cluster.heal(node)
    report = t.step(1)
    assert report.of("adopt")
    assert t.job(a.id).state is JobState.RUNNING and t.inc(a.id).state is IncarnationState.RUNNING
    assert t.inc(a.id).n == 1 and len(t.runner.launches) == 2
    assert t.job(b.id).state is JobState.RUNNING
    t.cluster.finish(a.id, 1, 0)
    t.step()
    assert t.job(a.id).state is JobState.SUCCEEDED


def test_most_nodes_down_at_once_requeues_nothing(store: Store) -> None:
    t = make(store, ("n1", "n2", "n3"), grace_s=30)
    jobs = [t.submit(f"j{i}", resources={"gpus": 1, "mem_per_gpu": "whole"}) for i in range(3)]
    t.step()
    assert all(t.job(j.id).state is JobState.RUNNING for j in jobs)
    t.cluster.partition("n1")
    t.cluster.partition("n2")
    t.step(5)
    report = t.step(31)
    assert report.suspect_network
    assert all(t.job(j.id).state is JobState.RUNNING for j in jobs)
    assert all(i.state is not IncarnationState.LOST for j in jobs for i in t.live(j.id))
    assert [e.kind for e in store.events(kinds=["suspect_network"])] == ["suspect_network"]
    assert len(t.runner.launches) == 3
    t.cluster.heal("n1")  # 1 of 3 down: no longer suspect; n2's job fails over
    t.step(1)
    moved = [j for j in jobs if t.inc(j.id, 1).node == "n2"]
    assert all(t.inc(j.id, 1).state is IncarnationState.LOST for j in moved)


def test_spot_work_is_preempted_for_standard_work_most_recently_checkpointed_first(
    store: Store,
) -> None:
    t = make(store, ("n1",), gpus=2)
    whole = {"gpus": 1, "mem_per_gpu": "whole"}
    old = t.submit("spot-old", tier="spot", resources=whole)
    fresh = t.submit("spot-fresh", tier="spot", resources=whole)
    t.step()
    t.cluster.commit(f"{CKPT}/{old.id}", step=5, incarnation=1, committed_at=t.clock.now())
    t.clock.advance(50)
    t.cluster.commit(f"{CKPT}/{fresh.id}", step=9, incarnation=1, committed_at=t.clock.now())
    t.step()  # checkpoints recorded
    std = t.submit("urgent", resources=whole)
    report = t.step()
    assert [a.job_id for a in report.of("preempt")] == [fresh.id]
    assert (("n1", fresh.id, 1, "TERM")) in t.runner.signals
    t.step()  # the spot job exited on SIGTERM: requeued; the standard job takes its card
    assert t.job(fresh.id).state is JobState.QUEUED
    assert t.inc(fresh.id, 1).end_reason is EndReason.PREEMPTED
    assert t.job(std.id).state is JobState.RUNNING
    assert t.job(old.id).state is JobState.RUNNING
    t.step()
    assert t.job(fresh.id).state is JobState.QUEUED  # no room, and spot never preempts spot
    assert store.check() == [] and check_invariants(store) == []


def test_a_spot_job_that_ignores_sigterm_is_killed_after_its_grace(store: Store) -> None:
    t = make(store, ("n1",), gpus=1)
    t.runner.on_term = "ignore"
    spot = t.submit("spot", tier="spot", resources={"gpus": 1, "mem_per_gpu": "whole"}, grace_s=20)
    t.step()
    t.submit("std", resources={"gpus": 1, "mem_per_gpu": "whole"})
    t.step(1)
    assert t.inc(spot.id).state is IncarnationState.STOPPING
    waiting = t.step(10)
    assert waiting.of("stopping") and not waiting.of("preempt")
    t.step(15)
    assert t.inc(spot.id).state is IncarnationState.KILLED
    assert t.job(spot.id).state is JobState.QUEUED
    assert ("n1", spot.id, 1, "KILL") in t.runner.signals


def test_a_job_over_its_slice_raises_one_event_and_by_policy_is_stopped(store: Store) -> None:
    t = make(store)
    watched = t.submit("watched")
    strict = t.submit("strict", slice_enforcement="stop")
    t.step()
    t.cluster.use(watched.id, 1, 25 * GIB)
    t.cluster.use(strict.id, 1, 30 * GIB)
    report = t.step()
    over = {a.job_id: a for a in report.of("over_slice")}
    assert set(over) == {watched.id, strict.id}
    assert "over its slice of 20480 MiB by 5120 MiB" in over[watched.id].message
    assert over[watched.id].outcome == "observe" and over[strict.id].outcome == "stop"
    assert t.inc(strict.id).state is IncarnationState.STOPPING
    t.step()
    assert t.job(strict.id).state is JobState.HELD
    assert t.job(watched.id).state is JobState.RUNNING
    assert t.step().of("over_slice") == ()  # once per incarnation


def test_ghost_memory_is_reported_and_not_offered_to_placement(store: Store) -> None:
    t = make(store, ("n1",), gpus=1)
    t.cluster.node("n1").ghosts.append(GpuProcess(4242, "GPU-n1-0", 70 * GIB))
    job = t.submit("train")
    report = t.step()
    assert report.nodes[0].ghost_mib == 70 * GIB and report.nodes[0].ghost_pids == (4242,)
    assert t.job(job.id).state is JobState.QUEUED
    assert t.runner.launches == []


def test_a_crash_between_intent_and_launch_is_reobserved_and_never_launched_twice(
    store: Store,
) -> None:
    t = make(store)
    job = t.submit("train")
    t.runner.crash_after_launch = RuntimeError("gpuctl killed here")
    with pytest.raises(RuntimeError):
        t.step()
    assert t.inc(job.id).state is IncarnationState.LAUNCHING
    t.step()
    assert t.inc(job.id).state is IncarnationState.RUNNING and t.inc(job.id).n == 1
    assert len(t.runner.launches) == 1
    assert store.check() == [] and check_invariants(store) == []


def test_an_intent_whose_launch_never_reached_the_node_is_requeued_after_the_settle_time(
    store: Store,
) -> None:
    t = make(store)
    job = t.submit("train")
    t.runner.launch_error = LaunchFailed("outcome unknown", unknown=True)
    t.step()
    assert t.inc(job.id).state is IncarnationState.LAUNCHING
    t.step(5)  # within the settle time: waits
    assert t.inc(job.id).state is IncarnationState.LAUNCHING and len(t.live(job.id)) == 1
    t.step(30)
    assert t.inc(job.id, 1).end_reason is EndReason.LAUNCH_FAILED
    assert t.inc(job.id).n == 2 and t.inc(job.id).state is IncarnationState.RUNNING


def test_a_refused_launch_releases_the_cards_and_requeues(store: Store) -> None:
    t = make(store)
    job = t.submit("train")
    t.runner.launch_error = LaunchFailed("cannot create the run dir")
    report = t.step()
    assert report.of("launch_failed")
    assert t.inc(job.id, 1).state is IncarnationState.EXITED
    assert t.job(job.id).state is JobState.QUEUED
    t.step()
    assert t.inc(job.id).n == 2 and t.inc(job.id).state is IncarnationState.RUNNING


def test_two_reconcilers_on_one_store_never_double_book_a_card(store: Store) -> None:
    t = make(store, ("n1",), gpus=2)
    other = Reconciler(store, t.fleet, t.runner, t.cluster.inventory(), t.clock, t.loop.settings)
    whole = {"gpus": 1, "mem_per_gpu": "whole"}
    jobs = [t.submit(f"j{i}", resources=whole) for i in range(4)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(loop: Reconciler) -> None:
        barrier.wait()
        try:
            loop.run_once()
        except StoreConflict as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(x,)) for x in (t.loop, other)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    other.run_once()
    t.loop.run_once()
    held = [i for j in jobs for i in t.live(j.id)]
    assert len(held) == 2
    assert len({(i.node, i.cards) for i in held}) == 2
    assert len(t.runner.launches) == 2
    assert all("another control loop" in str(e) for e in errors)
    assert store.check() == [] and check_invariants(store) == []


def test_a_second_loop_is_told_another_one_runs(store: Store) -> None:
    t = make(store)
    with store.loop_lock(), pytest.raises(StoreConflict):
        t.loop.run_once()


def test_cancel_stops_a_running_job_gracefully(store: Store) -> None:
    t = make(store)
    job = t.submit("train")
    t.step()
    store.update_job(job.id, cancel_requested=True)
    report = t.step()
    assert report.of("stop") and t.inc(job.id).state is IncarnationState.STOPPING
    t.step()  # it checkpointed and exited on SIGTERM
    assert t.job(job.id).state is JobState.CANCELLED
    assert t.inc(job.id).end_reason is EndReason.CANCELLED
    assert (t.inc(job.id).node, job.id, 1, "TERM") in t.runner.signals


def test_a_cordoned_node_takes_no_new_work(store: Store) -> None:
    t = make(store, ("n1", "n2"))
    ev = Event(t.clock.now(), "op", "cordon", "maintenance", node="n1")
    store.cordon(Cordon("n1", "maintenance", "op", "operator", t.clock.now()), ev)
    jobs = [t.submit(f"j{i}") for i in range(3)]
    t.step()
    assert {t.inc(j.id).node for j in jobs} == {"n2"}


def test_pull_checkpoints_are_copied_and_shipped_to_the_new_node(
    store: Store, tmp_path: Path
) -> None:
    t = make(store, grace_s=30, state_dir=str(tmp_path / "gpuctl"))
    t.cluster.nodes["n1"].clock_offset_s = 900.0  # and the copies keep their times right
    job = t.submit("train", checkpoint={"sync": "pull"})
    t.step()
    first = t.inc(job.id)
    folder = f"~/.gpuctl/checkpoints/{job.id}"
    t.clock.advance(5)
    node_clock = t.clock.now() + t.cluster.nodes[first.node].clock_offset_s
    t.cluster.commit(folder, step=40, incarnation=1, committed_at=node_clock, node=first.node)
    report = t.step()
    assert report.of("checkpoint")
    local = tmp_path / "gpuctl" / "checkpoints" / job.id / "step-00000040"
    assert (local / "COMMITTED").is_file()
    assert [c.location for c in store.checkpoints(job.id)] == ["store"]
    t.cluster.kill_node(first.node)
    t.step(5)
    t.step(31)
    second = t.inc(job.id)
    assert second.n == 2 and second.resume_step == 40
    assert t.cluster.pushed == [(second.node, str(local), f"{folder}/step-00000040")]
    assert t.runner.launches[-1][1].resume_from == f"{folder}/step-00000040"


def test_a_dry_run_changes_nothing(store: Store) -> None:
    t = make(store)
    job = t.submit("train")
    dry = Reconciler(
        store,
        t.fleet,
        t.runner,
        t.cluster.inventory(),
        t.clock,
        dataclasses.replace(t.loop.settings, dry_run=True),
    )
    before = len(store.events())
    report = dry.run_once()
    assert report.dry_run and [a.outcome for a in report.of("launch")] == ["would"]
    assert t.job(job.id).state is JobState.QUEUED
    assert t.runner.launches == [] and len(store.events()) == before
    assert store.liveness() == {}


def test_watch_runs_passes_until_stopped(store: Store) -> None:
    t = make(store)
    t.submit("train")
    stop = threading.Event()
    seen: list[PassReport | None] = []

    def on_report(report: PassReport | None) -> None:
        seen.append(report)
        if len(seen) == 3:
            stop.set()

    assert t.loop.watch(0.0, stop, on_report) == 3
    assert len(t.runner.launches) == 1 and all(r is not None for r in seen)


def test_a_missing_secret_holds_the_job_without_its_value_anywhere(store: Store) -> None:
    t = make(store)
    job = t.submit("train", secret_env=["API_TOKEN"])
    t.step()
    held = t.job(job.id)
    assert held.state is JobState.HELD
    assert held.reason is not None and "API_TOKEN" in held.reason
    t.loop.environ = {"API_TOKEN": "s3cr3t-value"}
    store.update_job(job.id, expect=JobState.HELD, state=JobState.QUEUED)
    t.step()
    request = t.runner.launches[0][1]
    assert request.secret_env == {"API_TOKEN": "s3cr3t-value"}
    assert "s3cr3t-value" not in repr(request)
    assert all("s3cr3t-value" not in f"{e.message}{e.data}" for e in store.events())


def test_a_forced_cancel_kills_at_once(store: Store) -> None:
    t = make(store)
    t.runner.on_term = "ignore"
    job = t.submit("train")
    t.step()
    jobs_service.cancel(store, job.id, actor="op", clock=t.clock, force=True)
    report = t.step()
    assert report.of("kill") and t.job(job.id).state is JobState.CANCELLED
    assert [s[3] for s in t.runner.signals] == ["KILL"]
    assert t.live(job.id) == []


def test_a_checkpoint_committed_since_the_last_scan_is_resumed_from_and_recorded(
    store: Store,
) -> None:
    t = make(store, grace_s=30)
    job = t.submit("train")
    t.step()
    first = t.inc(job.id)
    t.clock.advance(3)
    t.cluster.commit(f"{CKPT}/{job.id}", step=7, incarnation=1, committed_at=t.clock.now())
    t.cluster.kill_node(first.node)  # before any pass read the checkpoint
    t.step(5)
    t.step(31)
    assert t.inc(job.id).resume_step == 7
    assert [c.step for c in store.checkpoints(job.id)] == [7]
    assert check_invariants(store) == []


class Crashing:
    """A store that dies (raises) at its `at`-th write, as if gpuctl were SIGKILLed there."""

    WRITES = frozenset(
        {"update_job", "begin_launch", "update_incarnation", "add_checkpoint", "append_event",
         "set_liveness", "reserve", "update_reservation", "release_reservation", "cordon",
         "uncordon", "set_node_health"}
    )  # fmt: skip

    def __init__(self, inner: Store, at: int) -> None:
        self.inner, self.at, self.writes = inner, at, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.WRITES:
            return attr

        def write(*args: Any, **kwargs: Any) -> Any:
            self.writes += 1
            if self.writes == self.at:
                raise SystemExit(f"killed at write {self.at}")
            return attr(*args, **kwargs)

        return write


@pytest.mark.parametrize("at", range(1, 40, 3))
def test_gpuctl_killed_at_any_write_loses_no_job_and_launches_nothing_twice(
    store: Store, at: int
) -> None:
    crashing = Crashing(store, at)
    t = make(crashing, ("n1", "n2", "n3"), grace_s=30)
    jobs = [t.submit(name) for name in ("a", "b")]

    def checkpoint() -> None:
        t.cluster.commit(f"{CKPT}/{jobs[0].id}", step=3, incarnation=1, committed_at=t.clock.now())

    def kill() -> None:
        t.cluster.kill_node(t.cluster.where(jobs[0].id, 1))

    def finish() -> None:
        for run in t.cluster.runs(alive=True):
            t.cluster.finish(*run.key, 0)

    def nothing() -> None:
        pass

    for action in (nothing, checkpoint, kill, nothing, nothing, finish, *[nothing] * 4):
        action()
        try:
            t.step(31)
        except SystemExit:
            continue
    assert check_invariants(store) == []
    assert {t.job(j.id).state for j in jobs} == {JobState.SUCCEEDED}
    launched = [(r.job_id, r.incarnation) for _, r in t.runner.launches]
    assert len(launched) == len(set(launched))


# --- health: automatic cordons and drains --------------------------------------------------


def kit(store: Store, nodes: tuple[str, ...] = ("n1", "n2", "n3"), **policy: Any) -> Kit:
    return Kit.make(store, nodes, health=AutoDrainPolicy(**policy))


def test_uncorrectable_ecc_cordons_at_once_and_drains_after_the_hysteresis(store: Store) -> None:
    k = kit(store, drain_after_passes=3)
    job = k.submit("train")
    k.step()
    node = k.inc(job.id).node
    k.fleet.faults[node] = {"ecc": 1}
    first = k.step()
    (cordon,) = store.cordons()
    assert (cordon.node, cordon.operator, cordon.source) == (node, "gpuctl", "health")
    assert "uncorrectable ECC" in cordon.reason
    assert [a.message for a in first.of("drain")] == [
        f"{node}: not drained yet: drain asked at 1 of 3 consecutive passes (hysteresis)"
    ]
    k.step()
    assert k.signals(job.id) == [] and store.reservations() == []
    k.step()  # the third pass in a row: drained
    assert k.signals(job.id) == ["USR1"]
    for _ in range(3):
        k.step()
    moved = k.inc(job.id)
    assert (moved.n, moved.state) == (2, IncarnationState.RUNNING) and moved.node != node
    assert moved.resume_step == 20  # the checkpoint written on SIGTERM, after the one asked for
    drain = store.events(kinds=["drain"])[-1]
    assert drain.data["source"] == "health" and "ECC" in str(drain.data["reason"])
    assert "migrated" in k.kinds(job.id) and check_invariants(store) == []


def test_a_fault_that_clears_before_the_hysteresis_moves_nothing(store: Store) -> None:
    k = kit(store, drain_after_passes=2)
    job = k.submit("train")
    k.step()
    node = k.inc(job.id).node
    k.fleet.faults[node] = {"xid": 79}
    k.step()
    del k.fleet.faults[node]
    k.step()
    k.fleet.faults[node] = {"xid": 79}
    k.step()  # one pass again, not two in a row
    assert k.signals(job.id) == [] and k.inc(job.id).n == 1
    assert [c.source for c in store.cordons()] == ["health"]


def test_unreadable_gpus_cordon_and_leave_running_jobs_alone(store: Store) -> None:
    k = kit(store, drain_after_passes=1)
    job = k.submit("train")
    k.step()
    node = k.inc(job.id).node
    k.fleet.faults[node] = {"garbage": True}
    for _ in range(4):
        report = k.step()
    assert [(c.node, c.source) for c in store.cordons()] == [(node, "health")]
    assert "running jobs are left alone" in store.events(kinds=["cordon"])[-1].message
    assert k.signals(job.id) == [] and k.inc(job.id).n == 1
    assert store.events(kinds=["drain"]) == []
    assert {n.name: n.health for n in report.nodes}[node] == "unknown"


def test_at_most_the_rate_limit_of_nodes_is_drained_per_hour(store: Store) -> None:
    k = Kit.make(
        store,
        ("n1", "n2", "n3", "n4", "n5"),
        gpus=1,
        health=AutoDrainPolicy(drain_after_passes=1, max_drains_per_hour=1),
    )
    jobs = [k.submit(f"j{i}", resources={"gpus": 1, "mem_per_gpu": "whole"}) for i in range(2)]
    k.step()
    sick = sorted(k.inc(j.id).node for j in jobs)
    assert len(set(sick)) == 2
    for name in sick:
        k.fleet.faults[name] = {"ecc": 1}
    report = k.step()
    assert sorted(c.node for c in store.cordons()) == sick  # both cordoned at once
    (first,) = [e.node for e in store.events(kinds=["drain"])]
    held = [a for a in report.of("drain") if a.outcome == "waiting"]
    assert [a.node for a in held] == [n for n in sick if n != first]
    assert "rate limit: at most 1 node(s) drained per hour" in held[0].message
    k.step(1800)
    assert len(store.events(kinds=["drain"])) == 1
    k.step(1801)  # an hour after the first: the next one may start
    assert sorted(e.node for e in store.events(kinds=["drain"])) == sorted(sick)


def test_draining_empty_nodes_does_not_spend_the_rate_limit_of_a_hot_loaded_node(
    store: Store,
) -> None:
    k = Kit.make(store, ("n1", "n2", "n3", "n4", "n5", "n6"), gpus=1)  # at most 2 drains an hour
    job = k.submit("train", resources={"gpus": 1, "mem_per_gpu": "whole"})
    k.step()
    loaded = k.inc(job.id).node
    empty = [n for n in ("n1", "n2", "n3", "n4", "n5", "n6") if n != loaded][:2]
    for name in empty:
        k.fleet.faults[name] = {"ecc": 1}
    k.step()
    k.step()  # the hysteresis passed: both empty nodes drained, nothing to move
    drained = store.events(kinds=["drain"])
    assert sorted(e.node for e in drained) == sorted(empty)
    k.fleet.faults[loaded] = {"temp_c": 95}
    reports = [k.step(30) for _ in range(5)]  # 95 C for two and a half minutes, within the hour
    held = [a.message for r in reports for a in r.of("drain") if a.outcome == "waiting"]
    assert not any("rate limit" in m for m in held)
    (hot,) = [e for e in store.events(kinds=["drain"]) if e.node == loaded]
    assert hot.data["jobs"] == 1 and "sustained" in str(hot.data["reason"])
    assert "USR1" in k.signals(job.id)  # its job is being moved off
    assert all("nothing to move" in e.message for e in drained)


def test_no_drain_while_most_nodes_look_unhealthy_at_once(store: Store) -> None:
    k = kit(store, drain_after_passes=1)
    job = k.submit("train")
    k.step()
    for name in ("n1", "n2"):
        k.fleet.faults[name] = {"ecc": 1}
    k.step()
    k.step()
    assert store.events(kinds=["drain"]) == [] and k.signals(job.id) == []
    (suspect,) = store.events(kinds=["suspect_health"])
    assert "2 of 3 nodes look unhealthy at once" in suspect.message
    assert len(store.cordons()) == 2  # cordons still protect new work
    del k.fleet.faults["n2"]
    k.step()
    assert [e.outcome for e in store.events(kinds=["suspect_health"])] == ["waiting", "ok"]


def test_gpuctl_lifts_its_own_cordon_after_the_cool_down_and_never_a_person_s(
    store: Store,
) -> None:
    k = kit(store, cool_down_s=600)
    k.fleet.faults["n1"] = {"garbage": True}
    k.fleet.faults["n2"] = {"garbage": True}
    k.step()
    assert {c.node for c in store.cordons()} == {"n1", "n2"}
    person = Cordon("n2", "keep it out: RMA pending", "alice", "operator", k.clock.now())
    store.cordon(person, Event(k.clock.now(), "alice", "cordon", "rma", node="n2"))
    k.fleet.faults.clear()
    k.step(300)
    assert {c.node for c in store.cordons()} == {"n1", "n2"}  # within the cool-down
    k.step(301)
    k.step(301)
    assert store.cordons() == [person]
    lifted = store.events(kinds=["uncordon"])
    assert [(e.node, e.actor) for e in lifted] == [("n1", "gpuctl")]
    for _ in range(3):
        k.step(700)
    assert store.cordons() == [person]


def test_a_health_cordon_never_replaces_a_person_s_cordon(store: Store) -> None:
    k = kit(store, cool_down_s=0)
    person = Cordon("n1", "maintenance", "alice", "operator", k.clock.now())
    store.cordon(person, Event(k.clock.now(), "alice", "cordon", "maint", node="n1"))
    k.fleet.faults["n1"] = {"garbage": True}
    k.step()
    del k.fleet.faults["n1"]
    k.step()
    k.step()
    assert store.cordons() == [person]


@pytest.mark.parametrize("at", range(1, 18))  # every write of the drain below
def test_gpuctl_killed_mid_migration_is_resumed_safely_by_the_next_pass(
    store: Store, at: int
) -> None:
    crashing = Crashing(store, 10_000)
    k = Kit.make(crashing, ("n1", "n2", "n3"), health=AutoDrainPolicy(drain_after_passes=1))  # type: ignore[arg-type]
    job = k.submit("train")
    k.step()
    node = k.inc(job.id).node
    k.fleet.faults[node] = {"ecc": 1}
    crashing.writes, crashing.at = 0, at  # die at the at-th write of the drain
    for _ in range(8):
        try:
            k.step()
        except SystemExit:
            continue
    assert check_invariants(store) == []
    assert store.reservations() == []
    current = k.inc(job.id)
    assert current.node != node and current.state is IncarnationState.RUNNING
    assert k.job(job.id).state is JobState.RUNNING
    launched = [(r.job_id, r.incarnation) for _, r in k.runner.launches]
    assert len(launched) == len(set(launched))
    assert len([r for r in k.cluster.runs(job.id) if r.alive]) == 1


def test_a_job_that_fits_nowhere_waits_and_watch_names_it_once_per_change(store: Store) -> None:
    from gpuctl.cli.reconcile_stream import Stream

    t = make(store, ("n1",), gpus=2)
    job = t.submit("huge", resources={"gpus": 4})
    lines: list[str] = []
    stream = Stream(lines.append)
    t.loop.on_action = stream
    for _ in range(3):
        t.step()
        stream.end_pass()
    assert t.job(job.id).state is JobState.QUEUED
    assert lines == [
        f"queued: {job.id}: no node can take 4 × whole cards: 1 node: fewer than 4 usable cards"
    ]
