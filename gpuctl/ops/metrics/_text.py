"""The per-GPU and per-job families, written as exposition text directly. Pure.

A 1,000-node × 8-GPU fleet has about 200,000 of these samples; prometheus_client's generator
takes seconds over them (measured by `benchmarks/metrics_scrape.py`), so they are written here,
column by column: each GPU's labels are quoted once and shared by all its samples, values are
formatted once per column. The text is the Prometheus text format 0.0.4, as `generate_latest`
writes it; `promtool check metrics` passes on it (tests run it).

Labels of a GPU series join dcgm-exporter's without relabelling: `Hostname` (the node's own
hostname as the probe read it; the node's name when unknown), `gpu` (the index) and `UUID`, plus
gpuctl's `node` (the inventory name, as on the node series). `gpuctl_gpu_info` adds `pci_bus_id`
as dcgm-exporter names it, and `model` (dcgm-exporter's camelCase `modelName` fails promtool's
lint; join on `UUID` to take it from DCGM's series).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from collections.abc import Iterable, Sequence

from gpuctl.core.health import Verdict
from gpuctl.core.model import GpuSnapshot

MIB = 1 << 20
LIVE_JOB_STATES = ("queued", "running", "held")  # per-job series: only these (cardinality)
LABELS_KEPT = 1 << 18  # label texts kept from one exposition to the next: they rarely change

Value = int | float | None


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


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@functools.lru_cache(maxsize=LABELS_KEPT)
def escape(value: str | int, limit: int = 128) -> str:
    """A label value as the text format quotes it. Values from node output are untrusted: no
    control characters, bounded length."""
    text = str(value)
    if len(text) <= limit and text.isascii() and text.isprintable():  # the usual case, fast
        if '"' not in text and "\\" not in text:
            return text
    else:
        text = _CONTROL.sub("", text)[:limit]  # newlines too: nothing left to escape there
    return text.replace("\\", "\\\\").replace('"', '\\"')


def label_text(pairs: Iterable[tuple[str, object]]) -> str:
    """`k1="v1",k2="v2"` (no braces)."""
    return ",".join(f'{k}="{escape(v)}"' for k, v in pairs)


def flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


@functools.lru_cache(maxsize=LABELS_KEPT)
def job_labels(job_id: str, job_name: str) -> str:
    return label_text((("job_id", job_id), ("job_name", job_name)))


def header(name: str, help_text: str, kind: str, out: list[str]) -> None:
    """A family's HELP and TYPE lines (a counter's `name` ends in `_total`)."""
    help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")


def samples(name: str, heads: Sequence[str], values: Iterable[Value], out: list[str]) -> None:
    """`heads[i]` is a sample's `{labels} ` (its trailing space included); None: no sample.
    Values are ints or floats (a flag through `flag`): both print as Prometheus reads them."""
    out.append(
        "".join([f"{name}{h}{v}\n" for h, v in zip(heads, values, strict=True) if v is not None])
    )


def labelled(
    name: str, bases: Sequence[str], values: Iterable[Value], out: list[str], extra: str = ""
) -> None:
    """Samples `name{base,extra} value` (the hot path: one string made per sample)."""
    pre, post = name + "{", ("," + extra if extra else "") + "} "
    out.append(
        "".join(
            [f"{pre}{b}{post}{v}\n" for b, v in zip(bases, values, strict=True) if v is not None]
        )
    )


def family(
    name: str,
    help_text: str,
    kind: str,
    heads: Sequence[str],
    values: Iterable[Value],
    out: list[str],
) -> None:
    header(name, help_text, kind, out)
    samples(name, heads, values, out)


def heads(bases: Sequence[str], extra: str = "") -> list[str]:
    """`{base,extra} ` for each base label text."""
    if extra:
        return [f"{{{b},{extra}}} " for b in bases]
    return [f"{{{b}}} " for b in bases]


# --- GPUs ----------------------------------------------------------------------------------------

_FLAG = {True: 1, False: 0}


def column(items: Sequence[object], attr: str, unit: str = "") -> list[Value]:
    """`attr` of each item (None stays None): as is, a flag as 0/1 (`flag`), MiB as bytes
    (`mib`), a percentage as a ratio (`pct`). In C where it can be: 8,000 GPUs × 25 columns."""
    values = map(operator.attrgetter(attr), items)
    if unit == "flag":
        return list(map(_FLAG.get, values))
    if unit == "mib":
        return [None if v is None else v * MIB for v in values]
    if unit == "pct":
        return [None if v is None else v / 100 for v in values]
    return list(values)


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


def gpu_labels(g: GpuReading) -> str:
    """The GPU's label text, `node="…",Hostname="…",gpu="…",UUID="…"`."""
    return _gpu_labels(g.node, g.hostname or g.node, g.index, g.uuid or "")


@functools.lru_cache(maxsize=LABELS_KEPT)
def _gpu_labels(node: str, hostname: str, index: int, uuid: str) -> str:
    """Kept while the GPU's names stay the same (they rarely change; escaping them was most of
    an exposition's work)."""
    return label_text((("node", node), ("Hostname", hostname), ("gpu", index), ("UUID", uuid)))


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


def gpu_text(gpus: Sequence[GpuReading], out: list[str]) -> None:
    """Every per-GPU family: gpuctl's views, the probe's readings (power, ECC, retired pages,
    remapped rows, thermal slowdown, XIDs) and the jobs holding each GPU."""
    bases = [gpu_labels(g) for g in gpus]
    family(
        "gpuctl_gpu_info",
        "1 per GPU, with its model and PCI address (dcgm-exporter's pci_bus_id).",
        "gauge",
        [
            f"{{{b},{label_text((('model', g.model or ''), ('pci_bus_id', g.pci_bus_id or '')))}}} "
            for g, b in zip(gpus, bases, strict=True)
        ],
        [1] * len(gpus),
        out,
    )
    for name, help_text, attr, unit in GPU_GAUGES:
        header(name, help_text, "gauge", out)
        labelled(name, bases, column(gpus, attr, unit), out)
    judged = [(g.verdict, b) for g, b in zip(gpus, bases, strict=True) if g.verdict is not None]
    header(
        "gpuctl_gpu_health",
        "1 for the GPU's health verdict (healthy, degraded, unhealthy, unknown).",
        "gauge",
        out,
    )
    for v in Verdict:
        labelled(
            "gpuctl_gpu_health",
            [b for _, b in judged],
            [int(verdict is v) for verdict, _ in judged],
            out,
            f'verdict="{v.value}"',
        )
    observed = [(g.card, b) for g, b in zip(gpus, bases, strict=True) if g.card is not None]
    observed_bases = [b for _, b in observed]
    cards = [c for c, _ in observed]
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
        heads(bases),
        [g.last_xid for g in gpus],
        out,
    )
    xid_heads, xid_counts = [], []
    for g, b in zip(gpus, bases, strict=True):
        for code, count in g.xids:
            xid_heads.append(f'{{{b},xid="{code}"}} ')
            xid_counts.append(count)
    family(
        "gpuctl_gpu_xid_errors",
        "XID errors of the GPU in the kernel log lines the probe reads (the last 50), by code.",
        "gauge",
        xid_heads,
        xid_counts,
        out,
    )
    job_heads = [
        f"{{{b},{job_labels(*job)}}} " for g, b in zip(gpus, bases, strict=True) for job in g.jobs
    ]
    family(
        "gpuctl_gpu_job_info",
        "1 per gpuctl job holding the GPU: join with * on(UUID) group_left(job_id, job_name).",
        "gauge",
        job_heads,
        [1] * len(job_heads),
        out,
    )


# --- jobs ----------------------------------------------------------------------------------------


def job_text(jobs: Sequence[JobReading], out: list[str]) -> None:
    """Per-job series of the live jobs, and how many are held."""
    bases = [job_labels(j.id, j.name) for j in jobs]
    placed = [f'{b},node="{escape(j.node or "")}"' for j, b in zip(jobs, bases, strict=True)]
    family(
        "gpuctl_job_state",
        "1 per live job (queued, running, held), with its state, tier and node (empty: none).",
        "gauge",
        [
            f'{{{p},state="{escape(j.state)}",tier="{escape(j.tier)}"}} '
            for j, p in zip(jobs, placed, strict=True)
        ],
        [1] * len(jobs),
        out,
    )
    for name, help_text, values, labels in (
        ("gpuctl_job_cards", "Cards the job holds now.", [j.cards for j in jobs], placed),
        (
            "gpuctl_job_memory_allocated_bytes",
            "GPU memory gpuctl granted the job (its slice × cards; a whole card: all of it).",
            [None if j.allocated_mib is None else j.allocated_mib * MIB for j in jobs],
            placed,
        ),
        (
            "gpuctl_job_memory_observed_bytes",
            "GPU memory NVML reports in use by the job's processes (needs a poll).",
            [None if j.observed_mib is None else j.observed_mib * MIB for j in jobs],
            placed,
        ),
        (
            "gpuctl_job_checkpoint_age_seconds",
            "Now minus the job's newest committed checkpoint (running jobs; none yet: since its "
            "first start).",
            [j.checkpoint_age_s for j in jobs],
            bases,
        ),
        (
            "gpuctl_job_incarnation",
            "The job's current incarnation (GPUCTL_INCARNATION; 0: never started).",
            [j.incarnation for j in jobs],
            bases,
        ),
        (
            "gpuctl_job_restarts",
            "Restarts forced by failures of the job itself (what its restart budget counts).",
            [j.restarts for j in jobs],
            bases,
        ),
    ):
        family(name, help_text, "gauge", heads(labels), values, out)
    held = sum(1 for j in jobs if j.state == "held")
    family("gpuctl_held_jobs", "Jobs held until an operator releases them.", "gauge",
           [" "], [held], out)  # fmt: skip
