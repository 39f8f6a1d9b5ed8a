"""The job lifecycle vocabulary: jobs, incarnations, checkpoints, events, cordons.

Frozen values shared by the state store (`gpuctl.adapters.store`), the control loop
(`gpuctl.ops.loop`) and the CLI. A *job* is what an operator submitted (stable id, its
`gpuctl.core.jobs.spec.JobSpec`); an *incarnation* is one run of it on one node
(`GPUCTL_INCARNATION`, +1 at every (re)start). Cards are held by incarnations that are launching,
running, or lost-but-not-yet-fenced, so a node that comes back is never double-booked before its
stale copy is killed.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.timefmt import clock


class JobState(enum.StrEnum):
    QUEUED = "queued"  # waiting for a placement (also: requeued after preemption or failover)
    RUNNING = "running"  # an incarnation is launching or running
    HELD = "held"  # not scheduled until an operator releases it (crash loop, budget spent)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class IncarnationState(enum.StrEnum):
    LAUNCHING = "launching"  # intent written, the remote launch not yet confirmed
    RUNNING = "running"  # confirmed: pid known on the node
    STOPPING = "stopping"  # SIGTERM sent (cancel, preemption, drain), waiting for the grace
    EXITED = "exited"  # the process ended on its own (exit code known)
    LOST = "lost"  # its node went down; restarted elsewhere; must be fenced when it returns
    KILLED = "killed"  # gpuctl killed it (cancel, preemption, over slice, fencing)

    @property
    def holds_cards(self) -> bool:
        return self in (
            IncarnationState.LAUNCHING,
            IncarnationState.RUNNING,
            IncarnationState.STOPPING,
            IncarnationState.LOST,
        )


class EndReason(enum.StrEnum):
    EXITED = "exited"
    NODE_LOST = "node_lost"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    OVER_SLICE = "over_slice"
    DRAINED = "drained"
    FENCED = "fenced"
    LAUNCH_FAILED = "launch_failed"


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """A submitted job: its spec as submitted (typed, secret *names* only), its state."""

    id: str
    name: str
    spec: JobSpec
    state: JobState
    priority: int
    tier: str
    submitted_at: float
    reason: str | None = None  # why held / failed / queued again
    incarnation: int = 0  # the current (latest) incarnation number; 0: never started
    restarts: int = 0  # restarts forced by failures of the job itself (the budget counts these)
    first_started_at: float | None = None
    cancel_requested: bool = False
    updated_at: float = 0.0
    owner: str = ""  # who submitted it (the operator's user name; "" before schema v7)
    version: int = 0  # grows by one at each change of the job's row: plans name the one they saw


def is_slurm_run(job: Job | None) -> bool:
    """True when Slurm runs `job` (`gpuctl submit --backend slurm`; a job's backend decides who
    runs it): gpuctl records its runs and never places, moves, stops, settles, fails over,
    preempts nor drains them. Every such guard asks this."""
    return job is not None and job.spec.backend is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Incarnation:
    job_id: str
    n: int
    node: str
    cards: tuple[int, ...]  # card indexes on the node
    gpu_uuids: tuple[str, ...]
    mib_per_card: int  # the slice (a whole card: its capacity)
    whole: bool
    state: IncarnationState
    started_at: float
    run_dir: str  # on the node: pid file, log file, env
    pid: int | None = None  # the job's process group leader on the node
    ended_at: float | None = None
    exit_code: int | None = None
    end_reason: EndReason | None = None
    resume_step: int | None = None  # the checkpoint step it was started from (None: fresh)
    cpu_milli: int = 0
    host_mem_mib: int = 0
    # the node's clock minus gpuctl's when it was launched (the poll before the launch; None:
    # unknown): the job stamps its checkpoints with the node's clock
    clock_offset_s: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """A committed checkpoint gpuctl knows of (its marker was read and verified)."""

    job_id: str
    incarnation: int
    step: int
    path: str  # on the node (shared storage) or in gpuctl's own checkpoint store (pull)
    committed_at: float  # on gpuctl's clock (the marker's node time, read through the offset)
    location: str  # "shared", a node name, or "store"


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One line of the append-only audit log."""

    at: float
    actor: str  # the operator (user name) or "gpuctl"
    kind: str  # submit, launch, exit, failover, preempt, cancel, fence, over_slice, hold, ...
    message: str
    job_id: str | None = None
    node: str | None = None
    outcome: str | None = None  # ok, failed, ...
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    id: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Cordon:
    node: str
    reason: str
    operator: str
    source: str  # "operator" or "health"
    at: float


@dataclasses.dataclass(frozen=True, slots=True)
class NodeVersion:
    """The version of a node's cordon state: every cordon and uncordon adds one and records who,
    when and why, so a verb planned on an older version is refused and told what changed. A node
    never cordoned is at version 0."""

    node: str
    version: int = 0
    at: float | None = None
    actor: str = ""
    kind: str = ""  # cordon | uncordon
    reason: str = ""

    def changed(self, offset_s: int = 0) -> str:
        """`lab-02 was cordoned by alice at 04:12:00 (reason: fan) since your plan; nothing
        changed`: why a plan made on an older version is refused (`offset_s`: the reader's zone)."""
        done = {"cordon": "cordoned", "uncordon": "uncordoned"}.get(self.kind, "changed")
        why = f" (reason: {self.reason})" if self.reason else ""
        return (
            f"{self.node} was {done} by {self.actor or 'someone'} at {clock(self.at, offset_s)}"
            f"{why} since your plan; nothing changed"
        )


def job_changed(job_id: str, last: Event | None, offset_s: int = 0) -> str:
    """`job j1 was changed by alice at 04:12:00 (cancel: ...) since your plan; nothing changed`:
    why a plan made on an older version of the job is refused (`last`: its newest event)."""
    what = "changed"
    if last is not None:
        what = (
            f"changed by {last.actor} at {clock(last.at, offset_s)} ({last.kind}: {last.message})"
        )
    return f"job {job_id} was {what} since your plan; nothing changed"


@dataclasses.dataclass(frozen=True, slots=True)
class NodeLiveness:
    """When the control loop last heard a node, and since when it has not: `down` after a grace."""

    node: str
    last_ok_at: float | None
    failing_since: float | None
    down: bool = False


# --- what the control loop asks of a node --------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One incarnation to start on a node, with the checkpoint contract's environment.

    `secret_env` values travel on the launch command's stdin, never on a command line, in the
    store or in a log; `repr` hides them.
    """

    job_id: str
    incarnation: int
    argv: tuple[str, ...]
    cuda_visible_devices: str  # e.g. "0,3"
    mib_per_card: int  # GPUCTL_MEM_LIMIT_MIB
    checkpoint_dir: str  # GPUCTL_CHECKPOINT_DIR on the node
    resume_from: str = ""  # GPUCTL_RESUME_FROM: a committed checkpoint path, empty when fresh
    workdir: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    secret_env: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)
    mps_limit_mib: int | None = None  # set CUDA_MPS_PINNED_DEVICE_MEM_LIMIT where MPS runs


@dataclasses.dataclass(frozen=True, slots=True)
class CardClash:
    """A card a recorded run (one Slurm started: `Store.record_run`) took while another holds it
    in the store: `job_id`'s incarnation `n` (None: its reservation). Two owners of one card, a
    finding for an operator, never a reason to keep the record from saying what runs."""

    node: str
    card: int
    job_id: str
    n: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class CommitSeen:
    """What a node's observe saw of a running incarnation's checkpoint dir without reading any
    marker: the step and modification time (the node's clock) of the most recently written
    `COMMITTED` marker; both None when the dir holds none. A hint, never a record: the loop reads
    and verifies the markers (`JobRunner.checkpoints`) only when it changes."""

    step: int | None
    at: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class RunStatus:
    """One incarnation's process as the node sees it. `commit`: its newest committed checkpoint
    as the observe saw it (alive runs whose launch recorded their checkpoint dir); None when not
    looked at."""

    job_id: str
    incarnation: int
    pid: int | None
    alive: bool
    exit_code: int | None  # set once the process ended and its wrapper recorded the status
    run_dir: str
    commit: CommitSeen | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Fenced:
    """What fencing one incarnation on its node found: how many of its processes were alive and
    killed, and how many were still alive when the node stopped waiting for them to die. Only
    `gone` (none left) lets gpuctl record the incarnation as ended and free its cards."""

    killed: int
    remaining: int

    @property
    def gone(self) -> bool:
        return self.remaining == 0


@dataclasses.dataclass(frozen=True, slots=True)
class JobProcess:
    """A live process on a node that carries a job's contract environment (`GPUCTL_JOB_ID`,
    `GPUCTL_INCARNATION`): what really runs there, whatever gpuctl's store says."""

    job_id: str
    incarnation: int
    pid: int


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointMarker:
    """A checkpoint folder as found on a node (or in gpuctl's store): committed when `valid`."""

    path: str
    incarnation: int | None
    step: int | None
    committed_at: float | None
    valid: bool  # marker present, parsable, and every file matches its checksum
    problem: str | None = None  # why not valid: "no marker", "checksum mismatch: model.pt", ...
