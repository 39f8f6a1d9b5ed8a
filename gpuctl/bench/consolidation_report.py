"""The consolidation benchmark's matrix and reports: each policy over the seeds without
consolidation and with a pass every K arrivals (`Row`, `run_matrix`), the `-o json`/`yaml`
document, the Markdown table, and `gpuctl bench placement --consolidate-every K` (`run_cli`).
The replay itself is `gpuctl.bench.consolidation`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpuctl.bench.consolidation import ConsolidationRun, paired, run_one
from gpuctl.bench.openb import OpenbNode, OpenbPod
from gpuctl.errors import UsageError


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One policy with or without consolidation, over seeds."""

    policy: str
    every: int
    max_moves_pct: float
    runs: tuple[ConsolidationRun, ...]
    room_moves: int = 0  # drain-and-refill for each pod that finds no room (0: off)

    @property
    def consolidating(self) -> bool:
        return bool(self.every or self.room_moves)

    def how(self) -> str:
        """The consolidation in words."""
        parts = [f"every {self.every}"] if self.every else []
        if self.room_moves:
            parts.append(f"room for failed pods (≤ {self.room_moves} moves)")
        if not parts:
            return "none"
        return f"{' + '.join(parts)}, ≤ {self.max_moves_pct:g}% moved"

    def values(self, field: str) -> list[float]:
        return [float(v) for r in self.runs if (v := getattr(r, field)) is not None]

    def mean(self, field: str) -> float:
        values = self.values(field)
        return statistics.fmean(values) if values else math.nan

    def std(self, field: str) -> float:
        values = self.values(field)
        return statistics.stdev(values) if len(values) > 1 else 0.0


def run_matrix(
    nodes: tuple[OpenbNode, ...],
    pods: tuple[OpenbPod, ...],
    policy_names: Sequence[str],
    seeds: Sequence[int],
    *,
    every: int,
    max_moves_pct: float,
    tune: float = 1.3,
    jobs: int = 1,
    progress: Callable[[ConsolidationRun], None] | None = None,
    room_moves: int = 0,
) -> list[Row]:
    """Each policy without consolidation, then with a pass every `every` arrivals (0: none
    where `room_moves` makes room for each pod that finds no room)."""
    if every < (0 if room_moves else 1):
        raise UsageError(f"--consolidate-every must be 1 or more, got {every}")
    if not 0 <= max_moves_pct <= 100:
        raise UsageError(f"--max-moves-pct must be from 0 to 100, got {max_moves_pct}")
    kinds = ((0, 0.0, 0), (every, max_moves_pct, room_moves))
    tasks = [
        (name, seed, k, pct, room)
        for name in policy_names
        for k, pct, room in kinds
        for seed in seeds
    ]
    results: dict[tuple[str, int, int], ConsolidationRun] = {}

    def record(run: ConsolidationRun) -> None:
        results[(run.policy, run.seed, run.every if run.every or run.room_moves else -1)] = run
        if progress is not None:
            progress(run)

    if jobs <= 1:
        for name, seed, k, pct, room in tasks:
            record(run_one(nodes, pods, name, seed, k, pct, tune, room))
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
            futures = [pool.submit(run_one, nodes, pods, *t[:4], tune, t[4]) for t in tasks]
            for future in futures:
                record(future.result())
    for (name, seed, k), run in list(results.items()):
        if k != -1:  # the kept ceiling of the pods both it and its baseline placed
            results[(name, seed, k)] = paired(nodes, results[(name, seed, -1)], run)
    return [
        Row(
            name,
            k,
            pct,
            tuple(results[(name, seed, k if k or room else -1)] for seed in seeds),
            room,
        )
        for name in policy_names
        for k, pct, room in kinds
    ]


FIELDS = (
    "alloc_100",
    "alloc_130",
    "moves",
    "moved_pct",
    "ceiling_pct",
    "packing_ceiling_pct",
    "forced_ceiling_pct",
    "kept_ceiling_pct",
    "lowest_ceiling_pct",
    "dropped",
    "seconds",
)


def gap_closed(rows: Sequence[Row], row: Row, ceiling: str) -> float | None:
    """The share (%) of the gap at x=130 from the same policy without consolidation up to the
    ceiling `ceiling` (a field of `ConsolidationRun`: `ceiling_pct`, `packing_ceiling_pct`,
    `forced_ceiling_pct`, `kept_ceiling_pct` or `lowest_ceiling_pct`; mean over seeds; see
    `pair_ceiling`) that `row` closes; None for a row without consolidation or where the gap is
    empty or unknown."""
    base = next((r for r in rows if r.policy == row.policy and not r.consolidating), None)
    if not row.consolidating or base is None or not row.values("alloc_130"):
        return None
    tops = [pair_ceiling(b, r, ceiling) for b, r in zip(base.runs, row.runs, strict=True)]
    known = [t for t in tops if t is not None]
    if len(known) != len(tops):
        return None
    gap = statistics.fmean(known) - base.mean("alloc_130")
    if not gap > 0:
        return None
    return 100.0 * (row.mean("alloc_130") - base.mean("alloc_130")) / gap


def pair_ceiling(base: ConsolidationRun, run: ConsolidationRun, ceiling: str) -> float | None:
    """The ceiling `ceiling` that the gap from `base` (a seed without consolidation) to `run`
    (the same seed with it) is measured to: `base`'s own, but for the kept ceiling, which is
    the pair's (`run.kept_ceiling_pct`: over the pods both placed, so it binds both), and the
    lowest: of `base`'s packing and forced ceilings and the pair's kept ceiling (which never
    exceeds `ceiling_pct` over the pods both placed; without it, `base`'s `ceiling_pct`)."""
    if ceiling == "kept_ceiling_pct":
        return run.kept_ceiling_pct
    if ceiling == "lowest_ceiling_pct":  # never `base`'s own kept ceiling: it may not bind `run`
        pair = run.kept_ceiling_pct
        known = (base.packing_ceiling_pct, base.forced_ceiling_pct)
        return min(
            [pair if pair is not None else base.ceiling_pct, *(c for c in known if c is not None)]
        )
    value = getattr(base, ceiling)
    return None if value is None else float(value)


CEILINGS = (
    ("ceiling", "ceiling_pct"),
    ("packing_ceiling", "packing_ceiling_pct"),
    ("forced_ceiling", "forced_ceiling_pct"),
    ("kept_ceiling", "kept_ceiling_pct"),
    ("lowest_ceiling", "lowest_ceiling_pct"),
)


def report_document(rows: Sequence[Row], workload: str, tune: float) -> dict[str, object]:
    """The `-o json` document: one entry per policy and consolidation setting."""
    out: list[dict[str, object]] = []
    for row in rows:
        entry: dict[str, object] = {
            "policy": row.policy,
            "consolidate_every": row.every or None,
            "max_moves_pct": row.max_moves_pct if row.consolidating else None,
            "room_moves": row.room_moves or None,
            "seeds": [r.seed for r in row.runs],
        }
        for f in FIELDS:
            values = row.values(f)
            entry[f] = {
                "mean": round(row.mean(f), 3) if values else None,
                "std": round(row.std(f), 3),
                "per_seed": [
                    None if (v := getattr(r, f)) is None else round(float(v), 2) for r in row.runs
                ],
            }
        entry["gap_closed_pct"] = {
            name: None if (g := gap_closed(rows, row, f)) is None else round(g, 1)
            for name, f in CEILINGS
        }
        out.append(entry)
    return {"workload": workload, "tune": tune, "rows": out}


def render_table(rows: Sequence[Row], workload: str) -> str:
    """A Markdown table: allocation at x=100 and x=130, moves, the four ceilings and the share
    of the gap to the lowest (per seed, `pair_ceiling`) that consolidation closes, time per
    run. A consolidating row's kept ceiling is its pair's."""
    head = (
        "| policy | consolidation | alloc@100 | alloc@130 | moves (% of placed) "
        "| ceiling@130 | packing ceiling@130 | forced ceiling@130 | kept ceiling@130 "
        "| gap closed (lowest ceiling) | s/run |"
    )
    lines = [f"workload {workload}, seeds {_span([r.seed for r in rows[0].runs])}", "", head]
    lines.append("|" + "---|" * 11)
    for row in rows:
        how = row.how()
        lines.append(
            f"| {row.policy} | {how} | {_stat(row, 'alloc_100')} | {_stat(row, 'alloc_130')} "
            f"| {row.mean('moves'):.0f} ({row.mean('moved_pct'):.2f}%) "
            f"| {row.mean('ceiling_pct'):.2f} | {_mean(row, 'packing_ceiling_pct')} "
            f"| {_mean(row, 'forced_ceiling_pct')} | {_mean(row, 'kept_ceiling_pct')} "
            f"| {_gap(rows, row)} | {row.mean('seconds'):.0f} |"
        )
    return "\n".join(lines) + "\n"


def _stat(row: Row, field: str) -> str:
    if not row.values(field):
        return "N/A"
    return f"{row.mean(field):.2f} ± {row.std(field):.2f}"


def _mean(row: Row, field: str) -> str:
    return f"{row.mean(field):.2f}" if row.values(field) else "N/A"


def _gap(rows: Sequence[Row], row: Row) -> str:
    gap = gap_closed(rows, row, "lowest_ceiling_pct")
    return "-" if gap is None else f"{gap:.0f}%"


def _span(seeds: Sequence[int]) -> str:
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def run_cli(
    nodes_path: Path,
    pods_path: Path,
    policy_names: Sequence[str],
    seeds: Sequence[int],
    tune: float,
    jobs: int,
    every: int,
    max_moves_pct: float,
    *,
    show: bool,
    document: str | None,
) -> str:
    """`gpuctl bench placement --consolidate-every K`: the Markdown table, or one JSON/YAML
    document when `document` is `json` or `yaml`."""
    import json

    from gpuctl.bench.openb import load_nodes, load_pods
    from gpuctl.bench.runner import workload_name

    if not tune > 0 or math.isinf(tune):
        raise UsageError(f"--tune must be a positive number, got {tune}")
    rows = run_matrix(
        load_nodes(nodes_path),
        load_pods(pods_path),
        policy_names,
        seeds,
        every=every,
        max_moves_pct=max_moves_pct,
        tune=tune,
        jobs=jobs,
        progress=_progress if show else None,
    )
    name = workload_name(pods_path)
    if document is None:
        return render_table(rows, name)
    doc = report_document(rows, name, tune)
    if document == "yaml":
        import yaml

        return str(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return json.dumps(doc, indent=2) + "\n"


def _progress(run: ConsolidationRun) -> None:
    how = f"every {run.every}" if run.every else "none"
    sys.stderr.write(
        f"{run.policy} seed {run.seed}, consolidation {how}: {run.alloc_130} @130, "
        f"{run.moves} moves ({run.seconds:.1f} s)\n"
    )
    sys.stderr.flush()
