"""The FGD paper's evaluation protocol (see docs/benchmark-placement.md and the protocol spec):
arrival order, the 1.3 "tune", the seeded node priority, and the target workload."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from gpuctl.bench.openb import MILLI_PER_GPU, OpenbNode, OpenbPod
from gpuctl.bench.rng import Rng
from gpuctl.core.placement.fit import Demand, NodeFree, Workload
from gpuctl.core.placement.fragmentation import workload_from_counts

CPU_SCALE_MILLI = 128_000  # the artifact's MaxSpecCpu (BestFit's CPU normaliser)
GPU_SCALE_MILLI = 8_000  # the artifact's MaxSpecGpu
BACKGROUND_DRAWS = 10  # the scheduler's informers draw this many before the node permutation


def pod_models(pod: OpenbPod) -> tuple[str, ...]:
    return tuple(m for m in pod.gpu_spec.split("|") if m)


def pod_demand(pod: OpenbPod, *, with_memory: bool = True) -> Demand:
    """One pod as a per-node demand; a pod of 1000 milli per GPU takes whole GPUs."""
    return Demand(
        gpus=pod.num_gpu,
        mib_per_card=pod.gpu_milli,
        whole=pod.num_gpu > 0 and pod.gpu_milli >= MILLI_PER_GPU,
        cpu_milli=pod.cpu_milli,
        mem_mib=pod.memory_mib if with_memory else 0,
        gpu_models=pod_models(pod),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """How a policy's target workload is drawn from the original trace."""

    coverage_pct: int = 95  # keep the most frequent shapes that cover this % of pods
    with_memory: bool = False  # a shape includes the pod's host memory


PAPER_WORKLOAD = WorkloadSpec()  # the FGD artifact's "typical pods"
FULL_WORKLOAD = WorkloadSpec(coverage_pct=100, with_memory=True)  # every shape, as observed


def target_workload(pods: Sequence[OpenbPod], spec: WorkloadSpec = PAPER_WORKLOAD) -> Workload:
    """The target workload of the original trace: shapes by count, the top `coverage_pct` %.
    The paper's shapes leave host memory out."""
    counts = Counter(pod_demand(p, with_memory=spec.with_memory) for p in pods)
    return workload_from_counts(counts.items(), coverage_pct=spec.coverage_pct)


def gpu_capacity_milli(nodes: Sequence[OpenbNode]) -> int:
    return sum(n.gpus for n in nodes) * MILLI_PER_GPU


def arrival_sequence(pods: Sequence[OpenbPod], rng: Rng, target_milli: int) -> tuple[OpenbPod, ...]:
    """Pods sorted by name and shuffled, then tuned to `target_milli` of total GPU request:
    clones drawn with replacement are appended (tune up), or random pods removed (tune down)."""
    by_name = sorted(pods, key=lambda p: p.name)
    rng.discard(1)
    shuffled = list(by_name)
    rng.shuffle(shuffled)
    total = sum(p.gpu_request_milli for p in shuffled)
    if total < target_milli:
        clones: list[OpenbPod] = []
        while True:
            pod = by_name[rng.intn(len(by_name))]
            # The artifact compares with the per-GPU milli, and stops at the first overshoot.
            if total + pod.gpu_milli > target_milli:
                break
            clones.append(_clone(pod, len(clones)))
            total += pod.gpu_request_milli
        return (*shuffled, *clones)
    while total > target_milli and shuffled:
        pod = shuffled.pop(rng.intn(len(shuffled)))
        total -= pod.gpu_request_milli
    return tuple(shuffled)


def _clone(pod: OpenbPod, i: int) -> OpenbPod:
    return OpenbPod(
        name=f"{pod.name}-tuned-{i}",
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        num_gpu=pod.num_gpu,
        gpu_milli=pod.gpu_milli,
        gpu_spec=pod.gpu_spec,
    )


def node_priority(nodes: Sequence[OpenbNode], rng: Rng) -> dict[str, int]:
    """The seeded tie-break order: rank per node name (0 wins ties)."""
    rng.discard(BACKGROUND_DRAWS)
    by_name = sorted(n.name for n in nodes)
    perm = rng.perm(len(by_name))
    return {name: perm[i] for i, name in enumerate(by_name)}


def node_free(node: OpenbNode) -> NodeFree:
    """A fresh node as the policies see it."""
    return NodeFree(
        name="",
        free=(MILLI_PER_GPU,) * node.gpus,
        capacity=(MILLI_PER_GPU,) * node.gpus,
        cpu_free_milli=node.cpu_milli,
        mem_free_mib=node.memory_mib,
        gpu_model=node.model,
        cpu_milli=node.cpu_milli,
        mem_mib=node.memory_mib,
    )
