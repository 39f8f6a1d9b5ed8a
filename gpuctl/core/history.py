"""The fleet's history as values: one sample of the five numbers (`FleetSample`), one sample of a
node's use (`NodeSample`), and how long each resolution is kept (`Retention`). Pure.

Samples are recorded at the history's resolution (`Retention.resolution_s`, default a minute) and
downsampled as they age: raw samples are kept `raw_s` (default 24 h), then replaced by 5-minute
averages kept `five_min_s` (default 3 days), then by hourly averages kept `keep_s` (default 30
days), after which they are dropped. Events get a retention too: checkpoint events (half the
audit log) `checkpoint_events_s` (default 14 days), every other event (operators' cordons,
drains, cancels, submits and gpuctl's own actions) `events_s` (default a year).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

DAY_S = 86400
FIVE_MIN_S = 300
HOUR_S = 3600

# the five numbers a fleet sample keeps, in column order (names as `FleetNumbers.to_dict`)
FLEET_SERIES = (
    "utilization_pct",
    "observed_util_pct",
    "fragmentation_pct",
    "stranded_gib",
    "allocated_mib",
    "capacity_mib",
    "queue_wait_p50_s",
    "queue_wait_p95_s",
    "queue_waiting",
    "checkpoint_age_max_s",
    "failover_success_pct",
    "preemptions_per_hour",
)
NODE_SERIES = ("util_pct", "mem_used_mib", "mem_allocated_mib", "mem_ghost_mib", "mem_total_mib")
CHECKPOINT_EVENT_PREFIX = "checkpoint"  # checkpoint, checkpoint_skipped, checkpoint_invalid
MIN_KEEP_S = HOUR_S
MAX_KEEP_S = 366 * DAY_S
_DURATION = re.compile(r"(\d+)\s*([dhms])")
_UNIT_S = {"d": DAY_S, "h": HOUR_S, "m": 60, "s": 1}


@dataclasses.dataclass(frozen=True, slots=True)
class FleetSample:
    """The five numbers at `at` (seconds since the epoch, whole), averaged over `step_s`."""

    at: int
    step_s: int
    values: Mapping[str, float | None]  # FLEET_SERIES -> value (None: undefined then)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSample:
    """One node's use at `at`, averaged over `step_s`: mean SM utilization of its GPUs that
    answered (whole %), observed, allocated and ghost GPU memory and its GPUs' total (MiB)."""

    at: int
    step_s: int
    node: str
    util_pct: float | None
    mem_used_mib: int | None
    mem_allocated_mib: int | None
    mem_ghost_mib: int | None
    mem_total_mib: int | None

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in NODE_SERIES)


@dataclasses.dataclass(frozen=True, slots=True)
class Retention:
    """How long history is kept, at which resolution (seconds)."""

    resolution_s: int = 60
    raw_s: int = DAY_S
    five_min_s: int = 3 * DAY_S
    keep_s: int = 30 * DAY_S
    checkpoint_events_s: int = 14 * DAY_S
    events_s: int = 365 * DAY_S

    def __post_init__(self) -> None:
        if not 1 <= self.resolution_s <= FIVE_MIN_S:
            raise ValueError("the history's resolution must be 1 s to 5 min")
        if not self.raw_s <= self.five_min_s <= self.keep_s:
            raise ValueError("raw samples must be kept no longer than 5-min ones, those no longer")
        if self.checkpoint_events_s <= 0 or self.events_s <= 0 or self.raw_s <= 0:
            raise ValueError("every retention must be positive")

    def with_keep(self, keep_s: int) -> Retention:
        """This retention kept `keep_s` in all (the finer levels shortened to fit)."""
        return dataclasses.replace(
            self,
            keep_s=keep_s,
            five_min_s=min(self.five_min_s, keep_s),
            raw_s=min(self.raw_s, keep_s),
        )

    def levels(self, now: float) -> tuple[tuple[int, int], ...]:
        """(step, before): samples finer than `step` that started before `before` are averaged
        into buckets of `step`."""
        return (
            (FIVE_MIN_S, _floor(now - self.raw_s, FIVE_MIN_S)),
            (HOUR_S, _floor(now - self.five_min_s, HOUR_S)),
        )


def parse_retention(text: str) -> int:
    """How long the history is kept: `30d`, `12h`, `7d12h` -> seconds, 1 h to 366 days.
    ValueError saying what is wrong otherwise."""
    t = str(text).strip().lower()
    parts = _DURATION.findall(t)
    if not t or not parts or _DURATION.sub("", t).strip():
        raise ValueError(f"{text!r} is not a duration (e.g. 30d, 12h, 7d12h)")
    seconds = sum(int(n) * _UNIT_S[u] for n, u in parts)
    if not MIN_KEEP_S <= seconds <= MAX_KEEP_S:
        raise ValueError(f"must be 1h to 366d, got {text!r}")
    return seconds


@dataclasses.dataclass(frozen=True, slots=True)
class Pruned:
    """What one prune did: rows averaged away, rows dropped past the retention, events dropped."""

    averaged: int = 0
    dropped: int = 0
    events: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class TableRows:
    """Rows of one table at one level (a sample table's resolution, an event class) before and
    after a prune."""

    table: str  # fleet_samples, node_samples or events
    level: str  # 1m, 5m, 1h (the samples' resolution) or checkpoint, other (events)
    before: int
    after: int

    @property
    def change(self) -> int:
        return self.after - self.before

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "level": self.level,
            "rows": self.before,
            "after": self.after,
            "change": self.change,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class PruneReport:
    """What one prune did, or would do (`dry_run`): the totals and each table's rows by level."""

    pruned: Pruned
    tables: tuple[TableRows, ...]
    dry_run: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            **self.pruned.to_dict(),
            "tables": [t.to_dict() for t in self.tables],
        }


TABLE_ORDER = ("fleet_samples", "node_samples", "events")
EVENT_CLASSES = ("checkpoint", "other")


def step_level(step_s: int) -> str:
    """A resolution as a level's name: 60 -> 1m, 300 -> 5m, 3600 -> 1h, 30 -> 30s."""
    if step_s % HOUR_S == 0:
        return f"{step_s // HOUR_S}h"
    if step_s % 60 == 0:
        return f"{step_s // 60}m"
    return f"{step_s}s"


def table_rows(
    before: Mapping[tuple[str, int | str], int], after: Mapping[tuple[str, int | str], int]
) -> tuple[TableRows, ...]:
    """Rows by (table, level) before and after -> `TableRows`, tables in `TABLE_ORDER`, sample
    levels finest first, event classes in `EVENT_CLASSES`' order; a level in neither is left out."""

    def order(key: tuple[str, int | str]) -> tuple[int, int, str]:
        table, level = key
        rank = level if isinstance(level, int) else EVENT_CLASSES.index(level)
        return (TABLE_ORDER.index(table), rank, str(level))

    keys = sorted(set(before) | set(after), key=order)
    return tuple(
        TableRows(
            t,
            step_level(level) if isinstance(level, int) else level,
            before.get((t, level), 0),
            after.get((t, level), 0),
        )
        for t, level in keys
    )


def _floor(t: float, step: int) -> int:
    return int(math.floor(t / step) * step)


def bucket(at: float, step_s: int) -> int:
    """The start of the `step_s` bucket holding `at`."""
    return _floor(at, step_s)


def _mean(values: Iterable[float | None], digits: int | None) -> float | None:
    got = [v for v in values if v is not None]
    if not got:
        return None
    mean = sum(got) / len(got)
    return round(mean) if digits is None else round(mean, digits)


def average_fleet(samples: Sequence[FleetSample], step_s: int) -> list[FleetSample]:
    """Samples averaged into buckets of `step_s` (each series over the samples defining it)."""
    groups: dict[int, list[FleetSample]] = {}
    for s in samples:
        groups.setdefault(bucket(s.at, step_s), []).append(s)
    return [
        FleetSample(
            at,
            step_s,
            {k: _mean((s.get(k) for s in group), 2) for k in FLEET_SERIES},
        )
        for at, group in sorted(groups.items())
    ]


def average_nodes(samples: Sequence[NodeSample], step_s: int) -> list[NodeSample]:
    """Node samples averaged into buckets of `step_s`, per node (whole numbers)."""
    groups: dict[tuple[int, str], list[NodeSample]] = {}
    for s in samples:
        groups.setdefault((bucket(s.at, step_s), s.node), []).append(s)
    out: list[NodeSample] = []
    for (at, node), group in sorted(groups.items()):
        totals = []
        for i in range(len(NODE_SERIES)):
            got = [v for v in (s.values()[i] for s in group) if v is not None]
            totals.append((sum(got), len(got)))
        out.append(node_average(at, step_s, node, totals))
    return out


def node_average(
    at: int, step_s: int, node: str, totals: Sequence[tuple[float, int]]
) -> NodeSample:
    """One node's bucket from each `NODE_SERIES` column's (sum, count) of the values defined in
    it: their means, whole (`average_nodes`, and the SQL stores' GROUP BY, end here)."""
    means = [None if n == 0 else round(total / n) for total, n in totals]
    ints = [None if v is None else int(v) for v in means]
    return NodeSample(at, step_s, node, means[0], *ints[1:])


def is_checkpoint_event(kind: str) -> bool:
    return kind.startswith(CHECKPOINT_EVENT_PREFIX)


def series(samples: Sequence[FleetSample], name: str) -> list[tuple[int, float | None]]:
    """One series of fleet samples, oldest first: (at, value)."""
    return [(s.at, s.get(name)) for s in sorted(samples, key=lambda s: s.at)]


def downsample(
    fleet: Sequence[FleetSample],
    nodes: Sequence[NodeSample],
    now: float,
    retention: Retention,
) -> tuple[list[FleetSample], list[NodeSample], int, int]:
    """What the store keeps after a prune (the in-memory store's; the SQL stores do the same in
    SQL): (fleet samples, node samples, rows averaged away, rows dropped past the retention)."""
    f, n = list(fleet), list(nodes)
    averaged = 0
    for step, before in retention.levels(now):
        old_f = [s for s in f if s.step_s < step and s.at < before]
        old_n = [s for s in n if s.step_s < step and s.at < before]
        if not old_f and not old_n:
            continue
        buckets = {bucket(s.at, step) for s in old_f} | {bucket(s.at, step) for s in old_n}
        old_f += [s for s in f if s.step_s == step and s.at in buckets]
        old_n += [s for s in n if s.step_s == step and s.at in buckets]
        averaged += len(old_f) + len(old_n)
        gone_f, gone_n = {id(s) for s in old_f}, {id(s) for s in old_n}
        f = [s for s in f if id(s) not in gone_f] + average_fleet(old_f, step)
        n = [s for s in n if id(s) not in gone_n] + average_nodes(old_n, step)
    horizon = now - retention.keep_s
    kept_f = sorted((s for s in f if s.at >= horizon), key=lambda s: s.at)
    kept_n = sorted((s for s in n if s.at >= horizon), key=lambda s: (s.at, s.node))
    return kept_f, kept_n, averaged, len(f) + len(n) - len(kept_f) - len(kept_n)
