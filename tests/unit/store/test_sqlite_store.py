"""The SQLite state store: every method, compare-and-set, card booking, the loop lock, modes."""

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.store import SCHEMA_VERSION, codec, open_store
from gpuctl.adapters.store.postgres import open_url
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.core.jobs.model import (
    Checkpoint,
    Cordon,
    EndReason,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    NodeLiveness,
)
from gpuctl.core.jobs.spec import (
    CheckpointPolicy,
    CheckpointSync,
    JobPolicy,
    JobSpec,
    SecretRef,
    SliceEnforcement,
)
from gpuctl.core.placement.model import JobRequest, JobShape, LabelRequirement, Tier
from gpuctl.core.units import MemPerCard
from gpuctl.errors import ExitCode, GpuctlError, StateError, StoreConflict

CAP = {("n1", 0): 40_000, ("n1", 1): 40_000, ("n2", 0): 80_000}
SPEC = JobSpec(  # every field away from its default
    request=JobRequest(
        "train",
        shape=JobShape(2, MemPerCard(whole=True), ("H100",), cpu_milli=500, host_mem_mib=1536),
        tier=Tier.SPOT,
        priority=-7,
        labels={"team": "nlp"},
        node_affinity=(LabelRequirement("zone", ("eu-1", "eu-2")),),
        node_anti_affinity=(LabelRequirement("maintenance"),),
        group="llama",
        avoid_jobs=("eval",),
        avoid_groups=("serving",),
    ),
    policy=JobPolicy(
        grace_s=45.5,
        restart_budget=0,
        checkpoint=CheckpointPolicy("/shared/ckpt/{job_id}", CheckpointSync.SHARED),
        slice_enforcement=SliceEnforcement.STOP,
        disruptible=False,
        min_runtime_between_moves_s=0.0,
    ),
    command=("python", "train.py"),
    workdir="/shared/work",
    env={"EPOCHS": "3"},
    secrets=(SecretRef("HF_TOKEN"), SecretRef("WANDB_API_KEY", "/home/al/.wandb")),
)


def ev(kind: str, at: float = 100.0, job_id: str | None = None) -> Event:
    return Event(at=at, actor="alice", kind=kind, message=f"{kind} happened", job_id=job_id)


def job(job_id: str = "train-a1b2c3", name: str = "train", at: float = 10.0, **kw: object) -> Job:
    fields: dict[str, object] = {
        "spec": SPEC,
        "state": JobState.QUEUED,
        "priority": 0,
        "tier": "standard",
    }
    fields.update(kw)
    return Job(id=job_id, name=name, submitted_at=at, **fields)  # type: ignore[arg-type]


def inc(
    job_id: str = "train-a1b2c3",
    n: int = 1,
    node: str = "n1",
    cards: tuple[int, ...] = (0,),
    mib: int = 20_000,
    whole: bool = False,
    at: float = 50.0,
) -> Incarnation:
    return Incarnation(
        job_id=job_id,
        n=n,
        node=node,
        cards=cards,
        gpu_uuids=tuple(f"GPU-{c}" for c in cards),
        mib_per_card=mib,
        whole=whole,
        state=IncarnationState.LAUNCHING,
        started_at=at,
        run_dir=f"/runs/{job_id}/{n}",
    )


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


# tests that reach into SQLite's file or rows (sqlite3); test_postgres_store.py has their
# PostgreSQL side
SQLITE_ONLY = pytest.mark.parametrize("store", ["sqlite"], indirect=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, state_dir: Path) -> Iterator[SqliteStore]:
    """The SQLite store, and the PostgreSQL one (`PostgresStore` runs `SqliteStore`'s SQL)."""
    if request.param == "postgresql":
        with open_url(request.getfixturevalue("pg_url"), write=True) as pg:
            yield pg
        return
    with open_store(state_dir, write=True) as s:
        yield s


def submitted(store: SqliteStore, job_id: str = "train-a1b2c3", **kw: object) -> Job:
    j = job(job_id, **kw)
    store.add_job(j, ev("submit", job_id=job_id))
    return j


# --- opening: modes, WAL ----------------------------------------------------------------------


def test_a_new_store_is_a_0700_folder_with_0600_files_in_wal_mode(state_dir: Path) -> None:
    with open_store(state_dir, write=True) as s:
        submitted(s)
        assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
        for name in ("state.db", "state.db-wal", "state.db-shm", "store.id"):
            assert stat.S_IMODE((state_dir / name).stat().st_mode) == 0o600, name
        other = sqlite3.connect(s.path)
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        other.close()
        assert s.schema_version == SCHEMA_VERSION
        assert s.database_id and s.database_id in (state_dir / "store.id").read_text()


def test_a_state_folder_open_to_others_is_tightened_to_0700(state_dir: Path) -> None:
    state_dir.mkdir(mode=0o755)
    state_dir.chmod(0o755)
    open_store(state_dir, write=True).close()
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700


def test_a_state_folder_of_another_user_is_refused(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state_dir.mkdir()
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 4242)
    with pytest.raises(StateError, match="belongs to uid"):
        open_store(state_dir, write=True)
    assert list(state_dir.iterdir()) == []


def test_reading_a_store_that_does_not_exist_yet_shows_it_empty_and_creates_nothing(
    state_dir: Path,
) -> None:
    with open_store(state_dir, write=False) as s:
        assert s.ephemeral
        assert (s.jobs(), s.events(), s.cordons(), s.check()) == ([], [], [], [])
        with pytest.raises(StateError, match="read-only"):
            submitted(s)
    assert not state_dir.exists()


@SQLITE_ONLY
def test_a_store_opened_read_only_refuses_every_write(store: SqliteStore, state_dir: Path) -> None:
    submitted(store)
    with open_store(state_dir, write=False) as ro:
        assert [j.id for j in ro.jobs()] == ["train-a1b2c3"]
        with pytest.raises(StateError, match="read-only"):
            ro.update_job("train-a1b2c3", state=JobState.HELD)
        with pytest.raises(StateError, match="read-only"):
            ro.append_event(ev("note"))
        with pytest.raises(StateError, match="read-only"):
            ro.loop_lock()
    assert store.job("train-a1b2c3").state is JobState.QUEUED  # type: ignore[union-attr]


# --- jobs ---------------------------------------------------------------------------------------


def test_a_job_round_trips_with_its_spec_and_its_submit_event(store: SqliteStore) -> None:
    j = submitted(store)
    assert store.job("train-a1b2c3") == j
    [event] = store.events()
    assert (event.kind, event.job_id, event.actor, event.id) == ("submit", j.id, "alice", 1)


def test_a_name_finds_the_newest_job_of_that_name(store: SqliteStore) -> None:
    submitted(store, "train-000001", at=1.0)
    submitted(store, "train-000002", at=2.0)
    submitted(store, "eval-000003", name="eval", at=3.0)
    assert store.job("train").id == "train-000002"  # type: ignore[union-attr]
    assert store.job("nope") is None


def test_jobs_are_listed_oldest_first_and_filtered_by_state(store: SqliteStore) -> None:
    submitted(store, "b-000002", at=2.0)
    submitted(store, "a-000001", at=1.0, state=JobState.HELD)
    assert [j.id for j in store.jobs()] == ["a-000001", "b-000002"]
    assert [j.id for j in store.jobs([JobState.QUEUED])] == ["b-000002"]
    assert store.jobs([]) == []


def test_a_job_id_is_never_reused(store: SqliteStore) -> None:
    submitted(store)
    with pytest.raises(StoreConflict, match="already exists"):
        submitted(store)
    assert len(store.events()) == 1  # the refused submit left no event


@SQLITE_ONLY
def test_a_stored_spec_keeps_secret_names_and_files_and_no_value(store: SqliteStore) -> None:
    submitted(store)
    (text,) = sqlite3.connect(store.path).execute("SELECT spec FROM jobs").fetchone()
    assert json.loads(text)["secrets"] == [
        {"name": "HF_TOKEN", "file": None},
        {"name": "WANDB_API_KEY", "file": "/home/al/.wandb"},
    ]


@SQLITE_ONLY
@pytest.mark.parametrize(
    ("secrets", "where"),
    [
        (
            [{"name": "HF_TOKEN", "file": None, "value": "hf_live_value"}],
            "secrets[0].value: unknown key",
        ),
        ({"HF_TOKEN": "hf_live_value"}, "secrets: must be a list, got dict"),
        (["HF_TOKEN=hf_live_value"], "secrets[0]: must be a mapping, got str"),
    ],
)
def test_a_stored_spec_carrying_a_secret_value_is_refused_naming_the_field(
    store: SqliteStore, secrets: object, where: str
) -> None:
    submitted(store)
    data = {**SPEC.to_dict(), "secrets": secrets}
    with sqlite3.connect(store.path) as conn:  # written by something that is not this gpuctl
        conn.execute("UPDATE jobs SET spec = ?", (json.dumps(data),))
    with pytest.raises(StateError) as err:
        store.job("train-a1b2c3")
    assert err.value.message == f"job train-a1b2c3: its stored spec is not valid at {where}"


@SQLITE_ONLY
def test_a_stored_spec_that_no_longer_validates_fails_closed(store: SqliteStore) -> None:
    submitted(store)
    with sqlite3.connect(store.path) as conn:  # another gpuctl's spec
        conn.execute("UPDATE jobs SET spec = ?", ('{"name": "x", "resources": {}, "bogus": 1}',))
    with pytest.raises(GpuctlError) as err:
        store.jobs()
    assert err.value.exit_code is ExitCode.STATE
    assert "job train-a1b2c3: its stored spec is not valid at bogus" in str(err.value)


def test_a_jobs_spec_is_decoded_once_however_often_it_is_read(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    submitted(store)
    decoded: list[str] = []
    decode = codec.spec_from
    monkeypatch.setattr(
        codec, "spec_from", lambda text, job_id: decoded.append(job_id) or decode(text, job_id)
    )
    for _ in range(3):
        assert [j.spec for j in store.jobs()] == [SPEC]
        assert store.job("train-a1b2c3").spec == SPEC  # type: ignore[union-attr]
    assert decoded == ["train-a1b2c3"]


def test_update_job_is_a_compare_and_set(store: SqliteStore) -> None:
    submitted(store)
    held = store.update_job(
        "train-a1b2c3",
        expect=JobState.QUEUED,
        event=ev("hold", at=200.0),
        state=JobState.HELD,
        reason="crash loop",
    )
    assert (held.state, held.reason, held.updated_at) == (JobState.HELD, "crash loop", 200.0)
    with pytest.raises(StoreConflict, match="train-a1b2c3 is held, not queued"):
        store.update_job("train-a1b2c3", expect=JobState.QUEUED, event=ev("x"), priority=9)
    assert store.job("train-a1b2c3") == held
    assert [e.kind for e in store.events()] == ["submit", "hold"]
    with pytest.raises(StoreConflict, match="does not exist"):
        store.update_job("nope-000000", state=JobState.HELD)


def test_update_job_refuses_unknown_and_fixed_fields(store: SqliteStore) -> None:
    submitted(store)
    with pytest.raises(ValueError, match="unknown job field 'stat'"):
        store.update_job("train-a1b2c3", stat=JobState.HELD)
    with pytest.raises(ValueError, match="'incarnation' cannot be changed"):
        store.update_job("train-a1b2c3", incarnation=5)
    updated = store.update_job("train-a1b2c3", cancel_requested=True, restarts=2)
    assert (updated.cancel_requested, updated.restarts) == (True, 2)


# --- begin_launch: intent before side effect, no double booking ------------------------------


def test_begin_launch_records_the_incarnation_and_runs_the_job_in_one_step(
    store: SqliteStore,
) -> None:
    submitted(store)
    running = store.begin_launch(inc(), capacity_mib=CAP, event=ev("launch", at=50.0))
    assert (running.state, running.incarnation, running.first_started_at) == (
        JobState.RUNNING,
        1,
        50.0,
    )
    assert store.incarnations() == [inc()]
    assert store.events()[-1].kind == "launch"


def test_a_slice_that_does_not_fit_beside_the_cards_holders_is_refused(store: SqliteStore) -> None:
    submitted(store, "a-000001")
    submitted(store, "b-000002")
    store.begin_launch(inc("a-000001", mib=30_000), capacity_mib=CAP, event=ev("launch"))
    with pytest.raises(StoreConflict, match=r"b-000002 incarnation 1: card 0 of n1 has 10000 MiB"):
        store.begin_launch(inc("b-000002", mib=20_000), capacity_mib=CAP, event=ev("launch"))
    assert store.job("b-000002").state is JobState.QUEUED  # type: ignore[union-attr]
    assert [i.job_id for i in store.incarnations()] == ["a-000001"]
    assert [e.kind for e in store.events()] == ["submit", "submit", "launch"]
    # a slice that fits beside it is granted
    store.begin_launch(inc("b-000002", mib=10_000), capacity_mib=CAP, event=ev("launch"))


def test_a_whole_card_is_shared_with_nobody(store: SqliteStore) -> None:
    for jid in ("a-000001", "b-000002", "c-000003"):
        submitted(store, jid)
    store.begin_launch(
        inc("a-000001", cards=(1,), mib=40_000, whole=True), capacity_mib=CAP, event=ev("launch")
    )
    with pytest.raises(StoreConflict, match="card 1 of n1 is held whole by job a-000001"):
        store.begin_launch(inc("b-000002", cards=(1,), mib=1), capacity_mib=CAP, event=ev("l"))
    store.begin_launch(inc("b-000002", cards=(0,), mib=1), capacity_mib=CAP, event=ev("l"))
    with pytest.raises(StoreConflict, match="held by job b-000002 incarnation 1; a whole card"):
        store.begin_launch(
            inc("c-000003", cards=(0,), mib=40_000, whole=True), capacity_mib=CAP, event=ev("l")
        )


def test_the_same_incarnation_is_never_launched_twice(store: SqliteStore) -> None:
    submitted(store)
    store.begin_launch(inc(), capacity_mib=CAP, event=ev("launch"))
    with pytest.raises(StoreConflict, match="is running, not queued"):
        store.begin_launch(inc(node="n2"), capacity_mib=CAP, event=ev("launch"))
    # even when the job is queued again, the next launch must be incarnation 2
    store.update_incarnation("train-a1b2c3", 1, state=IncarnationState.LOST)
    store.update_job("train-a1b2c3", expect=JobState.RUNNING, state=JobState.QUEUED)
    with pytest.raises(StoreConflict, match="at incarnation 1; the next one is 2"):
        store.begin_launch(inc(node="n2"), capacity_mib=CAP, event=ev("launch"))
    assert store.begin_launch(inc(n=2, node="n2"), capacity_mib=CAP, event=ev("l")).incarnation == 2


def test_no_launch_while_another_incarnation_of_the_job_is_live(store: SqliteStore) -> None:
    submitted(store)
    store.begin_launch(inc(), capacity_mib=CAP, event=ev("launch"))
    store.update_job("train-a1b2c3", state=JobState.QUEUED)  # a confused caller
    with pytest.raises(StoreConflict, match="incarnation 1 is still launching"):
        store.begin_launch(inc(n=2, node="n2"), capacity_mib=CAP, event=ev("launch"))


def test_a_lost_incarnation_keeps_its_cards_until_it_is_fenced(store: SqliteStore) -> None:
    submitted(store, "a-000001")
    submitted(store, "b-000002")
    store.begin_launch(inc("a-000001", mib=40_000), capacity_mib=CAP, event=ev("launch"))
    store.update_incarnation("a-000001", 1, state=IncarnationState.LOST)
    with pytest.raises(StoreConflict, match="has 0 MiB free"):
        store.begin_launch(inc("b-000002", mib=1), capacity_mib=CAP, event=ev("launch"))
    store.update_incarnation(
        "a-000001",
        1,
        expect=IncarnationState.LOST,
        state=IncarnationState.KILLED,
        end_reason=EndReason.FENCED,
        ended_at=99.0,
    )
    store.begin_launch(inc("b-000002", mib=40_000), capacity_mib=CAP, event=ev("launch"))


def test_begin_launch_refuses_cancelled_missing_and_malformed(store: SqliteStore) -> None:
    submitted(store, cancel_requested=True)
    with pytest.raises(StoreConflict, match="being cancelled"):
        store.begin_launch(inc(), capacity_mib=CAP, event=ev("launch"))
    with pytest.raises(StoreConflict, match="does not exist"):
        store.begin_launch(inc("ghost-000000"), capacity_mib=CAP, event=ev("launch"))
    submitted(store, "b-000002")
    with pytest.raises(ValueError, match="no capacity given"):
        store.begin_launch(inc("b-000002", node="n9"), capacity_mib=CAP, event=ev("launch"))
    with pytest.raises(ValueError, match="cards must be distinct"):
        store.begin_launch(inc("b-000002", cards=(0, 0)), capacity_mib=CAP, event=ev("launch"))
    assert store.incarnations() == []


# --- incarnations -------------------------------------------------------------------------------


def test_update_incarnation_is_a_compare_and_set(store: SqliteStore) -> None:
    submitted(store)
    store.begin_launch(inc(), capacity_mib=CAP, event=ev("launch"))
    running = store.update_incarnation(
        "train-a1b2c3",
        1,
        expect=IncarnationState.LAUNCHING,
        event=ev("started"),
        state=IncarnationState.RUNNING,
        pid=4242,
    )
    assert (running.state, running.pid) == (IncarnationState.RUNNING, 4242)
    with pytest.raises(StoreConflict, match="incarnation 1 is running, not launching"):
        store.update_incarnation(
            "train-a1b2c3", 1, expect=IncarnationState.LAUNCHING, state=IncarnationState.RUNNING
        )
    with pytest.raises(ValueError, match="unknown incarnation field 'pdi'"):
        store.update_incarnation("train-a1b2c3", 1, pdi=1)
    with pytest.raises(ValueError, match="'cards' cannot be changed"):
        store.update_incarnation("train-a1b2c3", 1, cards=(0, 1))
    with pytest.raises(StoreConflict, match="has no incarnation 7"):
        store.update_incarnation("train-a1b2c3", 7, pid=1)
    store.update_incarnation(
        "train-a1b2c3", 1, state=IncarnationState.EXITED, exit_code=0, ended_at=90.0
    )
    with pytest.raises(StoreConflict, match="released its cards"):
        store.update_incarnation("train-a1b2c3", 1, state=IncarnationState.RUNNING)


def test_incarnations_filter_by_job_node_and_holding(store: SqliteStore) -> None:
    submitted(store, "a-000001")
    submitted(store, "b-000002")
    store.begin_launch(inc("a-000001"), capacity_mib=CAP, event=ev("l"))
    store.begin_launch(inc("b-000002", node="n2"), capacity_mib=CAP, event=ev("l"))
    store.update_incarnation("b-000002", 1, state=IncarnationState.EXITED, exit_code=1)
    assert [i.job_id for i in store.incarnations(node="n2")] == ["b-000002"]
    assert [i.job_id for i in store.incarnations(holding=True)] == ["a-000001"]
    assert [i.job_id for i in store.incarnations(holding=False)] == ["b-000002"]
    assert [i.job_id for i in store.incarnations("a-000001", node="n2")] == []


# --- checkpoints, events, cordons, liveness -----------------------------------------------------


def test_checkpoints_are_listed_newest_step_first_and_recording_one_twice_is_harmless(
    store: SqliteStore,
) -> None:
    submitted(store)
    for step in (100, 300, 200):
        cp = Checkpoint("train-a1b2c3", 1, step, f"/ck/step-{step:08d}", float(step), "shared")
        store.add_checkpoint(cp)
    store.add_checkpoint(Checkpoint("train-a1b2c3", 1, 300, "/ck/step-00000300", 300.0, "shared"))
    assert [c.step for c in store.checkpoints("train-a1b2c3")] == [300, 200, 100]
    with pytest.raises(StoreConflict, match="the job does not exist"):
        store.add_checkpoint(Checkpoint("nope-000000", 1, 1, "/x", 1.0, "shared"))


def test_events_filter_by_time_job_and_kind_and_limit_keeps_the_newest(
    store: SqliteStore,
) -> None:
    for i, kind in enumerate(["submit", "launch", "exit", "launch"]):
        store.append_event(ev(kind, at=float(i), job_id="a-000001" if i % 2 else "b-000002"))
    assert [e.at for e in store.events(since=2.0)] == [2.0, 3.0]
    assert [e.at for e in store.events(job_id="a-000001")] == [1.0, 3.0]
    assert [e.at for e in store.events(kinds=["launch"])] == [1.0, 3.0]
    assert [e.at for e in store.events(limit=2)] == [2.0, 3.0]
    event = Event(at=9.0, actor="gpuctl", kind="over_slice", message="m", data={"mib": 5})
    assert store.events()[-1].id == 4
    assert store.append_event(event) == 5
    assert store.events(limit=1)[0].data == {"mib": 5}


@SQLITE_ONLY
def test_the_audit_log_cannot_be_updated_or_deleted(store: SqliteStore) -> None:
    store.append_event(ev("submit"))
    raw = sqlite3.connect(store.path)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw.execute("UPDATE events SET message = 'rewritten'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        raw.execute("DELETE FROM events")
    raw.close()
    assert [e.message for e in store.events()] == ["submit happened"]


def test_cordons_are_recorded_replaced_and_removed_with_events(store: SqliteStore) -> None:
    store.cordon(Cordon("n1", "ecc errors", "gpuctl", "health", 1.0), ev("cordon"))
    by_alice = Cordon("n1", "maintenance", "alice", "operator", 2.0)
    store.cordon(by_alice, ev("cordon"))
    assert store.cordons() == [by_alice]
    assert store.uncordon("n1", ev("uncordon")) == by_alice
    assert store.uncordon("n1", ev("uncordon")) is None
    assert store.cordons() == []
    assert [e.kind for e in store.events()] == ["cordon", "cordon", "uncordon", "uncordon"]


def test_liveness_is_kept_per_node(store: SqliteStore) -> None:
    store.set_liveness(NodeLiveness("n1", last_ok_at=1.0, failing_since=None))
    store.set_liveness(NodeLiveness("n2", last_ok_at=1.0, failing_since=2.0))
    store.set_liveness(NodeLiveness("n2", last_ok_at=1.0, failing_since=2.0, down=True))
    assert store.liveness() == {
        "n1": NodeLiveness("n1", 1.0, None, False),
        "n2": NodeLiveness("n2", 1.0, 2.0, True),
    }


def test_a_healthy_store_checks_clean(store: SqliteStore) -> None:
    submitted(store)
    store.begin_launch(inc(), capacity_mib=CAP, event=ev("launch"))
    assert store.check() == []
    assert store.counts() == {
        "jobs": 1,
        "incarnations": 1,
        "checkpoints": 0,
        "events": 2,
        "cordons": 0,
        "reservations": 0,
        "fleet_samples": 0,
        "node_samples": 0,
    }


@SQLITE_ONLY
def test_check_reports_rows_that_point_nowhere_and_a_marker_for_another_database(
    store: SqliteStore, state_dir: Path
) -> None:
    raw = sqlite3.connect(store.path)  # foreign keys are off on a plain connection
    with raw:
        raw.execute(
            "INSERT INTO allocations (job_id, n, node, card, mib, whole) "
            "VALUES ('ghost-000000', 1, 'n1', 0, 1, 0)"
        )
    raw.close()
    (state_dir / "store.id").write_text('{"database_id": "0123"}')
    assert store.check() == [
        "allocations row 1 refers to a missing incarnations row",
        f"{state_dir / 'store.id'} names database 0123, not {store.path}",
    ]


def test_card_capacities_remember_what_each_launch_was_given(store: SqliteStore) -> None:
    submitted(store, "a-000001")
    submitted(store, "b-000002")
    store.begin_launch(inc("a-000001"), capacity_mib=CAP, event=ev("l"))
    store.begin_launch(
        inc("b-000002", node="n2", whole=True, mib=80_000), capacity_mib={}, event=ev("l")
    )
    assert store.card_capacities() == {("n1", 0): 40_000}


# --- one control loop at a time -----------------------------------------------------------------


@SQLITE_ONLY
def test_the_loop_lock_admits_one_holder_and_names_it(store: SqliteStore, state_dir: Path) -> None:
    held = rf"holds the lock \(pid {os.getpid()}\)"
    with open_store(state_dir, write=True) as other:
        with store.loop_lock(), pytest.raises(StoreConflict, match=held), other.loop_lock(0.1):
            pass
        with other.loop_lock():  # released when the holder's block ended
            pass
    assert stat.S_IMODE((state_dir / "loop.lock").stat().st_mode) == 0o600


RACER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gpuctl.adapters.store import open_store
    from gpuctl.core.jobs.model import Event, Incarnation, IncarnationState
    from gpuctl.errors import StoreConflict

    job_id = sys.argv[2]
    store = open_store(Path(sys.argv[1]), write=True)
    inc = Incarnation(
        job_id, 1, "n1", (0,), (), 30000, False, IncarnationState.LAUNCHING, 1.0, "/r"
    )
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        event = Event(1.0, "t", "launch", "launch", job_id)
        store.begin_launch(inc, capacity_mib={("n1", 0): 40000}, event=event)
        print("won", flush=True)
    except StoreConflict as exc:
        print("lost", exc, flush=True)
    """
)


@SQLITE_ONLY
def test_two_processes_racing_for_the_last_room_on_a_card_one_wins(
    store: SqliteStore, state_dir: Path
) -> None:
    submitted(store, "a-000001")
    submitted(store, "b-000002")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(state_dir), jid],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for jid in ("a-000001", "b-000002")
    ]
    for p in procs:  # both opened the store; release them together
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=30)[0] for p in procs]
    assert sorted(o.split()[0] for o in outs) == ["lost", "won"], outs
    assert "has 10000 MiB free of 40000 MiB" in "".join(outs)
    holders = store.incarnations(node="n1", holding=True)
    assert len(holders) == 1
    assert store.job(holders[0].job_id).state is JobState.RUNNING  # type: ignore[union-attr]
