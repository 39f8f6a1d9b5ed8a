"""What the metrics exposition holds: the reading of one refresh, every metric's name and HELP
text, and the families built from a reading. Pure: a `Reading` in, Prometheus metric families out.

Names follow Prometheus conventions: base units (`_bytes`, `_seconds`, `_celsius`), ratios 0-1
(`_ratio`), counters `_total`, a `quantile` label only on a summary (`promtool check metrics` passes
every exposition). A figure that is undefined (`None`: nothing to measure) has no sample, never a 0
in its place. `docs/metrics.md` describes each metric.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gpuctl.core.band import TARGET_BAND, BandName
from gpuctl.core.fleet.nodestate import NODE_STATES
from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.health import Verdict
from gpuctl.ops.metrics._text import GpuReading, JobReading, gpu_text, job_text
from gpuctl.ops.metrics._write import escape, flag, header, labelled, verdict_columns

MIB = float(1 << 20)
GIB = float(1 << 30)
PCT = 0.01

# event kind -> the counter it feeds (counted over the whole audit log, which only grows)
COUNTED_EVENTS = {
    "failover": (
        "gpuctl_failovers",
        "Failovers recorded by the control loop (incarnations lost "
        "with their node and requeued), from the store's audit log.",
    ),
    "preempt": (
        "gpuctl_preemptions",
        "Spot-tier preemptions (SIGTERM to make room for standard "
        "work or failover), from the store's audit log.",
    ),
    "drain": ("gpuctl_drains", "Node drains, from the store's audit log."),
}

# the queue-wait histogram's upper bounds, seconds: from a second to a week
QUEUE_WAIT_BUCKETS: tuple[float, ...] = (
    1, 5, 15, 30, 60, 300, 900, 1800, 3600, 7200, 21600, 43200, 86400, 172800, 604800,
)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Figure:
    """One sample of a fleet gauge: `value(numbers) × scale`, with fixed labels."""

    value: Callable[[FleetNumbers], float | None]
    scale: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()


# (metric name, HELP, the figures it shows); a figure that is None (undefined) has no sample
NUMBER_GAUGES: tuple[tuple[str, str, tuple[Figure, ...]], ...] = (
    (
        "gpuctl_utilization_ratio",
        "Allocated GPU memory / total GPU memory of schedulable nodes (the band metric, 0-1).",
        (Figure(lambda n: n.utilization_pct, PCT),),
    ),
    (
        "gpuctl_memory_allocated_bytes",
        "GPU memory gpuctl granted on schedulable nodes.",
        (Figure(lambda n: n.allocated_mib, MIB),),
    ),
    (
        "gpuctl_memory_capacity_bytes",
        "GPU memory of healthy cards on schedulable nodes.",
        (Figure(lambda n: n.capacity_mib, MIB),),
    ),
    (
        "gpuctl_observed_utilization_ratio",
        "Mean SM utilization NVML reports over the GPUs that answered (0-1).",
        (Figure(lambda n: n.observed_util_pct, PCT),),
    ),
    (
        "gpuctl_fragmentation_ratio",
        "Share of free GPU memory the expected workload cannot use (stranded / free, 0-1).",
        (Figure(lambda n: n.fragmentation_pct, PCT),),
    ),
    (
        "gpuctl_stranded_memory_bytes",
        "Free GPU memory the expected workload cannot use.",
        (Figure(lambda n: n.stranded_gib, GIB),),
    ),
    (
        "gpuctl_queue_wait_p50_seconds",
        "Submit to first start of the jobs that first started in the window, p50 (nearest rank).",
        (Figure(lambda n: n.jobs.queue_wait_p50_s),),
    ),
    (
        "gpuctl_queue_wait_p95_seconds",
        "Submit to first start of the jobs that first started in the window, p95 (nearest rank).",
        (Figure(lambda n: n.jobs.queue_wait_p95_s),),
    ),
    (
        "gpuctl_queue_waiting_jobs",
        "Jobs queued that never started.",
        (Figure(lambda n: n.jobs.queue_waiting),),
    ),
    (
        "gpuctl_queue_oldest_wait_seconds",
        "How long the oldest never-started queued job has waited.",
        (Figure(lambda n: n.jobs.queue_oldest_wait_s),),
    ),
    (
        "gpuctl_running_jobs",
        "Jobs running now.",
        (Figure(lambda n: n.jobs.checkpoint_running_jobs),),
    ),
    (
        "gpuctl_checkpoint_age_seconds",
        "Now minus the newest committed checkpoint over running "
        "jobs (a job without one counts from its first start), max and p95.",
        (
            Figure(lambda n: n.jobs.checkpoint_age_max_s, labels=(("stat", "max"),)),
            Figure(lambda n: n.jobs.checkpoint_age_p95_s, labels=(("stat", "p95"),)),
        ),
    ),
    (
        "gpuctl_checkpoint_missing_jobs",
        "Running jobs without a committed checkpoint yet.",
        (Figure(lambda n: n.jobs.checkpoint_missing),),
    ),
    (
        "gpuctl_failover_success_ratio",
        "Failovers in the window whose job ran again within its "
        "restart budget / failovers decided (0-1).",
        (Figure(lambda n: n.jobs.failover_success_pct, PCT),),
    ),
    (
        "gpuctl_failovers_pending",
        "Failovers in the window still inside their restart budget.",
        (Figure(lambda n: n.jobs.failovers_pending),),
    ),
    (
        "gpuctl_preemptions_per_hour",
        "Spot-tier preemptions per hour over the window.",
        (Figure(lambda n: n.jobs.preemptions_per_hour),),
    ),
    (
        "gpuctl_spot_preempted_ratio",
        "Share of the spot jobs that ran in the window that were preempted at least once (0-1).",
        (Figure(lambda n: n.jobs.spot_preempted_pct, PCT),),
    ),
    (
        "gpuctl_numbers_window_seconds",
        "The window the job figures are measured over.",
        (Figure(lambda n: n.jobs.window_s),),
    ),
)
BANDS = tuple(b.value for b in BandName)

# --- the reading ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class NodeReading:
    name: str
    up: bool | None  # answered the poll (from the store: not down); None: unknown
    schedulable: bool | None
    verdict: Verdict | None  # None: not judged (--from-store)
    state: str | None = None  # `core.fleet.nodestate` (None: not polled, --from-store)


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    """What one refresh saw. `counters`, `queue_waits` and `jobs` are None when the store could
    not be read; `queue_waits`: submit to first start of every job of the store that ever
    started; `jobs`: the live ones (queued, running, held)."""

    taken_at: float
    duration_s: float
    source: str  # "gather" or "store"
    numbers: FleetNumbers | None  # None: neither a poll nor the store could be read
    nodes: tuple[NodeReading, ...] = ()
    gpus: tuple[GpuReading, ...] = ()
    counters: Mapping[str, int] | None = None
    store_error: str | None = None
    queue_waits: tuple[float, ...] | None = None
    jobs: tuple[JobReading, ...] | None = None


# --- the exposition ------------------------------------------------------------------------------


def series(reading: Reading | None) -> list[bytes]:
    """The per-node, per-GPU and per-job families of `reading`, pieces of exposition text (`_text`:
    too many samples on a large fleet for prometheus_client's generator)."""
    out: list[bytes] = []
    if reading is not None:
        _node_text(reading.nodes, out)
        gpu_text(reading.gpus, out)
        if reading.jobs is not None:
            job_text(reading.jobs, out)
    return out


def families(reading: Reading | None) -> list[Metric]:
    """The fleet, counter and exporter families of `reading` (none before the first refresh);
    the per-node, per-GPU and per-job ones are `series`."""
    if reading is None:
        return []
    out: list[Metric] = [*_number_families(reading.numbers)] if reading.numbers else []
    if reading.counters is not None:
        for kind, (name, help_text) in COUNTED_EVENTS.items():
            counter = CounterMetricFamily(name, help_text)
            counter.add_metric([], float(reading.counters.get(kind, 0)))
            out.append(counter)
    if reading.queue_waits is not None:
        out.append(queue_wait_histogram(reading.queue_waits))
    meta = [
        (
            "gpuctl_refresh_timestamp_seconds",
            "When the values were read (Unix time).",
            reading.taken_at,
        ),
        (
            "gpuctl_refresh_duration_seconds",
            "How long the last refresh (poll and store read) took.",
            reading.duration_s,
        ),
        (
            "gpuctl_store_readable",
            "1 when the last refresh could read the state store.",
            0.0 if reading.store_error else 1.0,
        ),
    ]
    for name, help_text, value in meta:
        out.append(GaugeMetricFamily(name, help_text, value=value))
    return out


def queue_wait_histogram(waits: Sequence[float]) -> HistogramMetricFamily:
    """`gpuctl_queue_wait_seconds`: a cumulative histogram of `waits` over `QUEUE_WAIT_BUCKETS`."""
    ordered = sorted(waits)
    buckets = [
        (str(float(bound)), float(bisect.bisect_right(ordered, bound)))
        for bound in QUEUE_WAIT_BUCKETS
    ]
    buckets.append(("+Inf", float(len(waits))))
    return HistogramMetricFamily(
        "gpuctl_queue_wait_seconds",
        "Submit to first start of every job the store holds that ever started (since the store "
        "began).",
        buckets=buckets,
        sum_value=float(sum(waits)),
    )


def _number_families(numbers: FleetNumbers) -> Iterator[Metric]:
    for name, help_text, figures in NUMBER_GAUGES:
        labels = [k for k, _ in figures[0].labels]
        family = GaugeMetricFamily(name, help_text, labels=labels)
        for f in figures:
            value = f.value(numbers)
            if value is not None:
                family.add_metric([v for _, v in f.labels], float(value) * f.scale)
        yield family
    band = GaugeMetricFamily(
        "gpuctl_utilization_band",
        f"1 for the band utilization is in: {TARGET_BAND.legend()}.",
        labels=["band"],
    )
    if numbers.band is not None:
        for b in BANDS:
            band.add_metric([b], 1.0 if numbers.band == b else 0.0)
    yield band


def _node_text(nodes: Sequence[NodeReading], out: list[bytes]) -> None:
    """The per-node families, as text (`_text`): a large fleet has thousands of these samples."""
    bases = [f'node="{escape(n.name)}"' for n in nodes]
    header(
        "gpuctl_node_up",
        "1 when the node answered the last poll "
        "(--from-store: when the control loop does not hold it down).",
        "gauge",
        out,
    )
    labelled("gpuctl_node_up", bases, [flag(n.up) for n in nodes], out)
    header(
        "gpuctl_node_schedulable",
        "1 when placement may put new work on the node (answered, readable, not cordoned).",
        "gauge",
        out,
    )
    labelled("gpuctl_node_schedulable", bases, [flag(n.schedulable) for n in nodes], out)
    header(
        "gpuctl_node_health",
        "1 for the node's health verdict (healthy, degraded, unhealthy, unknown).",
        "gauge",
        out,
    )
    verdict_columns(
        "gpuctl_node_health", bases, [n.verdict for n in nodes], tuple(Verdict), "verdict", out
    )
    header(
        "gpuctl_node_state",
        "1 for the node's state (ready, cordoned, draining, down, unknown), as gpuctl status "
        "shows it.",
        "gauge",
        out,
    )
    verdict_columns("gpuctl_node_state", bases, [n.state for n in nodes], NODE_STATES, "state", out)
