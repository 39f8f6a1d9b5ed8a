"""Reservations (a migration's target cards, held before its source stops), cordons that refuse
grants in the same transaction, compare-and-set cordon changes, node health, and the v1 -> v2
schema migration that added them. The SQLite store and the in-memory one alike."""

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.opening import open_connection
from gpuctl.adapters.store.schema import MIGRATIONS
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.core.health.autodrain import NodeHealth
from gpuctl.core.health.model import Action
from gpuctl.core.jobs.migration import Phase, Reservation
from gpuctl.core.jobs.model import Cordon, Event, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import StoreConflict
from gpuctl.ops.invariants import check_invariants
from tests.pg import STORES, open_test_store

CAP = {("n1", 0): 40_000, ("n1", 1): 40_000, ("n2", 0): 40_000, ("n2", 1): 40_000}


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


def ev(kind: str, at: float = 100.0) -> Event:
    return Event(at, "alice", kind, f"{kind} happened")


def inc(job_id: str, n: int = 1, node: str = "n1", card: int = 0, mib: int = 20_000) -> Incarnation:
    return Incarnation(
        job_id,
        n,
        node,
        (card,),
        (f"GPU-{card}",),
        mib,
        False,
        IncarnationState.LAUNCHING,
        50.0,
        "/r",
    )


def running(store: Store, job_id: str, node: str = "n1", card: int = 0, mib: int = 20_000) -> None:
    job = Job(
        job_id,
        job_id.split("-")[0],
        JobSpec(JobRequest(job_id.split("-")[0])),
        JobState.QUEUED,
        0,
        "standard",
        1.0,
    )
    store.add_job(job, ev("submit"))
    store.begin_launch(inc(job_id, 1, node, card, mib), capacity_mib=CAP, event=ev("launch"))
    store.update_incarnation(job_id, 1, state=IncarnationState.RUNNING, pid=7)


def res(job_id: str = "a-1", node: str = "n2", card: int = 0, mib: int = 20_000) -> Reservation:
    return Reservation(
        job_id, 1, "n1", node, (card,), mib, False, (40_000,), 60.0, 660.0, 30.0, 30.0, "r", "op"
    )


def test_reserved_cards_are_held_against_other_launches_and_reservations(store: Store) -> None:
    running(store, "a-1")
    running(store, "b-1", card=1)
    store.reserve(res("a-1", mib=30_000), event=ev("reserve"))
    queued = Job("c-1", "c", JobSpec(JobRequest("c")), JobState.QUEUED, 0, "standard", 1.0)
    store.add_job(queued, ev("submit"))
    with pytest.raises(StoreConflict):
        store.begin_launch(inc("c-1", 1, "n2", 0, 20_000), capacity_mib=CAP, event=ev("launch"))
    with pytest.raises(StoreConflict):
        store.reserve(res("b-1", mib=20_000), event=ev("reserve"))
    store.reserve(res("b-1", card=1, mib=20_000), event=ev("reserve"))
    assert [r.job_id for r in store.reservations()] == ["a-1", "b-1"]
    assert [r.job_id for r in store.reservations("n2")] == ["a-1", "b-1"]
    assert check_invariants(store, capacity_mib=CAP) == []


def test_a_job_reserves_once_and_only_while_it_runs_the_incarnation_it_moves(store: Store) -> None:
    running(store, "a-1")
    with pytest.raises(StoreConflict, match="not running incarnation 2"):
        store.reserve(dataclasses.replace(res("a-1"), from_incarnation=2), event=ev("reserve"))
    store.reserve(res("a-1"), event=ev("reserve"))
    with pytest.raises(StoreConflict):
        store.reserve(res("a-1", card=1), event=ev("reserve"))


def test_the_next_incarnation_takes_exactly_the_reserved_cards_and_consumes_them(
    store: Store,
) -> None:
    running(store, "a-1")
    store.reserve(res("a-1"), event=ev("reserve"))
    store.update_incarnation("a-1", 1, state=IncarnationState.EXITED)
    store.update_job("a-1", state=JobState.QUEUED)
    with pytest.raises(StoreConflict):  # elsewhere than its reservation
        store.begin_launch(inc("a-1", 2, "n1", 1), capacity_mib=CAP, event=ev("launch"))
    store.begin_launch(inc("a-1", 2, "n2", 0), capacity_mib={}, event=ev("launch"))
    assert store.reservations() == []
    assert store.incarnations("a-1", holding=True)[0].node == "n2"


def test_a_reservation_changes_phase_by_compare_and_set_and_is_released(store: Store) -> None:
    running(store, "a-1")
    store.reserve(res("a-1"), event=ev("reserve"))
    moved = store.update_reservation(
        "a-1", expect=Phase.RESERVED, phase=Phase.CHECKPOINTING, checkpoint_requested_at=70.0
    )
    assert (moved.phase, moved.checkpoint_requested_at) == (Phase.CHECKPOINTING, 70.0)
    with pytest.raises(StoreConflict):
        store.update_reservation("a-1", expect=Phase.RESERVED, phase=Phase.STOPPING)
    with pytest.raises(ValueError, match="node"):
        store.update_reservation("a-1", node="n1")
    gone = store.release_reservation("a-1", event=ev("migrate_rollback"))
    assert gone is not None and gone.phase is Phase.CHECKPOINTING
    assert store.release_reservation("a-1", event=ev("migrate_rollback")) is None
    assert [e.kind for e in store.events()].count("migrate_rollback") == 1


def test_a_cordoned_node_is_granted_nothing_new(store: Store) -> None:
    running(store, "a-1")
    store.cordon(Cordon("n2", "bad fan", "alice", "operator", 90.0), ev("cordon"))
    with pytest.raises(StoreConflict, match="cordoned"):
        store.reserve(res("a-1"), event=ev("reserve"))
    store.add_job(
        Job("c-1", "c", JobSpec(JobRequest("c")), JobState.QUEUED, 0, "standard", 1.0), ev("submit")
    )
    with pytest.raises(StoreConflict, match="cordoned"):
        store.begin_launch(inc("c-1", 1, "n2", 0), capacity_mib=CAP, event=ev("launch"))
    assert store.incarnations("c-1") == []


def test_a_health_cordon_never_replaces_a_person_s_and_gpuctl_lifts_only_its_own(
    store: Store,
) -> None:
    person = Cordon("n1", "maintenance", "alice", "operator", 1.0)
    assert store.cordon(person, ev("cordon"))
    health = Cordon("n1", "ECC", "gpuctl", "health", 2.0)
    assert not store.cordon(health, ev("cordon"), keep_existing=True)
    assert store.cordons() == [person]
    with pytest.raises(StoreConflict):
        store.uncordon("n1", ev("uncordon"), expect_source="health")
    assert store.cordons() == [person]
    assert store.cordon(Cordon("n2", "ECC", "gpuctl", "health", 3.0), ev("c"), keep_existing=True)
    lifted = store.uncordon("n2", ev("uncordon"), expect_source="health")
    assert lifted is not None and lifted.source == "health"


def test_node_health_is_kept_per_node(store: Store) -> None:
    h = NodeHealth("n1", Action.DRAIN, 2, 10.0, None, "2 ECC errors", 20.0, 30.0)
    store.set_node_health(h)
    store.set_node_health(NodeHealth("n2", Action.NONE, 1, 10.0, 10.0, updated_at=10.0))
    assert store.node_health()["n1"] == h
    assert sorted(store.node_health()) == ["n1", "n2"]


def test_a_v1_store_is_migrated_forward_keeping_its_rows_and_is_read_as_v1_before(
    tmp_path: Path,
) -> None:
    d = tmp_path / "state"
    with SqliteStore(open_connection(d, write=True, migrations=MIGRATIONS[:1])) as v1:
        v1.add_job(
            Job("a-1", "a", JobSpec(JobRequest("a")), JobState.QUEUED, 0, "standard", 1.0),
            ev("submit"),
        )
    with open_store(d, write=False) as ro:  # a read never migrates, and reads as empty
        assert (ro.schema_version, ro.reservations(), ro.node_health()) == (1, [], {})
        assert "reservations" not in ro.counts()
    with open_store(d, write=True) as rw:
        assert rw.schema_version == len(MIGRATIONS) and [j.id for j in rw.jobs()] == ["a-1"]
        assert rw.check() == [] and rw.counts()["reservations"] == 0
    assert (d / "state.db.v1.bak").is_file()
    conn = sqlite3.connect(d / "state.db")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert {"reservations", "node_health"} <= tables
