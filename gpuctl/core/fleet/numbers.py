"""The five numbers as one frozen value: utilization % with its band, fragmentation % (and the
stranded memory), observed SM use beside them, and the job figures (queue wait, checkpoint age,
failover success, preemption rate: `core.jobs.figures`).

`gpuctl status`, the dashboard, metrics and the report read its fields; `to_dict` is the
`numbers` document of `gpuctl status -o json` and the names playbook conditions use. Pure.

Definitions (docs/design.md):

- **Utilization %**: allocated GPU memory / total GPU memory of healthy cards on schedulable
  nodes, with its band (`core.band`).
- **Fragmentation %**: the share of free GPU memory on schedulable nodes the target workload
  (`core.fleet.workload`) cannot use: stranded / free × 100 (None when nothing is free); stranded
  memory also in GiB.
- **Observed SM utilization**: NVML `utilization.gpu` averaged over the GPUs that answered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuctl.core.band import TARGET_BAND, Band, BandName
from gpuctl.core.consolidation import fleet_figures
from gpuctl.core.jobs.figures import JobFigures, job_figures
from gpuctl.core.model import FleetSnapshot, Reach
from gpuctl.core.placement.fit import Workload
from gpuctl.core.placement.fragmentation import WorkloadIndex
from gpuctl.core.placement.model import FleetState

# the numbers a poll is needed for, in `to_dict` order (None in metrics' --from-store mode)
FLEET_KEYS = (
    "utilization_pct",
    "band",
    "allocated_mib",
    "capacity_mib",
    "observed_util_pct",
    "fragmentation_pct",
    "stranded_gib",
)


@dataclasses.dataclass(frozen=True, slots=True)
class FleetNumbers:
    """Percentages are 0-100 rounded to 2 decimals; None where a number is undefined."""

    utilization_pct: float | None
    band: BandName | None
    allocated_mib: int | None
    capacity_mib: int | None
    observed_util_pct: float | None
    fragmentation_pct: float | None
    stranded_gib: float | None
    jobs: JobFigures

    def to_dict(self) -> dict[str, Any]:
        """The flat document (`numbers` of `gpuctl status -o json`): the fleet's figures, then
        the job figures."""
        return {
            "utilization_pct": self.utilization_pct,
            "band": None if self.band is None else self.band.value,
            "allocated_mib": self.allocated_mib,
            "capacity_mib": self.capacity_mib,
            "observed_util_pct": self.observed_util_pct,
            "fragmentation_pct": self.fragmentation_pct,
            "stranded_gib": self.stranded_gib,
            **self.jobs.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FleetNumbers:
        """Inverse of `to_dict`."""
        band = d["band"]
        return cls(
            utilization_pct=d["utilization_pct"],
            band=None if band is None else BandName(band),
            allocated_mib=d["allocated_mib"],
            capacity_mib=d["capacity_mib"],
            observed_util_pct=d["observed_util_pct"],
            fragmentation_pct=d["fragmentation_pct"],
            stranded_gib=d["stranded_gib"],
            jobs=JobFigures.from_dict(d),
        )

    def without_poll(self) -> FleetNumbers:
        """The job figures alone: every number a poll is needed for is None."""
        return FleetNumbers(None, None, None, None, None, None, None, self.jobs)


def no_jobs(now: float = 0.0) -> JobFigures:
    """The job figures of a fleet without a state store: nothing to measure."""
    return job_figures((), (), {}, now)


def observed_util_pct(snapshot: FleetSnapshot) -> float | None:
    """Mean SM utilization (NVML `utilization.gpu`) over the GPUs that answered."""
    values = [
        g.util_pct
        for n in snapshot.nodes
        if n.reach is Reach.OK
        for g in n.gpus
        if g.util_pct is not None
    ]
    return None if not values else sum(values) / len(values)


def fragmentation(
    state: FleetState, workload: Workload | WorkloadIndex
) -> tuple[float | None, float]:
    """Fragmentation % (stranded / free × 100 over schedulable nodes; None when nothing is
    free) and the stranded GiB, against `workload`, each rounded to 2 decimals."""
    figures = fleet_figures(state, workload)
    pct = figures.fragmentation_pct
    return (None if pct is None else round(pct, 2)), round(figures.stranded_gib, 2)


def fleet_numbers(
    snapshot: FleetSnapshot,
    state: FleetState,
    workload: Workload | WorkloadIndex,
    jobs: JobFigures,
    band: Band = TARGET_BAND,
) -> FleetNumbers:
    """The five numbers of `state` (the fleet view of `snapshot`) against the target
    `workload`, with the job figures `jobs`."""
    utilization = state.utilization()
    frag, stranded = fragmentation(state, workload)
    return FleetNumbers(
        utilization_pct=None if utilization is None else round(100.0 * utilization, 2),
        band=band.of(utilization),
        allocated_mib=state.allocated_mib(),
        capacity_mib=state.capacity_mib(),
        observed_util_pct=observed_util_pct(snapshot),
        fragmentation_pct=frag,
        stranded_gib=stranded,
        jobs=jobs,
    )
