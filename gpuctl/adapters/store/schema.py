"""The store's schema, versioned: ordered migrations, each applied in the transaction recording it.

`SCHEMA_VERSION` is the newest version this gpuctl knows. A database whose `meta.schema_version`
is newer is refused (an older gpuctl must not write a newer gpuctl's state); an older one is
migrated forward when opened for writing (SQLite: after a backup copy is taken beside it).

Each migration is written once, for both backends: its DDL in SQLite's words, which `Dialect`
turns into PostgreSQL's (`REAL` -> `DOUBLE PRECISION`, `INTEGER` -> `BIGINT`, `BLOB` -> `BYTEA`, an
`AUTOINCREMENT` key -> an identity column, and the `rowid` every SQLite table has -> an identity
column named so), and what DDL cannot say in both (an append-only table's triggers) through
`Dialect` methods. Its data steps run through `dbapi.Conn` with `?` placeholders on either backend.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from gpuctl.adapters.store import codec
from gpuctl.adapters.store.dbapi import Conn
from gpuctl.errors import StateError

V1 = """
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,               -- the validated job spec as JSON (secret names only)
    state TEXT NOT NULL,
    priority INTEGER NOT NULL,
    tier TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    reason TEXT,
    incarnation INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    first_started_at REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL DEFAULT 0
);
CREATE INDEX jobs_by_name ON jobs (name, submitted_at);
CREATE INDEX jobs_by_state ON jobs (state);

CREATE TABLE incarnations (
    job_id TEXT NOT NULL REFERENCES jobs (id),
    n INTEGER NOT NULL,
    node TEXT NOT NULL,
    cards TEXT NOT NULL,              -- JSON list of card indexes, in CUDA_VISIBLE_DEVICES order
    gpu_uuids TEXT NOT NULL,          -- JSON list
    mib_per_card INTEGER NOT NULL,
    whole INTEGER NOT NULL,
    state TEXT NOT NULL,
    started_at REAL NOT NULL,
    run_dir TEXT NOT NULL,
    pid INTEGER,
    ended_at REAL,
    exit_code INTEGER,
    end_reason TEXT,
    resume_step INTEGER,
    cpu_milli INTEGER NOT NULL DEFAULT 0,
    host_mem_mib INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, n)
);
CREATE INDEX incarnations_by_node ON incarnations (node, state);

-- One row per card an incarnation was granted (written by begin_launch, never changed): the card
-- is held while its incarnation's state holds cards (launching, running, stopping, lost).
CREATE TABLE allocations (
    job_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    node TEXT NOT NULL,
    card INTEGER NOT NULL,
    mib INTEGER NOT NULL,
    whole INTEGER NOT NULL,
    capacity_mib INTEGER,             -- the card's capacity as given when it was granted
    PRIMARY KEY (job_id, n, card),
    FOREIGN KEY (job_id, n) REFERENCES incarnations (job_id, n)
);
CREATE INDEX allocations_by_card ON allocations (node, card);

CREATE TABLE checkpoints (
    job_id TEXT NOT NULL REFERENCES jobs (id),
    incarnation INTEGER NOT NULL,
    step INTEGER NOT NULL,
    path TEXT NOT NULL,
    committed_at REAL NOT NULL,
    location TEXT NOT NULL,
    PRIMARY KEY (job_id, incarnation, step, location)
);

-- The audit log: append-only. No code path updates or deletes a row, and triggers refuse anyone
-- who tries (`Dialect.append_only`, created with this table).
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL,
    job_id TEXT,
    node TEXT,
    outcome TEXT,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_by_job ON events (job_id, id);
CREATE INDEX events_by_time ON events (at);

CREATE TABLE cordons (
    node TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    operator TEXT NOT NULL,
    source TEXT NOT NULL,
    at REAL NOT NULL
);

CREATE TABLE liveness (
    node TEXT PRIMARY KEY,
    last_ok_at REAL,
    failing_since REAL,
    down INTEGER NOT NULL DEFAULT 0
);
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the backends' DDL (see the module docstring)."""

    name: str  # "sqlite" | "postgresql"

    @property
    def postgres(self) -> bool:
        return self.name == "postgresql"

    def script(self, ddl: str) -> list[str]:
        """The statements of `ddl` (SQLite's words), in this dialect."""
        statements = _statements(ddl)
        return [_to_postgres(s) for s in statements] if self.postgres else statements

    def append_only(self, table: str) -> list[str]:
        """Triggers refusing any UPDATE or DELETE of `table`'s rows."""
        message = f"the {table} table is append-only"
        if not self.postgres:
            return [
                f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table}\n"
                f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
                for op in ("UPDATE", "DELETE")
            ]
        return [
            f"CREATE FUNCTION {table}_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{message}'; END $$",
            *(
                f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {table}_append_only()"
                for op in ("UPDATE", "DELETE")
            ),
        ]

    @property
    def now(self) -> str:
        """The database's clock as an SQL expression: seconds since the epoch (the lease's times
        are the store's: the server's, for PostgreSQL, whichever machine a controller runs on)."""
        if self.postgres:
            return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
        return "((julianday('now') - 2440587.5) * 86400.0)"

    def locking(self, mode: str) -> str:
        """What a SELECT ends with to lock the rows it reads until the transaction ends ("UPDATE"
        or "SHARE"); nothing on SQLite, whose write transactions hold the whole database."""
        return f" FOR {mode}" if self.postgres else ""


SQLITE = Dialect("sqlite")
POSTGRES = Dialect("postgresql")

_TYPES = (
    (
        re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"),
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    ),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
)
_CREATE_TABLE = re.compile(r"^(CREATE TABLE \w+ \()", re.MULTILINE)


def _to_postgres(statement: str) -> str:
    for pattern, replacement in _TYPES:
        statement = pattern.sub(replacement, statement)
    # SQLite numbers every table's rows (rowid: insertion order, which some reads sort by)
    return _CREATE_TABLE.sub(r"\1\n    rowid BIGINT GENERATED ALWAYS AS IDENTITY,", statement)


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    """Brings a database from `version - 1` to `version`."""

    version: int
    description: str
    apply: Callable[[Conn, Dialect], None]


def _v1(conn: Conn, dialect: Dialect) -> None:
    for statement in [*dialect.script(V1), *dialect.append_only("events")]:
        conn.execute(statement)


def _statements(script: str) -> list[str]:
    """Split a script into statements: each ends with `;` at the end of a line (comments
    dropped). `executescript` would commit SQLite's open transaction."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        code = line.split("--", 1)[0]
        buf += code
        if code.rstrip().endswith(";"):
            if buf.strip().rstrip(";").strip():
                out.append(buf.strip().rstrip(";").strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


V2 = """
-- Cards held for a job's next incarnation while its current one is moved off (a migration: drain,
-- consolidation). At most one per job; begin_launch consumes it in the transaction granting them.
CREATE TABLE reservations (
    job_id TEXT PRIMARY KEY REFERENCES jobs (id),
    from_incarnation INTEGER NOT NULL,
    source_node TEXT NOT NULL,
    node TEXT NOT NULL,
    cards TEXT NOT NULL,              -- JSON list of card indexes
    capacity_mib TEXT NOT NULL,       -- JSON list: each card's capacity when it was reserved
    gpu_uuids TEXT NOT NULL,          -- JSON list
    mib_per_card INTEGER NOT NULL,
    whole INTEGER NOT NULL,
    cpu_milli INTEGER NOT NULL DEFAULT 0,
    host_mem_mib INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    deadline_at REAL NOT NULL,
    grace_s REAL NOT NULL,
    checkpoint_wait_s REAL NOT NULL,
    reason TEXT NOT NULL,
    actor TEXT NOT NULL,
    source TEXT NOT NULL,
    phase TEXT NOT NULL,
    checkpoint_requested_at REAL,
    baseline_step INTEGER,
    stop_requested_at REAL
);
CREATE INDEX reservations_by_node ON reservations (node);

-- Each node's health as the control loop tracks it across passes (hysteresis, cool-down).
CREATE TABLE node_health (
    node TEXT PRIMARY KEY,
    action TEXT NOT NULL,
    streak INTEGER NOT NULL,
    since REAL NOT NULL,
    healthy_since REAL,
    reason TEXT NOT NULL DEFAULT '',
    drain_started_at REAL,
    updated_at REAL NOT NULL
);
"""


def _v2(conn: Conn, dialect: Dialect) -> None:
    for statement in dialect.script(V2):
        conn.execute(statement)


V3 = """
-- The node's clock minus gpuctl's when the incarnation was launched (NULL: unknown): its
-- checkpoints carry the node's clock, compared with started_at / ended_at (gpuctl's).
ALTER TABLE incarnations ADD COLUMN clock_offset_s REAL;
"""


def _v3(conn: Conn, dialect: Dialect) -> None:
    for statement in dialect.script(V3):
        conn.execute(statement)


def _v4(conn: Conn, dialect: Dialect) -> None:
    """Each job's spec rewritten from the spec file's keys (`mem_per_gpu: 24GiB`, ...) to the
    typed spec's plain data (`JobSpec.to_dict`), so no reader validates a spec file again. A row
    that cannot be read stops the migration (the store stays as it was, at its old version)."""
    for job_id, text in conn.execute("SELECT id, spec FROM jobs").fetchall():
        try:
            spec = codec.spec_from(text, job_id)
        except StateError as exc:
            raise StateError(
                f"cannot migrate the store to schema v4: {exc.message}",
                hint="the store was left as it was; use the gpuctl that wrote it to cancel and "
                "remove that job, or restore a backup",
            ) from None
        new = codec.dumps(spec.to_dict(), f"job {job_id}: spec")
        if new != text:
            conn.execute("UPDATE jobs SET spec = ? WHERE id = ?", (new, job_id))


V5 = """
-- The fleet's history (`core.history`): the five numbers, and each node's use, at the history's
-- resolution, averaged into 5-minute and hourly rows as they age, dropped past the retention.
CREATE TABLE fleet_samples (
    at INTEGER NOT NULL,              -- the sample's (or bucket's) start, seconds since the epoch
    step_s INTEGER NOT NULL,          -- the resolution: the recording's, 300 or 3600 (averaged)
    utilization_pct REAL,
    observed_util_pct REAL,
    fragmentation_pct REAL,
    stranded_gib REAL,
    allocated_mib INTEGER,
    capacity_mib INTEGER,
    queue_wait_p50_s REAL,
    queue_wait_p95_s REAL,
    queue_waiting INTEGER,
    checkpoint_age_max_s REAL,
    failover_success_pct REAL,
    preemptions_per_hour REAL,
    PRIMARY KEY (at)
);

-- Each node named once: a month of samples of 1,000 nodes names them millions of times.
CREATE TABLE history_nodes (
    id INTEGER NOT NULL PRIMARY KEY,  -- given by gpuctl (max + 1), never reused
    name TEXT NOT NULL UNIQUE
);

CREATE TABLE node_samples (
    at INTEGER NOT NULL,
    node_id INTEGER NOT NULL REFERENCES history_nodes (id),
    step_s INTEGER NOT NULL,
    util_pct REAL,                    -- mean SM utilization of the GPUs that answered, whole %
    mem_used_mib INTEGER,             -- observed (NVML)
    mem_allocated_mib INTEGER,        -- granted by gpuctl
    mem_ghost_mib INTEGER,            -- observed in use by processes gpuctl does not know
    mem_total_mib INTEGER,
    PRIMARY KEY (at, node_id)
);
"""

# The audit log gets a retention: a prune deletes the events older than its horizon, which it
# writes to meta (events_prune_before) in its own transaction and removes again; every other
# delete is still refused, as before.
V5_EVENTS_SQLITE = (
    "DROP TRIGGER events_no_delete",
    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events\n"
    "WHEN OLD.at >= COALESCE("
    "(SELECT CAST(value AS REAL) FROM meta WHERE key = 'events_prune_before'), 0)\n"
    "BEGIN SELECT RAISE(ABORT, 'the events table is append-only'); END",
)
V5_EVENTS_POSTGRES = (
    "CREATE FUNCTION events_prunable() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF OLD.at < COALESCE((SELECT CAST(value AS DOUBLE PRECISION) FROM meta "
    "WHERE key = 'events_prune_before'), 0) THEN RETURN OLD; END IF; "
    "RAISE EXCEPTION 'the events table is append-only'; END $$",
    "DROP TRIGGER events_no_delete ON events",
    "CREATE TRIGGER events_no_delete BEFORE DELETE ON events "
    "FOR EACH ROW EXECUTE FUNCTION events_prunable()",
)


def _v5(conn: Conn, dialect: Dialect) -> None:
    events = V5_EVENTS_POSTGRES if dialect.postgres else V5_EVENTS_SQLITE
    for statement in [*dialect.script(V5), *events]:
        conn.execute(statement)


V6 = """
-- The controller's lease (`core.lease`): one row, never deleted, so its token only grows.
CREATE TABLE controller_lease (
    name TEXT PRIMARY KEY,            -- 'controller'
    holder TEXT NOT NULL,             -- host:pid:random
    token INTEGER NOT NULL,           -- +1 at each acquisition: the fencing token
    acquired_at REAL NOT NULL,        -- the store's clock, seconds since the epoch
    renewed_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    last_pass_at REAL                 -- when the leader's last pass ended
);

-- Each `gpuctl controller run`, leader or standby, with its heartbeat.
CREATE TABLE controllers (
    holder TEXT PRIMARY KEY,
    role TEXT NOT NULL,               -- leader | standby
    started_at REAL NOT NULL,
    seen_at REAL NOT NULL,
    expires_at REAL NOT NULL          -- gone when not seen again by then
);
"""


def _v6(conn: Conn, dialect: Dialect) -> None:
    for statement in dialect.script(V6):
        conn.execute(statement)


V7 = """
-- Who submitted each job ('' for jobs from before v7), and a version that grows by one at each
-- change of its row: a plan names the versions it was made on, and a write refuses a stale one.
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
CREATE INDEX jobs_by_owner ON jobs (owner, submitted_at);

-- Each node's cordon state has a version: every cordon and uncordon adds one and says who, when
-- and why, so a cordon, uncordon or drain planned on an older one is refused, saying what changed.
CREATE TABLE node_versions (
    node TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    kind TEXT NOT NULL,               -- cordon | uncordon
    reason TEXT NOT NULL DEFAULT ''
);

-- The fleet as the control loop polled it, the newest few (`core.shared`): operators read it
-- instead of polling every node themselves.
CREATE TABLE fleet_snapshots (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    taken_at REAL NOT NULL,
    published_at REAL NOT NULL,
    publisher TEXT NOT NULL,
    interval_s REAL NOT NULL,
    nodes INTEGER NOT NULL,
    body BLOB NOT NULL                -- the snapshot's JSON, zlib-compressed
);
"""


def _v7(conn: Conn, dialect: Dialect) -> None:
    for statement in dialect.script(V7):
        conn.execute(statement)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "jobs, incarnations, cards, events, cordons", _v1),
    Migration(2, "reservations (migration targets), node health", _v2),
    Migration(3, "the node clock offset of each incarnation", _v3),
    Migration(4, "job specs stored typed (JobSpec.to_dict), no longer as spec file keys", _v4),
    Migration(5, "the fleet's history (fleet and node samples), a retention for events", _v5),
    Migration(6, "the controller's lease (holder, expiry, fencing token) and its members", _v6),
    Migration(7, "job owners, job and node versions, the published fleet snapshot", _v7),
)


def latest_version(migrations: tuple[Migration, ...] | None = None) -> int:
    chain = MIGRATIONS if migrations is None else migrations
    return chain[-1].version if chain else 0


def pending(current: int, migrations: tuple[Migration, ...] | None = None) -> list[Migration]:
    """The migrations to apply, in order, to a database at `current`."""
    chain = MIGRATIONS if migrations is None else migrations
    versions = [m.version for m in chain]
    if versions != list(range(1, len(chain) + 1)):
        raise ValueError(f"migrations must be numbered 1..n in order, got {versions}")
    return [m for m in chain if m.version > current]


SCHEMA_VERSION = latest_version()
