"""The fleet check (`gpuctl db check --fleet`): what really runs on the nodes, compared with the
store. The store's own invariants (`gpuctl.ops.invariants`) can only see the store; this reads,
from every node of the inventory, each live process that carries a job's contract environment
(`JobRunner.processes`, found by environment, so a copy whose run dir is gone is found too) and
each card's capacity (one gather), and reports as problems:

- a job with more than one live incarnation on the fleet (or one incarnation live on two nodes);
- a stray run: live processes of an incarnation the store does not have live on that node (a job
  Slurm runs, `gpuctl submit --backend slurm`, is Slurm's to track: never a stray);
- a card holding more than it has (the store's slices against the capacity the node reports),
  with every other store invariant.

A node that cannot be read is listed as such: the check is then partial, never clean by default.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping

from gpuctl.adapters.protocols import JobRunner, Store
from gpuctl.core.jobs.model import IncarnationState, is_slurm_run
from gpuctl.core.model import FleetSnapshot, Inventory, Reach
from gpuctl.errors import TransportError
from gpuctl.ops.invariants import check_invariants

# an incarnation the store expects may have live processes on its node (LOST: until fenced)
MAY_LIVE = frozenset(
    {
        IncarnationState.LAUNCHING,
        IncarnationState.RUNNING,
        IncarnationState.STOPPING,
        IncarnationState.LOST,
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class FleetCheck:
    """What the fleet check found. `live`: (job, incarnation) -> the nodes it runs on."""

    problems: tuple[str, ...]
    unreadable: tuple[str, ...]  # "node: why" for each node that could not be read
    nodes: int
    live: Mapping[tuple[str, int], tuple[str, ...]]

    @property
    def clean(self) -> bool:
        return not self.problems and not self.unreadable

    def to_dict(self) -> dict[str, object]:
        return {
            "clean": self.clean,
            "nodes_checked": self.nodes,
            "problems": list(self.problems),
            "unreadable": list(self.unreadable),
            "live": [
                {"job_id": job, "incarnation": n, "nodes": list(nodes)}
                for (job, n), nodes in sorted(self.live.items())
            ],
        }


def check_fleet(
    store: Store,
    inventory: Inventory,
    runner: JobRunner,
    snapshot: FleetSnapshot | None = None,
) -> FleetCheck:
    """Compare the job processes on every node of `inventory` with the store. `snapshot`: a poll
    of the same nodes, for the capacity each card really has (without one, cards are not
    checked against their capacity)."""
    live: dict[tuple[str, int], set[str]] = defaultdict(set)
    unreadable: list[str] = []
    for spec in sorted(inventory.nodes, key=lambda s: s.name):
        try:
            found = runner.processes(spec)
        except TransportError as exc:
            unreadable.append(f"{spec.name}: {exc.message}")
            continue
        for proc in found:
            live[(proc.job_id, proc.incarnation)].add(spec.name)
    # a job Slurm runs carries the contract's environment too, but no incarnation of gpuctl's
    for job in store.jobs():
        if is_slurm_run(job):
            for key in [k for k in live if k[0] == job.id]:
                del live[key]
    problems = _run_problems(store, live)
    capacity: dict[tuple[str, int], int] = {}
    if snapshot is not None:
        for node in snapshot.nodes:
            if node.reach is Reach.OK and node.observation is not None:
                for gpu in node.observation.gpus:
                    if gpu.mem_total_mib is not None:
                        capacity[(node.name, gpu.index)] = gpu.mem_total_mib
    problems += check_invariants(store, capacity_mib=capacity or None)
    return FleetCheck(
        problems=tuple(problems),
        unreadable=tuple(unreadable),
        nodes=len(inventory.nodes),
        live={k: tuple(sorted(v)) for k, v in sorted(live.items())},
    )


def _run_problems(store: Store, live: Mapping[tuple[str, int], set[str]]) -> list[str]:
    expected = {(i.job_id, i.n): i for i in store.incarnations(holding=True) if i.state in MAY_LIVE}
    by_job: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for (job, n), nodes in live.items():
        by_job[job] += [(n, node) for node in sorted(nodes)]
    out: list[str] = []
    for job, runs in sorted(by_job.items()):
        if len(runs) > 1:
            where = ", ".join(f"incarnation {n} on {node}" for n, node in sorted(runs))
            lost = sorted(
                n
                for n, _ in runs
                if (inc := expected.get((job, n))) and inc.state is IncarnationState.LOST
            )
            note = f" (lost, fenced when the loop next reaches its node: {lost})" if lost else ""
            out.append(f"job {job}: {len(runs)} live copies: {where}{note}")
    for (job, n), nodes in sorted(live.items()):
        inc = expected.get((job, n))
        for node in sorted(nodes):
            if inc is None or inc.node != node:
                known = (
                    f"the store has no live incarnation {n}"
                    if inc is None
                    else f"the store has it on {inc.node}"
                )
                out.append(
                    f"stray run on {node}: incarnation {n} of job {job} is live there; {known}"
                )
    return out
