"""What Slurm's view of the fleet (`core.scheduler.SchedulerView`) means for gpuctl's: its running
jobs hold cards (allocations owned by Slurm, whole cards: Slurm gives a GPU GRES whole), its
drains are cordons (reason, who set it and when, source `slurm`) and its DOWN nodes are down;
and the `sbatch` options that hand a placement to Slurm (`sbatch_options`). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gpuctl.core.fleet.nodestate import NodeStatus
from gpuctl.core.jobs.model import Cordon
from gpuctl.core.model import NodeState
from gpuctl.core.placement.model import Allocation, JobShape
from gpuctl.core.placement.plan import Placed
from gpuctl.core.scheduler import SLURM, SchedJob, SchedNode, SchedulerView

JOB_PREFIX = "slurm:"  # a Slurm job's allocation key: slurm:<job id>


def job_key(job: SchedJob) -> str:
    return f"{JOB_PREFIX}{job.job_id}"


def allocations(view: SchedulerView | None) -> tuple[Allocation, ...]:
    """One allocation per running Slurm job and node holding cards, owned by Slurm."""
    if view is None:
        return ()
    return tuple(
        Allocation(job_key(j), j.node, j.cards, 0, whole=True, owner=SLURM)
        for j in view.jobs
        if j.cards
    )


def cordons(view: SchedulerView | None) -> dict[str, Cordon]:
    """Slurm's drained nodes as cordons: the reason Slurm holds (or its state), who set it
    (`slurm` when Slurm does not say) and when (0: unknown)."""
    if view is None:
        return {}
    out = {}
    for n in view.nodes:
        if n.drained or n.down:
            reason = f"Slurm {n.state_text}" + (f": {n.reason}" if n.reason else "")
            out[n.name] = Cordon(n.name, reason, n.reason_by or SLURM, SLURM, n.reason_at or 0.0)
    return out


def draining(view: SchedulerView | None) -> frozenset[str]:
    """The nodes Slurm drains while they still run jobs (DRAINING, not yet DRAINED)."""
    if view is None:
        return frozenset()
    return frozenset(n.name for n in view.nodes if n.draining)


def with_slurm(
    statuses: Mapping[str, NodeStatus], view: SchedulerView | None
) -> dict[str, NodeStatus]:
    """`statuses` with Slurm's word where gpuctl has none: a node that answered and that gpuctl
    did not cordon is `down` when Slurm has it DOWN, `draining` or `cordoned` when Slurm drains
    it, with Slurm's reason, who and when. gpuctl's own cordon and an unanswered poll win."""
    out = dict(statuses)
    if view is None:
        return out
    slurm_cordons = cordons(view)
    busy = draining(view)
    for name, status in statuses.items():
        cordon = slurm_cordons.get(name)
        if cordon is None or status.cordon is not None or status.state is NodeState.DOWN:
            continue
        node = view.node(name)
        if node is not None and node.down:
            state = NodeState.DOWN
        else:
            state = NodeState.DRAINING if name in busy else NodeState.CORDONED
        out[name] = dataclasses.replace(
            status,
            state=state,
            reason=cordon.reason,
            by=cordon.operator,
            source=SLURM,
            since=cordon.at or None,
            cordon=cordon,
        )
    return out


# --- handing a placement to Slurm ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SbatchOptions:
    """The `sbatch` options that put one placed job where gpuctl placed it. Slurm pins the node,
    the GPU count and type, host memory and CPUs; it picks the card indexes itself (a job
    cannot ask for given indexes), so `cards` are what gpuctl planned, for the job to check
    against `SLURM_JOB_GPUS` at start."""

    job: str
    node: str
    cards: tuple[int, ...]
    options: tuple[str, ...]

    def script_lines(self) -> list[str]:
        """As the head of a batch script: `#SBATCH` lines, then what is not pinned."""
        planned = ",".join(map(str, self.cards)) or "none"
        return [
            *(f"#SBATCH {o}" for o in self.options),
            f"# gpuctl placed {self.job} on {self.node}, cards {planned}: Slurm pins the node "
            "and the GPU count and type; it picks the card indexes itself (SLURM_JOB_GPUS)",
        ]

    def to_dict(self) -> dict[str, object]:
        return {
            "job": self.job,
            "node": self.node,
            "cards": list(self.cards),
            "options": list(self.options),
        }


def gres_type(node: SchedNode | None) -> str | None:
    """The GPU type of a node's GRES (`gpu:h100:4(S:0-1)` -> `h100`); None: untyped or none."""
    if node is None or not node.gres:
        return None
    for part in node.gres.split(","):
        fields = part.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) == 3 and not fields[1].isdigit():
            return fields[1]
    return None


def sbatch_options(placed: Placed, shape: JobShape, node: SchedNode | None) -> SbatchOptions:
    """`--job-name`, `--nodelist` (one node, one task), `--gres=gpu[:type]:N` with the type of
    the node's GRES, `--cpus-per-task` (CPUs rounded up) and `--mem` when the job asks them."""
    options = [
        f"--job-name={placed.job}",
        f"--nodelist={placed.node}",
        "--nodes=1",
        "--ntasks=1",
    ]
    gpus = len(placed.cards)
    if gpus:
        kind = gres_type(node)
        options.append(f"--gres=gpu:{kind}:{gpus}" if kind else f"--gres=gpu:{gpus}")
    if shape.cpu_milli:
        options.append(f"--cpus-per-task={-(-shape.cpu_milli // 1000)}")
    if shape.host_mem_mib:
        options.append(f"--mem={shape.host_mem_mib}M")
    return SbatchOptions(placed.job, placed.node, placed.cards, tuple(options))
