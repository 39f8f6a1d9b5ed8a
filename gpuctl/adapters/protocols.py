"""The protocols adapters implement. Tests fake these, never paramiko or pynvml call by call."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpuctl.core.health.autodrain import NodeHealth
from gpuctl.core.history import FleetSample, NodeSample, Pruned, PruneReport, Retention
from gpuctl.core.jobs.migration import Phase, Reservation
from gpuctl.core.jobs.model import (
    CardClash,
    Checkpoint,
    CheckpointMarker,
    Cordon,
    Event,
    Fenced,
    Incarnation,
    IncarnationState,
    Job,
    JobProcess,
    JobState,
    LaunchRequest,
    NodeLiveness,
    NodeVersion,
    RunStatus,
)
from gpuctl.core.lease import Fence, Lease, Member
from gpuctl.core.model import NodeSpec
from gpuctl.core.shared import PublishedFleet
from gpuctl.errors import GpuctlError, TransportError


@dataclasses.dataclass(frozen=True, slots=True)
class ExecResult:
    """What a remote command returned. `truncated` is set when output passed the byte limit."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    duration_s: float
    truncated: bool = False


class Transport(Protocol):
    """Runs one shell command on one node.

    `command` is a complete POSIX shell command line whose every variable part was quoted by the
    caller (`shlex.quote` / `shlex.join`). Raises a `gpuctl.errors.TransportError` subclass when the
    node cannot be reached, refuses, fails auth, has an untrusted host key, or a deadline passes
    (the remote command is then killed on the node). Implementations are thread-safe and reuse
    connections between calls.
    """

    def run(
        self,
        node: NodeSpec,
        command: str,
        *,
        timeout_s: float,
        max_output_bytes: int = 8 << 20,
        stdin: bytes | None = None,
    ) -> ExecResult: ...

    def close(self) -> None: ...


@runtime_checkable
class SessionTransport(Transport, Protocol):
    """A transport that also keeps an answering session per node: `ask` runs `program` (which
    bounds its own steps) with `request` as its `$1` in a command started once and kept between
    calls, so a warm call opens no channel and starts no remote shell. Its answer is whole or
    a `TransportError`, as `run`'s."""

    def ask(
        self,
        node: NodeSpec,
        program: str,
        request: str,
        *,
        timeout_s: float,
        max_output_bytes: int = 8 << 20,
    ) -> ExecResult: ...

    def ask_warm(
        self,
        asks: Sequence[tuple[NodeSpec, str]],
        program: str,
        *,
        max_output_bytes: int = 8 << 20,
    ) -> dict[int, ExecResult | TransportError]:
        """`ask` the nodes (node, request) whose session is up and idle, all together; by
        index in `asks`, the others left out (for `ask`). Deadline: each node's
        `command_timeout_s`."""
        ...


class TreeExists(GpuctlError):
    """The destination of a copy already exists."""


class TreeTooLarge(GpuctlError):
    """The tree passed the byte or file limit of a copy."""


@runtime_checkable
class TreeTransport(Protocol):
    """A transport that can also copy folders (`gpuctl.adapters.ssh.SshTransport` does, by SFTP):
    a destination that exists is refused (`TreeExists`), never merged; a tree past `max_bytes` (or
    the file limit) stops the copy (`TreeTooLarge`)."""

    def get_tree(
        self,
        node: NodeSpec,
        remote_dir: str,
        local_dir: str | Path,
        *,
        timeout_s: float,
        max_bytes: int,
        last: Sequence[str] = (),
    ) -> int: ...

    def put_tree(
        self,
        node: NodeSpec,
        local_dir: str | Path,
        remote_dir: str,
        *,
        timeout_s: float,
        max_bytes: int,
        last: Sequence[str] = (),
    ) -> int: ...


class Clock(Protocol):
    def now(self) -> float: ...

    def monotonic(self) -> float: ...


# --- the state store -------------------------------------------------------------------------


class Store(Protocol):
    """Jobs, incarnations (and the cards they hold), checkpoints, cordons, liveness and the audit
    log. Implementations: SQLite (`gpuctl.adapters.store.sqlite`), PostgreSQL
    (`gpuctl.adapters.store.postgres`).

    Every mutating method is one transaction. Compare-and-set methods raise
    `gpuctl.errors.StoreConflict` when the row is not in the expected state, so two control loops
    never both act on one job, and `begin_launch` never double-books a card. A store that cannot be
    trusted (corrupt, missing where one existed, newer schema) raises `gpuctl.errors.StateError`
    with the hint `gpuctl db check` when opened for writing.
    """

    def close(self) -> None: ...

    # jobs
    def add_job(self, job: Job, event: Event) -> None: ...
    def job(self, ref: str) -> Job | None: ...  # by id, or by name (the newest job of that name)
    def jobs(self, states: Iterable[JobState] | None = None) -> list[Job]: ...
    def update_job(
        self,
        job_id: str,
        *,
        expect: JobState | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Job: ...

    # incarnations and the cards they hold
    def begin_launch(
        self, inc: Incarnation, *, capacity_mib: Mapping[tuple[str, int], int], event: Event
    ) -> Job: ...
    # a run another scheduler started (Slurm's), written running as it happened: it checks only
    # that the job is there, unfinished, at the incarnation before (and the fence), never a
    # cordon nor room; the cards someone else holds come back, recorded all the same
    def record_run(
        self, inc: Incarnation, *, capacity_mib: Mapping[tuple[str, int], int], event: Event
    ) -> tuple[Job, tuple[CardClash, ...]]: ...
    def update_incarnation(
        self,
        job_id: str,
        n: int,
        *,
        expect: IncarnationState | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Incarnation: ...
    def incarnations(
        self, job_id: str | None = None, *, node: str | None = None, holding: bool | None = None
    ) -> list[Incarnation]: ...
    # the incarnations (by number) of the jobs in `states`, by job (one without any: no key)
    def incarnations_for(
        self, states: Iterable[JobState], *, holding: bool | None = None
    ) -> dict[str, list[Incarnation]]: ...

    # checkpoints (newest step first)
    def add_checkpoint(self, checkpoint: Checkpoint) -> None: ...
    def checkpoints(self, job_id: str) -> list[Checkpoint]: ...
    def checkpoints_for(self, states: Iterable[JobState]) -> dict[str, list[Checkpoint]]: ...

    # the audit log (append-only)
    def append_event(self, event: Event) -> int: ...
    def events(
        self,
        *,
        since: float | None = None,
        job_id: str | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[Event]: ...

    # reservations: cards held for a job's next incarnation while it is moved (a migration);
    # `begin_launch` counts other jobs' reservations as held, refuses a cordoned node, and
    # consumes the job's own reservation (the incarnation must take exactly its cards)
    def reserve(
        self, reservation: Reservation, *, event: Event, expect_job_version: int | None = None
    ) -> None: ...
    def reservations(self, node: str | None = None) -> list[Reservation]: ...
    def update_reservation(
        self,
        job_id: str,
        *,
        expect: Phase | None = None,
        event: Event | None = None,
        **changes: Any,
    ) -> Reservation: ...
    def release_reservation(self, job_id: str, *, event: Event) -> Reservation | None: ...

    # cordons and node liveness; `keep_existing`: never replace a cordon already there (True
    # when this one was written); `expect_source`: lift only a cordon of that source;
    # `expect_version`: refuse (StoreConflict saying who changed what, when) unless the node's
    # cordon version is still the one the plan saw (`node_versions`; a node absent is at 0)
    def cordon(
        self,
        cordon: Cordon,
        event: Event,
        *,
        keep_existing: bool = False,
        expect_version: int | None = None,
    ) -> bool: ...
    def uncordon(
        self,
        node: str,
        event: Event,
        *,
        expect_source: str | None = None,
        expect_version: int | None = None,
    ) -> Cordon | None: ...
    def cordons(self) -> list[Cordon]: ...
    def node_versions(self) -> dict[str, NodeVersion]: ...

    # the fleet as the control loop polled it (`core.shared`): the newest few kept
    def publish_snapshot(self, published: PublishedFleet, *, keep: int = ...) -> int: ...
    def latest_snapshot(self) -> PublishedFleet | None: ...
    def liveness(self) -> dict[str, NodeLiveness]: ...
    def set_liveness(self, *liveness: NodeLiveness) -> None: ...  # in one transaction

    # each node's health as the control loop tracks it across passes
    def node_health(self) -> dict[str, NodeHealth]: ...
    def set_node_health(self, health: NodeHealth) -> None: ...

    # the fleet's history (`core.history`): samples of the five numbers and of each node's use,
    # oldest first; a sample at a time already recorded replaces it. `prune_history` averages
    # aged samples into 5-minute and hourly rows, drops those past the retention, and deletes
    # events past theirs (checkpoint events sooner than the rest) in one transaction
    def record_samples(self, fleet: FleetSample | None, nodes: Sequence[NodeSample]) -> None: ...
    def fleet_samples(self, since: float, until: float | None = None) -> list[FleetSample]: ...
    def node_samples(
        self, since: float, until: float | None = None, node: str | None = None
    ) -> list[NodeSample]: ...
    def last_sample_at(self) -> float | None: ...
    def prune_history(self, now: float, retention: Retention) -> Pruned: ...
    # each node's samples averaged into buckets of `step_s` (`core.history.average_nodes`'s
    # values, computed where the samples are: one row per node and bucket comes back)
    def node_sample_buckets(
        self, since: float, step_s: int, until: float | None = None, node: str | None = None
    ) -> list[NodeSample]: ...
    # `prune_history` with each table's rows by level before and after, in one transaction,
    # rolled back on a dry run (`gpuctl history prune`)
    def prune_history_report(
        self, now: float, retention: Retention, *, dry_run: bool = False
    ) -> PruneReport: ...

    # integrity: problems found (empty: healthy); never raises for a damaged database
    def check(self) -> list[str]: ...

    # one control loop at a time (an exclusive, cross-process lock; raises StoreConflict when
    # `wait_s` passes)
    def loop_lock(self, wait_s: float = 0.0) -> AbstractContextManager[None]: ...

    # the controller's lease (`core.lease`; times are the store's clock). `acquire_lease` takes
    # it when none is live (the token grows by one) or renews the holder's own, returning the
    # lease as it is after; `set_fence` makes every later write of this store object check,
    # in its own transaction, that the fence is the live lease's (`LeaseLost` otherwise), and
    # `renew_lease` / `release_lease` / `mark_pass` are such writes. Members: each controller's
    # heartbeat
    def set_fence(self, fence: Fence | None) -> None: ...
    def lease(self) -> Lease | None: ...
    def acquire_lease(self, holder: str, lease_s: float) -> Lease: ...
    def renew_lease(self, lease_s: float) -> Lease: ...
    def release_lease(self) -> None: ...
    def mark_pass(self) -> None: ...
    def heartbeat(self, holder: str, role: str, ttl_s: float) -> None: ...
    def leave(self, holder: str) -> None: ...
    def members(self) -> list[Member]: ...


# --- jobs on nodes -------------------------------------------------------------------------------


class JobRunner(Protocol):
    """Starts, watches, signals and reads jobs on nodes, over a `Transport`. Raises
    `gpuctl.errors.TransportError` subclasses when a node cannot be reached."""

    def launch(self, node: NodeSpec, request: LaunchRequest) -> RunStatus: ...

    def observe(self, node: NodeSpec) -> list[RunStatus]: ...  # every incarnation on the node

    def signal(self, node: NodeSpec, job_id: str, incarnation: int, signal: str) -> bool: ...

    # kill every process of the incarnation on the node, claim its launch; `Fenced.gone` when
    # none is left (the only reading that lets an incarnation end while it may have lived)
    def fence(self, node: NodeSpec, job_id: str, incarnation: int) -> Fenced: ...

    def processes(self, node: NodeSpec) -> list[JobProcess]: ...  # live processes of jobs

    def logs(
        self,
        node: NodeSpec,
        job_id: str,
        incarnation: int,
        *,
        offset: int = 0,
        limit: int = 1 << 20,
    ) -> tuple[bytes, int]: ...  # (the log's bytes from `offset`, the next offset)

    def checkpoints(self, node: NodeSpec, checkpoint_dir: str) -> list[CheckpointMarker]: ...

    def pull_checkpoint(self, node: NodeSpec, remote_path: str, local_dir: str) -> None: ...

    def push_checkpoint(self, node: NodeSpec, local_dir: str, remote_path: str) -> None: ...
