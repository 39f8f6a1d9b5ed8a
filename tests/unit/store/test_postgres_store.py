"""The PostgreSQL store on a real server (tests/pg.py): concurrent writers, the schema's
versions, the loop lock, and URLs that never carry or show a password."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from gpuctl.adapters.store import schema
from gpuctl.adapters.store.postgres import open_url, url
from gpuctl.adapters.store.postgres.store import PostgresStore
from gpuctl.core.jobs.model import Cordon, Event, Incarnation, IncarnationState, Job, JobState
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import ExitCode, StateError, StoreConflict, UsageError

CAP = {("n1", 0): 40_000}


def ev(kind: str, at: float = 100.0) -> Event:
    return Event(at, "alice", kind, f"{kind} happened")


def job(job_id: str = "train-1") -> Job:
    return Job(job_id, "train", JobSpec(JobRequest("train")), JobState.QUEUED, 0, "standard", 1.0)


def inc(job_id: str, mib: int = 30_000) -> Incarnation:
    return Incarnation(
        job_id, 1, "n1", (0,), ("GPU-0",), mib, False, IncarnationState.LAUNCHING, 50.0, "/r"
    )


@pytest.fixture
def two(pg_url: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    a, b = open_url(pg_url, write=True), open_url(pg_url, write=True)
    yield a, b
    a.close()
    b.close()


def test_two_writers_racing_a_compare_and_set_of_one_job_one_wins_the_other_is_refused(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    a.add_job(job(), ev("submit"))
    # a holds the job's row in an open transaction; b's update waits for it, then sees a's change
    results: dict[str, object] = {}
    with a._tx() as c:
        c.execute("SELECT 1 FROM jobs WHERE id = ? FOR UPDATE", ("train-1",))

        def racer() -> None:
            try:
                results["b"] = b.update_job(
                    "train-1", expect=JobState.QUEUED, state=JobState.CANCELLED, reason="b"
                )
            except StoreConflict as exc:
                results["b"] = exc

        t = threading.Thread(target=racer)
        t.start()
        t.join(0.5)
        assert t.is_alive()  # b waits on the row, it does not read around a
        c.execute(
            "UPDATE jobs SET state = ?, reason = ? WHERE id = ?",
            (JobState.FAILED.value, "a", "train-1"),
        )
    t.join(10)
    assert isinstance(results["b"], StoreConflict)
    assert "is failed, not queued" in str(results["b"])
    final = b.job("train-1")
    assert final is not None and (final.state, final.reason) == (JobState.FAILED, "a")


def test_many_racing_launches_onto_one_card_book_it_once(
    two: tuple[PostgresStore, PostgresStore], pg_url: str
) -> None:
    a, _ = two
    for i in range(6):
        a.add_job(job(f"j-{i}"), ev("submit"))
    stores = [open_url(pg_url, write=True) for _ in range(6)]
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def launch(i: int) -> None:
        barrier.wait()
        try:
            stores[i].begin_launch(inc(f"j-{i}"), capacity_mib=CAP, event=ev("launch"))
            outcomes.append("won")
        except StoreConflict:
            outcomes.append("refused")

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for s in stores:
        s.close()
    assert sorted(outcomes) == ["refused"] * 5 + ["won"]  # 30 GiB of 40: room for one
    assert len(a.incarnations(holding=True)) == 1


def test_a_cordon_and_a_launch_on_its_node_never_both_pass(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = two
    a.add_job(job(), ev("submit"))
    a.cordon(Cordon("n1", "fan", "bob", "person", 5.0), ev("cordon"))
    with pytest.raises(StoreConflict, match="n1 is cordoned"):
        b.begin_launch(inc("train-1"), capacity_mib=CAP, event=ev("launch"))


def test_a_schema_newer_than_this_gpuctl_is_refused_for_reading_and_writing(pg_url: str) -> None:
    open_url(pg_url, write=True).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE meta SET value = %s WHERE key = 'schema_version'", (str(99),))
    for write in (True, False):
        with pytest.raises(StateError, match="schema version 99 is newer") as err:
            open_url(pg_url, write=write)
        assert err.value.exit_code is ExitCode.STATE


def test_an_older_schema_is_migrated_forward_on_write_and_read_as_it_is(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as raw:
        from gpuctl.adapters.store.postgres.store import PgConn

        conn = PgConn(raw)
        for step in schema.MIGRATIONS[:2]:
            step.apply(conn, schema.POSTGRES)
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '2')")
        conn.execute("INSERT INTO meta (key, value) VALUES ('database_id', 'old')")
    with open_url(pg_url, write=False) as store:
        assert store.schema_version == 2 and store.jobs() == []
    with open_url(pg_url, write=True) as store:
        assert store.schema_version == schema.SCHEMA_VERSION
        assert store.check() == []


def test_an_empty_database_reads_as_an_empty_store_and_gets_no_tables(pg_url: str) -> None:
    with open_url(pg_url, write=False) as store:
        assert store.jobs() == [] and store.cordons() == [] and store.ephemeral
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT to_regclass('meta')").fetchone() == (None,)


def test_the_loop_lock_admits_one_loop_and_a_dead_holder_leaves_none(pg_url: str) -> None:
    a, b = open_url(pg_url, write=True), open_url(pg_url, write=True)
    with a.loop_lock(), pytest.raises(StoreConflict, match="another control loop"):
        b.loop_lock(wait_s=0.1).__enter__()
    with b.loop_lock():
        pass  # released when a's block ended
    a.close()
    b.close()


def test_the_audit_log_cannot_be_updated(pg_url: str) -> None:
    with open_url(pg_url, write=True) as store:
        store.append_event(ev("x"))
    with (
        psycopg.connect(pg_url, autocommit=True) as conn,
        pytest.raises(psycopg.Error, match="append-only"),
    ):
        conn.execute("UPDATE events SET kind = 'y'")


@pytest.mark.parametrize(
    "given",
    [
        "postgresql://alice:s3cret@db.example:5432/gpuctl",
        "postgresql://alice@db.example/gpuctl?password=s3cret",
    ],
)
def test_a_url_carrying_a_password_is_refused_without_repeating_it(given: str) -> None:
    with pytest.raises(UsageError) as err:
        url.check(given, where="GPUCTL_STATE_URL")
    text = f"{err.value.message} {err.value.hint}"
    assert "GPUCTL_STATE_URL" in text and ".pgpass" in text and "s3cret" not in text
    assert err.value.exit_code is ExitCode.USAGE


def test_urls_are_shown_without_a_password_and_described_by_host() -> None:
    assert url.redact("postgresql://al:pw@h:5/db?password=pw&sslmode=require") == (
        "postgresql://al@h:5/db?sslmode=require"
    )
    assert url.describe("postgresql://al@db.example:6543/gpuctl") == (
        "PostgreSQL at db.example:6543/gpuctl"
    )
    assert url.describe("postgresql:///gpuctl?host=/run/pg") == (
        "PostgreSQL on the local socket in /run/pg, database gpuctl"
    )
    with pytest.raises(UsageError, match="not a PostgreSQL URL"):
        url.check("mysql://h/db")


def test_an_unreachable_server_is_a_state_error_naming_the_host() -> None:
    with pytest.raises(StateError) as err:
        open_url("postgresql://gpuctl@127.0.0.1:1/gpuctl?connect_timeout=2", write=False)
    assert err.value.exit_code is ExitCode.STATE
    assert err.value.message.startswith("PostgreSQL at 127.0.0.1:1/gpuctl: cannot connect")
    assert "\n" not in err.value.message
