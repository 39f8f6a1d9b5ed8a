"""Schema v7 on every backend: a job's owner and version, each node's cordon version (a write
planned on an older one is refused, saying who changed what and when), and the fleet snapshot
the control loop publishes. Two handles on one store race as two operators' machines do."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.postgres import open_url
from gpuctl.core.jobs.migration import Phase, Reservation
from gpuctl.core.jobs.model import Cordon, Event, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.model import FleetSnapshot, NodeSnapshot, NodeState, Reach
from gpuctl.core.placement.model import JobRequest
from gpuctl.core.shared import PublishedFleet, encode
from gpuctl.errors import StalePlan
from gpuctl.testing.memstore import MemoryStore
from tests.pg import STORES, open_test_store

AT = 1_000_000.0


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


@pytest.fixture
def other(request: pytest.FixtureRequest, store: Store, tmp_path: Path) -> Iterator[Store]:
    """A second handle on `store`'s data, as another operator's machine opens it."""
    if isinstance(store, MemoryStore):
        yield store.shared()
        return
    url = getattr(store, "_connect_url", None)
    s = open_url(url, write=True) if url else open_store(tmp_path, write=True)
    yield s
    s.close()


def cordon(node: str, who: str, reason: str, at: float = AT) -> tuple[Cordon, Event]:
    return (
        Cordon(node, reason, who, "operator", at),
        Event(at, who, "cordon", f"{node} cordoned by {who}: {reason}", node=node),
    )


def job(job_id: str, owner: str = "alice") -> Job:
    return Job(
        job_id, "train", JobSpec(JobRequest("train")), JobState.QUEUED, 0, "standard", AT,
        owner=owner,
    )  # fmt: skip


def test_a_job_keeps_its_owner_and_its_version_grows_with_each_change(store: Store) -> None:
    store.add_job(job("j1", owner="carol"), Event(AT, "carol", "submit", "submitted j1", "j1"))
    first = store.job("j1")
    assert first is not None and (first.owner, first.version) == ("carol", 0)
    store.update_job("j1", expect=JobState.QUEUED, reason="waiting for room")
    store.update_job("j1", state=JobState.HELD)
    again = store.job("j1")
    assert again is not None and (again.owner, again.version) == ("carol", 2)
    assert [j.owner for j in store.jobs()] == ["carol"]


def test_each_cordon_and_uncordon_adds_one_to_the_node_version_and_says_who(
    store: Store,
) -> None:
    assert store.node_versions() == {}
    store.cordon(*cordon("lab-02", "alice", "fan"))
    store.uncordon("lab-02", Event(AT + 60, "bob", "uncordon", "lab-02 uncordoned", node="lab-02"))
    seen = store.node_versions()["lab-02"]
    assert (seen.version, seen.actor, seen.kind, seen.reason) == (2, "bob", "uncordon", "fan")


def test_two_operators_cordoning_one_node_at_once_one_wins_the_other_is_told_who(
    store: Store, other: Store
) -> None:
    planned = store.node_versions().get("lab-02")
    seen = 0 if planned is None else planned.version  # both plan on what they read: version 0
    outcomes: dict[str, str] = {}
    start = threading.Barrier(2)

    def apply(handle: Store, who: str) -> None:
        start.wait()
        try:
            handle.cordon(*cordon("lab-02", who, f"{who}'s reason"), expect_version=seen)
            outcomes[who] = "won"
        except StalePlan as exc:
            outcomes[who] = exc.message

    racers = [
        threading.Thread(target=apply, args=(store, "alice")),
        threading.Thread(target=apply, args=(other, "bob")),
    ]
    for t in racers:
        t.start()
    for t in racers:
        t.join(timeout=60)
    winner = next(who for who, said in outcomes.items() if said == "won")
    loser = "bob" if winner == "alice" else "alice"
    assert outcomes[loser].startswith(f"lab-02 was cordoned by {winner} at ")
    assert outcomes[loser].endswith(f"(reason: {winner}'s reason) since your plan; nothing changed")
    assert [(c.node, c.operator) for c in store.cordons()] == [("lab-02", winner)]
    assert store.node_versions()["lab-02"].version == 1
    assert [e.actor for e in store.events(kinds=["cordon"])] == [winner]  # the loser wrote nothing


def test_an_uncordon_planned_before_a_new_cordon_lifts_nothing(store: Store, other: Store) -> None:
    store.cordon(*cordon("lab-02", "alice", "fan"))
    seen = store.node_versions()["lab-02"].version  # bob plans to lift alice's cordon ...
    other.cordon(*cordon("lab-02", "carol", "ECC errors", AT + 30))  # ... carol replaces it
    lift = Event(AT + 60, "bob", "uncordon", "lab-02 uncordoned", node="lab-02")
    with pytest.raises(StalePlan, match=r"lab-02 was cordoned by carol at .*ECC errors"):
        store.uncordon("lab-02", lift, expect_version=seen)
    assert [(c.operator, c.reason) for c in store.cordons()] == [("carol", "ECC errors")]


def _running(store: Store, job_id: str) -> None:
    store.add_job(job(job_id), Event(AT, "alice", "submit", f"submitted {job_id}", job_id))
    inc = Incarnation(
        job_id, 1, "n1", (0,), ("GPU-0",), 20_000, False, IncarnationState.LAUNCHING, AT, "/r"
    )
    store.begin_launch(
        inc, capacity_mib={("n1", 0): 40_000}, event=Event(AT, "gpuctl", "launch", "go", job_id)
    )
    store.update_incarnation(job_id, 1, state=IncarnationState.RUNNING, pid=42)


def test_a_move_planned_on_an_older_job_version_is_refused_naming_the_change(
    store: Store,
) -> None:
    _running(store, "j1")
    seen = store.job("j1")
    assert seen is not None and seen.version == 1  # submitted (0), launched (1)
    store.update_job(
        "j1", cancel_requested=True, event=Event(AT + 5, "carol", "cancel", "cancelled", "j1")
    )
    res = Reservation(
        job_id="j1", from_incarnation=1, source_node="n1", node="n1", cards=(1,),
        capacity_mib=(40_000,), gpu_uuids=("GPU-1",), mib_per_card=20_000, whole=False,
        created_at=AT + 10, deadline_at=AT + 600, grace_s=30.0, checkpoint_wait_s=30.0,
        reason="consolidation", actor="alice", source="consolidate", phase=Phase.RESERVED,
    )  # fmt: skip
    reserve = Event(AT + 10, "alice", "reserve", "moving j1", "j1")
    with pytest.raises(StalePlan, match=r"job j1 was changed by carol at .* \(cancel: cancelled\)"):
        store.reserve(res, event=reserve, expect_job_version=seen.version)
    assert store.reservations() == []


def _fleet(n: int, at: float) -> FleetSnapshot:
    nodes = tuple(NodeSnapshot(f"n{i}", Reach.OK, NodeState.READY, taken_at=at) for i in range(n))
    return FleetSnapshot(at, nodes)


def test_the_newest_few_published_snapshots_are_kept_and_read_back(store: Store) -> None:
    assert store.latest_snapshot() is None
    made: Callable[[float], PublishedFleet] = lambda at: PublishedFleet(  # noqa: E731
        at, at + 0.5, "gpuctl", 10.0, 3, encode(_fleet(3, at))
    )
    ids = [store.publish_snapshot(made(AT + 10 * i), keep=2) for i in range(4)]
    latest = store.latest_snapshot()
    assert latest is not None and latest.id == ids[-1]
    assert dataclasses.replace(latest, id=None) == made(AT + 30)
    assert latest.snapshot() == _fleet(3, AT + 30)
