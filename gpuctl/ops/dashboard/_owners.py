"""Whose is each process on a node's GPUs: the job (and incarnation) gpuctl started it for, or
not gpuctl's. The node screen asks for one node at a time.

The probe lists the GPUs' processes by pid; the job runner lists the node's live processes that
carry a job's contract environment (`JobRunner.processes`, as `gpuctl db check --fleet` reads
them: a job's children are found too, whatever their pid); the store says which incarnations it
has live on the node. A GPU process in that listing is its job's (a `stray` when the store does
not have that incarnation live there); one outside it is not gpuctl's. Without a listing
(offline review, or the node did not answer it) only the store's own pids (each incarnation's
process group leader) are named, and the rest are unknown, never called not gpuctl's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from gpuctl.adapters.protocols import JobRunner
from gpuctl.core.jobs.model import Incarnation, JobProcess
from gpuctl.core.model import Inventory
from gpuctl.errors import GpuctlError, StateError
from gpuctl.ops.stores import SessionStore

NOT_GPUCTL = "not gpuctl's"
UNKNOWN = "?"


class ProcessLister(Protocol):
    """The live job processes of one node (`JobRunner.processes`); raises `GpuctlError` when
    the node cannot be read."""

    def on(self, node: str) -> Sequence[JobProcess]: ...


class RemoteProcesses:
    """`JobRunner.processes` over the dashboard's runner, one exec on the node."""

    def __init__(self, runner: JobRunner, inventory: Inventory) -> None:
        self.runner = runner
        self.inventory = inventory

    def on(self, node: str) -> Sequence[JobProcess]:
        spec = self.inventory.by_name().get(node)
        if spec is None:
            raise GpuctlError(f"{node} is not in the inventory")
        return self.runner.processes(spec)


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessOwners:
    """`owners`: pid -> whose it is (`job ID #N`, `job ID #N (stray)`, `job ID #N (Slurm job
    42)`, NOT_GPUCTL, UNKNOWN);
    `note`: why the node's job processes could not be listed (None: they were)."""

    node: str
    pids: frozenset[int]
    owners: Mapping[int, str]
    note: str | None = None


def owners_of(
    node: str,
    pids: Iterable[int],
    listed: Sequence[JobProcess] | None,
    live: Sequence[Incarnation],
    slurm: Mapping[str, str] | None = None,
) -> dict[int, str]:
    """Pure: whose each of `pids` (the GPU processes the probe saw on `node`) is, from the job
    processes `listed` there (None: not read) and the incarnations the store has `live`.
    `slurm`: the Slurm job id of each job Slurm runs (gpuctl job id -> it): their processes
    are named by it (`job ID #N (Slurm job 42)`), Slurm's to run, never a stray."""
    slurm = slurm or {}
    here = {(i.job_id, i.n) for i in live if i.node == node}
    leaders = {i.pid: (i.job_id, i.n) for i in live if i.node == node and i.pid is not None}
    jobs = {p.pid: (p.job_id, p.incarnation) for p in listed or ()}
    out: dict[int, str] = {}
    for pid in pids:
        found = jobs.get(pid) if listed is not None else leaders.get(pid)
        if found is None:
            out[pid] = NOT_GPUCTL if listed is not None else UNKNOWN
            continue
        job, n = found
        if job in slurm:
            out[pid] = f"job {job} #{n} (Slurm job {slurm[job]})"
            continue
        out[pid] = f"job {job} #{n}" + ("" if found in here else " (stray)")
    return out


def read_owners(
    open_store: SessionStore, lister: ProcessLister | None, node: str, pids: Iterable[int]
) -> ProcessOwners:
    """In a worker: list the node's job processes (one exec) and match `pids` to them."""
    wanted = frozenset(pids)
    try:
        with open_store(False) as store:
            live = store.incarnations(node=node, holding=True)
            slurm = {j.id: j.spec.backend.id for j in store.jobs() if j.spec.backend is not None}
    except StateError:
        live, slurm = [], {}
    listed: Sequence[JobProcess] | None = None
    note = None
    if lister is None:
        note = "no job process listing (offline review)"
    else:
        try:
            listed = lister.on(node)
        except GpuctlError as exc:
            note = f"job processes unreadable: {exc.message}"
    return ProcessOwners(node, wanted, owners_of(node, wanted, listed, live, slurm), note)
