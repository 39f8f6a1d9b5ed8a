"""The per-GPU and per-job families, written as exposition text directly. Pure.

A 1,000-node × 8-GPU fleet has about 200,000 of these samples; prometheus_client's generator
takes seconds over them, so they are written here, a family's column at a time through `_write`:
each GPU's and job's label text made once and kept, each column's lines filled in C.

Labels of a GPU series join dcgm-exporter's without relabelling: `Hostname` (the node's own
hostname as the probe read it; the node's name when unknown), `gpu` (the index) and `UUID`, plus
gpuctl's `node` (the inventory name, as on the node series). `gpuctl_gpu_info` adds `pci_bus_id`
as dcgm-exporter names it, and `model` (dcgm-exporter's camelCase `modelName` fails promtool's
lint; join on `UUID` to take it from DCGM's series).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
from collections.abc import Iterable, Sequence

from gpuctl.core.health import Verdict
from gpuctl.core.model import GpuSnapshot
from gpuctl.ops.metrics._write import (
    LABELS_KEPT,
    column,
    escape,
    family,
    header,
    label_text,
    labelled,
    samples,
    verdict_columns,
)

VERDICTS = tuple(Verdict)
LIVE_JOB_STATES = ("queued", "running", "held")  # per-job series: only these (cardinality)


@dataclasses.dataclass(frozen=True, slots=True)
class JobReading:
    """One live job (queued, running or held) as a refresh saw it. `node`, `cards` and
    `allocated_mib`: the incarnation holding cards now (None: none); `observed_mib`: NVML's memory
    of its processes (None: not polled, or none seen); `checkpoint_age_s`: running jobs only."""

    id: str
    name: str
    state: str
    tier: str
    incarnation: int
    restarts: int
    node: str | None = None
    cards: int | None = None
    allocated_mib: int | None = None
    observed_mib: int | None = None
    checkpoint_age_s: float | None = None


@functools.lru_cache(maxsize=LABELS_KEPT)
def job_labels(job_id: str, job_name: str) -> str:
    return label_text((("job_id", job_id), ("job_name", job_name)))


# --- GPUs ----------------------------------------------------------------------------------------

FLAGS = frozenset(
    (
        "retired_pages_pending",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "thermal_slowdown_hw",
        "thermal_slowdown_sw",
    )
)

# (name, HELP, type, (extra label text, the card's attribute)...): from the probe's observation
CARD_SERIES: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "gpuctl_gpu_power_watts",
        "Power draw the card reports.",
        "gauge",
        (("", "power_w"),),
    ),
    (
        "gpuctl_gpu_power_limit_watts",
        "Power limit the card enforces.",
        "gauge",
        (("", "power_limit_w"),),
    ),
    (
        "gpuctl_gpu_ecc_volatile_errors",
        "ECC errors since the driver last loaded (volatile: a reload resets them), by kind.",
        "gauge",
        (
            ('kind="corrected"', "ecc_volatile_corrected"),
            ('kind="uncorrected"', "ecc_volatile_uncorrected"),
        ),
    ),
    (
        "gpuctl_gpu_ecc_aggregate_errors_total",
        "ECC errors over the card's life (aggregate, kept by the card across reboots), by kind.",
        "counter",
        (
            ('kind="corrected"', "ecc_aggregate_corrected"),
            ('kind="uncorrected"', "ecc_aggregate_uncorrected"),
        ),
    ),
    (
        "gpuctl_gpu_retired_pages",
        "Memory pages the card retired, by cause (sbe: single-bit, dbe: double-bit ECC errors).",
        "gauge",
        (
            ('cause="sbe"', "retired_pages_sbe"),
            ('cause="dbe"', "retired_pages_dbe"),
        ),
    ),
    (
        "gpuctl_gpu_retired_pages_pending",
        "1 when a page retirement waits for the next driver reload.",
        "gauge",
        (("", "retired_pages_pending"),),
    ),
    (
        "gpuctl_gpu_remapped_rows",
        "Memory rows the card remapped, by kind of error (correctable, uncorrectable).",
        "gauge",
        (
            ('kind="correctable"', "remapped_rows_correctable"),
            ('kind="uncorrectable"', "remapped_rows_uncorrectable"),
        ),
    ),
    (
        "gpuctl_gpu_remapped_rows_pending",
        "1 when a row remapping waits for the next GPU reset.",
        "gauge",
        (("", "remapped_rows_pending"),),
    ),
    (
        "gpuctl_gpu_remap_failure",
        "1 when a row remapping failed (the card needs service).",
        "gauge",
        (("", "remapped_rows_failure"),),
    ),
    (
        "gpuctl_gpu_thermal_slowdown",
        "1 while the card slows its clocks for heat, by who decided it (hardware, software).",
        "gauge",
        (
            ('kind="hardware"', "thermal_slowdown_hw"),
            ('kind="software"', "thermal_slowdown_sw"),
        ),
    ),
)


@dataclasses.dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as a refresh saw it: both memory views, the probe's observation (`card`), the
    XIDs of the kernel log attributed to it, and the gpuctl jobs holding it."""

    node: str
    index: int
    uuid: str | None
    model: str | None
    total_mib: int | None
    observed_mib: int | None  # NVML memory.used
    allocated_mib: int | None  # granted by gpuctl (placement's view)
    ghost_mib: int | None  # in use by processes gpuctl does not account for
    util_pct: int | None
    temp_c: int | None
    verdict: Verdict | None
    hostname: str | None = None  # the node's own, as the probe read it
    pci_bus_id: str | None = None
    card: GpuSnapshot | None = None  # the probe's observation
    last_xid: int | None = None  # the newest XID's code, 0: none (None: not read)
    xids: tuple[tuple[int, int], ...] = ()  # (code, how many), by code
    jobs: tuple[tuple[str, str], ...] = ()  # (job id, job name) of the jobs holding it


def _each(items: Sequence[object], *attrs: str) -> list[Iterable[object]]:
    """A column per attribute, read in C (for `map` over several)."""
    return [map(operator.attrgetter(a), items) for a in attrs]


@functools.lru_cache(maxsize=LABELS_KEPT)
def _gpu_labels(node: str, hostname: str | None, index: int, uuid: str | None) -> str:
    """The GPU's label text, `node="…",Hostname="…",gpu="…",UUID="…"` (the node's name when its
    hostname is unknown). Kept while the GPU's names stay the same (they rarely change)."""
    return label_text(
        (("node", node), ("Hostname", hostname or node), ("gpu", index), ("UUID", uuid or ""))
    )


# the names of the last exposition's GPUs and their label texts (base, and gpuctl_gpu_info's)
_LAST_GPUS: list[tuple[tuple[tuple[object, ...], ...], list[str], list[str]]] = []


def _gpu_bases(gpus: Sequence[GpuReading]) -> tuple[list[str], list[str]]:
    """Each GPU's label text and gpuctl_gpu_info's, as the last exposition's while the GPUs'
    names are the same (they rarely change)."""
    names = tuple(
        map(tuple, _each(gpus, "node", "hostname", "index", "uuid", "model", "pci_bus_id"))
    )
    last = _LAST_GPUS[0] if _LAST_GPUS else None
    if last is not None and last[0] == names:
        return last[1], last[2]
    bases = list(map(_gpu_labels, *names[:4]))
    info = list(map(_info_labels, bases, *names[4:]))
    _LAST_GPUS[:] = [(names, bases, info)]
    return bases, info


def _having(
    gpus: Sequence[GpuReading], bases: Sequence[str], attr: str
) -> Iterable[tuple[GpuReading, str]]:
    """(GPU, its label text) of the GPUs whose `attr` is not empty."""
    return itertools.compress(zip(gpus, bases, strict=True), map(operator.attrgetter(attr), gpus))


@functools.lru_cache(maxsize=LABELS_KEPT)
def _info_labels(base: str, model: str | None, pci_bus_id: str | None) -> str:
    return f"{base},{label_text((('model', model or ''), ('pci_bus_id', pci_bus_id or '')))}"


# (name, HELP, the value of a GPU): gpuctl's own per-GPU gauges
GPU_GAUGES: tuple[tuple[str, str, str, str], ...] = (
    ("gpuctl_gpu_memory_total_bytes", "GPU memory the card reports.", "total_mib", "mib"),
    (
        "gpuctl_gpu_memory_observed_bytes",
        "GPU memory in use as NVML reports it.",
        "observed_mib",
        "mib",
    ),
    (
        "gpuctl_gpu_memory_allocated_bytes",
        "GPU memory gpuctl granted on the card (a whole card: all of it).",
        "allocated_mib",
        "mib",
    ),
    (
        "gpuctl_gpu_memory_ghost_bytes",
        "GPU memory in use by processes gpuctl does not account for.",
        "ghost_mib",
        "mib",
    ),
    ("gpuctl_gpu_utilization_ratio", "SM utilization NVML reports (0-1).", "util_pct", "pct"),
    ("gpuctl_gpu_temperature_celsius", "GPU temperature.", "temp_c", ""),
)


def gpu_text(gpus: Sequence[GpuReading], out: list[bytes]) -> None:
    """Every per-GPU family: gpuctl's views, the probe's readings (power, ECC, retired pages,
    remapped rows, thermal slowdown, XIDs) and the jobs holding each GPU."""
    bases, info = _gpu_bases(gpus)
    family(
        "gpuctl_gpu_info",
        "1 per GPU, with its model and PCI address (dcgm-exporter's pci_bus_id).",
        "gauge",
        info,
        [1] * len(gpus),
        out,
    )
    for name, help_text, attr, unit in GPU_GAUGES:
        header(name, help_text, "gauge", out)
        labelled(name, bases, column(gpus, attr, unit), out)
    header(
        "gpuctl_gpu_health",
        "1 for the GPU's health verdict (healthy, degraded, unhealthy, unknown).",
        "gauge",
        out,
    )
    verdict_columns("gpuctl_gpu_health", bases, column(gpus, "verdict"), VERDICTS, "verdict", out)
    cards: list[GpuSnapshot] = list(map(operator.attrgetter("card"), gpus))
    seen = list(map(operator.is_not, cards, itertools.repeat(None)))
    observed_bases = list(itertools.compress(bases, seen))
    cards = list(itertools.compress(cards, seen))
    for name, help_text, kind, columns in CARD_SERIES:
        header(name, help_text, kind, out)
        for extra, attr in columns:
            unit = "flag" if attr in FLAGS else ""
            labelled(name, observed_bases, column(cards, attr, unit), out, extra)
    family(
        "gpuctl_gpu_last_xid",
        "Code of the GPU's newest XID error in the kernel log the probe reads (0: none), like "
        "dcgm-exporter's DCGM_FI_DEV_XID_ERRORS.",
        "gauge",
        bases,
        column(gpus, "last_xid"),
        out,
    )
    xid_bases, xid_counts = [], []
    for g, b in _having(gpus, bases, "xids"):
        for code, count in g.xids:
            xid_bases.append(f'{b},xid="{code}"')
            xid_counts.append(count)
    family(
        "gpuctl_gpu_xid_errors",
        "XID errors of the GPU in the kernel log lines the probe reads (the last 50), by code.",
        "gauge",
        xid_bases,
        xid_counts,
        out,
    )
    job_bases = [
        f"{b},{job_labels(*job)}" for g, b in _having(gpus, bases, "jobs") for job in g.jobs
    ]
    family(
        "gpuctl_gpu_job_info",
        "1 per gpuctl job holding the GPU: join with * on(UUID) group_left(job_id, job_name).",
        "gauge",
        job_bases,
        [1] * len(job_bases),
        out,
    )


# --- jobs ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=LABELS_KEPT)
def _placed(base: str, node: str | None) -> str:
    return f'{base},node="{escape(node or "")}"'


@functools.lru_cache(maxsize=LABELS_KEPT)
def _stated(placed: str, state: str, tier: str) -> str:
    return f'{placed},state="{escape(state)}",tier="{escape(tier)}"'


def job_text(jobs: Sequence[JobReading], out: list[bytes]) -> None:
    """Per-job series of the live jobs, and how many are held."""
    bases = list(map(job_labels, *_each(jobs, "id", "name")))
    placed = list(map(_placed, bases, *_each(jobs, "node")))
    family(
        "gpuctl_job_state",
        "1 per live job (queued, running, held), with its state, tier and node (empty: none).",
        "gauge",
        list(map(_stated, placed, *_each(jobs, "state", "tier"))),
        [1] * len(jobs),
        out,
    )
    for name, help_text, attr, unit, labels in (
        ("gpuctl_job_cards", "Cards the job holds now.", "cards", "", placed),
        (
            "gpuctl_job_memory_allocated_bytes",
            "GPU memory gpuctl granted the job (its slice × cards; a whole card: all of it).",
            "allocated_mib",
            "mib",
            placed,
        ),
        (
            "gpuctl_job_memory_observed_bytes",
            "GPU memory NVML reports in use by the job's processes (needs a poll).",
            "observed_mib",
            "mib",
            placed,
        ),
        (
            "gpuctl_job_checkpoint_age_seconds",
            "Now minus the job's newest committed checkpoint (running jobs; none yet: since its "
            "first start).",
            "checkpoint_age_s",
            "",
            bases,
        ),
        (
            "gpuctl_job_incarnation",
            "The job's current incarnation (GPUCTL_INCARNATION; 0: never started).",
            "incarnation",
            "",
            bases,
        ),
        (
            "gpuctl_job_restarts",
            "Restarts forced by failures of the job itself (what its restart budget counts).",
            "restarts",
            "",
            bases,
        ),
    ):
        family(name, help_text, "gauge", labels, column(jobs, attr, unit), out)
    held = sum(1 for j in jobs if j.state == "held")
    header("gpuctl_held_jobs", "Jobs held until an operator releases them.", "gauge", out)
    samples("gpuctl_held_jobs", [" "], [held], out)
