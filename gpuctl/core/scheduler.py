"""A workload manager's view of the fleet (Slurm): its nodes with their state, and its running
jobs with the cards they hold. Pure values, read once per poll by `gpuctl.adapters.slurm` and
carried in the `FleetSnapshot`, so `status`, `nodes`, `place`, the dashboard and
metrics all count the same Slurm jobs and show the same Slurm drains.

Slurm's node state is a base (IDLE, MIXED, ALLOCATED, COMPLETING, DOWN, FUTURE, UNKNOWN...) and
flags (DRAIN, FAIL, NOT_RESPONDING, MAINTENANCE, REBOOT_REQUESTED...), kept as Slurm spells them,
upper case. Times are epoch seconds, `None` when Slurm left them unset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

SLURM = "slurm"  # the owner of the allocations and cordons that come from Slurm

# Flags after which no new work lands on a node (Slurm's own scheduler does the same).
UNAVAILABLE_FLAGS = frozenset({"DRAIN", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED"})
DOWN_STATES = frozenset({"DOWN", "FUTURE"})  # base states: the node takes no work at all
BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})  # with DRAIN: still draining


@dataclasses.dataclass(frozen=True, slots=True)
class SchedNode:
    """One Slurm node: state, why it was set, by whom and when; GRES, partitions, features."""

    name: str
    state: str = "UNKNOWN"  # base state
    flags: tuple[str, ...] = ()
    reason: str | None = None
    reason_by: str | None = None
    reason_at: float | None = None
    address: str | None = None  # NodeAddr
    hostname: str | None = None  # NodeHostName
    gres: str | None = None  # gpu:h100:4
    partitions: tuple[str, ...] = ()
    features: tuple[str, ...] = ()

    @property
    def state_text(self) -> str:
        """`IDLE+DRAIN`, as `sinfo -o %T` writes it."""
        return "+".join((self.state, *self.flags))

    @property
    def drained(self) -> bool:
        """No new work: a DRAIN (or FAIL, maintenance, reboot) flag."""
        return bool(UNAVAILABLE_FLAGS.intersection(self.flags))

    @property
    def down(self) -> bool:
        return self.state in DOWN_STATES or "NOT_RESPONDING" in self.flags

    @property
    def draining(self) -> bool:
        """Drained but still running work (Slurm's DRAINING, not yet DRAINED)."""
        return self.drained and self.state in BUSY_STATES


@dataclasses.dataclass(frozen=True, slots=True)
class SchedJob:
    """One running Slurm job on one node: the GPU indexes it holds there."""

    job_id: str
    node: str
    cards: tuple[int, ...]
    user: str | None = None
    name: str | None = None
    state: str = "RUNNING"
    restarts: int = 0  # Slurm's restart count (a requeue adds one)
    started_at: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SchedQueued:
    """One job Slurm lists that holds no cards here: waiting (PENDING, REQUEUED...), running
    without GPUs, or ended and not yet forgotten. The control loop follows gpuctl's own Slurm
    jobs through these and `SchedJob` (`ops.loop._slurm`)."""

    job_id: str
    state: str
    reason: str | None = None
    restarts: int = 0
    nodes: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulerView:
    """What one read of the workload manager returned. `error`: it could not be read at all
    (then nodes and jobs are empty); `notes`: fields it could not read, one line each."""

    kind: str = SLURM
    cluster: str | None = None
    version: str | None = None
    taken_at: float | None = None
    nodes: tuple[SchedNode, ...] = ()
    jobs: tuple[SchedJob, ...] = ()
    notes: tuple[str, ...] = ()
    error: str | None = None
    # the other jobs squeue lists that gpuctl submitted (the loop follows them), and how many
    # more it lists (neither holding cards here nor gpuctl's: counted, not kept)
    queue: tuple[SchedQueued, ...] = ()
    queue_others: int = 0

    def node(self, name: str) -> SchedNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cluster": self.cluster,
            "version": self.version,
            "taken_at": self.taken_at,
            "nodes": [_node_dict(n) for n in self.nodes],
            "jobs": [_job_dict(j) for j in self.jobs],
            "notes": list(self.notes),
            "error": self.error,
            "queue": [dataclasses.asdict(q) for q in self.queue],
            "queue_others": self.queue_others,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SchedulerView:
        """Inverse of `to_dict`. Raises KeyError/TypeError/ValueError on malformed input."""
        return cls(
            kind=str(d.get("kind", SLURM)),
            cluster=d.get("cluster"),
            version=d.get("version"),
            taken_at=d.get("taken_at"),
            nodes=tuple(
                SchedNode(
                    name=str(n["name"]),
                    state=str(n.get("state", "UNKNOWN")),
                    flags=tuple(str(f) for f in n.get("flags") or ()),
                    reason=n.get("reason"),
                    reason_by=n.get("reason_by"),
                    reason_at=n.get("reason_at"),
                    address=n.get("address"),
                    hostname=n.get("hostname"),
                    gres=n.get("gres"),
                    partitions=tuple(str(p) for p in n.get("partitions") or ()),
                    features=tuple(str(f) for f in n.get("features") or ()),
                )
                for n in d.get("nodes") or ()
            ),
            jobs=tuple(
                SchedJob(
                    job_id=str(j["job_id"]),
                    node=str(j["node"]),
                    cards=tuple(int(i) for i in j.get("cards") or ()),
                    user=j.get("user"),
                    name=j.get("name"),
                    state=str(j.get("state", "RUNNING")),
                    restarts=int(j.get("restarts") or 0),
                    started_at=j.get("started_at"),
                )
                for j in d.get("jobs") or ()
            ),
            notes=tuple(str(s) for s in d.get("notes") or ()),
            error=d.get("error"),
            queue=tuple(
                SchedQueued(
                    job_id=str(q["job_id"]),
                    state=str(q["state"]),
                    reason=q.get("reason"),
                    restarts=int(q.get("restarts") or 0),
                    nodes=q.get("nodes"),
                )
                for q in d.get("queue") or ()
            ),
            queue_others=int(d.get("queue_others") or 0),
        )


def _node_dict(n: SchedNode) -> dict[str, Any]:
    return {
        "name": n.name,
        "state": n.state,
        "flags": list(n.flags),
        "reason": n.reason,
        "reason_by": n.reason_by,
        "reason_at": n.reason_at,
        "address": n.address,
        "hostname": n.hostname,
        "gres": n.gres,
        "partitions": list(n.partitions),
        "features": list(n.features),
    }


def _job_dict(j: SchedJob) -> dict[str, Any]:
    return {
        "job_id": j.job_id,
        "node": j.node,
        "cards": list(j.cards),
        "user": j.user,
        "name": j.name,
        "state": j.state,
        "restarts": j.restarts,
        "started_at": j.started_at,
    }
