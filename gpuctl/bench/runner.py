"""Running the placement benchmark: policies x seeds, summaries, and the published numbers."""

from __future__ import annotations

import csv
import dataclasses
import math
import re
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpuctl.bench.openb import OpenbNode, OpenbPod, load_nodes, load_pods
from gpuctl.bench.protocol import (
    CPU_SCALE_MILLI,
    FULL_WORKLOAD,
    GPU_SCALE_MILLI,
    PAPER_WORKLOAD,
    WorkloadSpec,
    gpu_capacity_milli,
)
from gpuctl.bench.replay import ORDERS, RunResult, arrivals_for, replay
from gpuctl.bench.rng import NumpyRng
from gpuctl.core.placement import policies
from gpuctl.core.placement.policies import Policy
from gpuctl.errors import ConfigError, UsageError

# Our policy names -> the names in the FGD artifact's published results.
PUBLISHED_NAMES = {"best-fit": "BestFit", "fgd": "FGD"}


def bench_policy(name: str) -> tuple[Policy, WorkloadSpec]:
    """The policy `name` configured for the benchmark (milli-GPU units, the artifact's scales),
    and the target workload it is given.

    `best-fit` and `fgd` are the paper's; `gpuctl` (the default) sees every observed shape with
    its host memory, as it would on a fleet.
    """
    try:
        policy = policies.get_policy(name)
    except KeyError as exc:
        raise UsageError(str(exc.args[0]), hint="pass --policy NAME[,NAME...]") from None
    if isinstance(policy, policies.BestFit):
        scaled = policies.BestFit(
            gpu_scale_units=GPU_SCALE_MILLI, cpu_scale_milli=CPU_SCALE_MILLI, quantize=True
        )
        return scaled, PAPER_WORKLOAD
    if isinstance(policy, policies.Gpuctl):
        return policy, FULL_WORKLOAD
    return policy, PAPER_WORKLOAD


def parse_policies(spec: str) -> tuple[str, ...]:
    """Policy names as given (an alias and its target count once, under the first spelling)."""
    names: dict[str, str] = {}
    for name in (p.strip() for p in spec.split(",")):
        if name:
            bench_policy(name)
            names.setdefault(policies.ALIASES.get(name, name), name)
    if not names:
        raise UsageError("--policy: no policy given", hint="e.g. --policy best-fit,fgd,default")
    return tuple(names.values())


def parse_seeds(spec: str) -> tuple[int, ...]:
    """`42-51`, `42,45,50` or a mix."""
    seeds: list[int] = []
    for part in (p.strip() for p in spec.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise UsageError(f"--seeds: cannot read {part!r}", hint="e.g. --seeds 42-51")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        if hi < lo or hi - lo >= 10_000:
            raise UsageError(f"--seeds: bad range {part!r}", hint="e.g. --seeds 42-51")
        seeds.extend(range(lo, hi + 1))
    return tuple(dict.fromkeys(seeds))


@dataclasses.dataclass(frozen=True, slots=True)
class Stat:
    """Mean and sample standard deviation over the seeds that reached the column."""

    mean: float | None
    std: float | None  # 0 for one seed
    per_seed: tuple[float | None, ...]

    @staticmethod
    def of(values: Sequence[float | None]) -> Stat:
        known = [v for v in values if v is not None]
        return Stat(
            mean=statistics.fmean(known) if known else None,
            std=(statistics.stdev(known) if len(known) > 1 else 0.0) if known else None,
            per_seed=tuple(values),
        )

    @property
    def ci95(self) -> float | None:
        """The half-width of the 95% confidence interval of the mean (Student's t)."""
        n = sum(1 for v in self.per_seed if v is not None)
        if self.std is None or n < 2:
            return None
        return t975(n - 1) * self.std / math.sqrt(n)


# Student's t, two-sided 95%, by degrees of freedom (1..30); 1.96 beyond.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


@dataclasses.dataclass(frozen=True, slots=True)
class SeedBound:
    """`gpuctl.bench.bound` for one seed's arrivals: no policy's KPI can exceed these."""

    seed: int
    alloc_100: float | None
    alloc_130: float | None
    alloc_end: float
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class PolicySummary:
    policy: str
    alloc_100: Stat
    alloc_130: Stat
    alloc_end: Stat
    frag_ratio_100: float | None
    seconds_per_run: float
    runs: tuple[RunResult, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class BenchReport:
    workload: str
    seeds: tuple[int, ...]
    tune: float
    summaries: tuple[PolicySummary, ...]
    order: str = "paper"
    bounds: tuple[SeedBound, ...] | None = None  # per seed, with --bound


def workload_name(pods_path: Path) -> str:
    """`openb_pod_list_gpushare40.csv` -> `gpushare40`."""
    m = re.fullmatch(r"openb_pod_list_(.+)\.csv", pods_path.name)
    return m.group(1) if m else pods_path.stem


Progress = Callable[[int, int, RunResult], None]


def _run_one(
    nodes: tuple[OpenbNode, ...],
    pods: tuple[OpenbPod, ...],
    name: str,
    seed: int,
    tune: float,
    order: str = "paper",
) -> RunResult:
    policy, workload = bench_policy(name)
    rng = NumpyRng(seed)
    result = replay(nodes, pods, policy, rng, seed=seed, tune=tune, workload=workload, order=order)
    return dataclasses.replace(result, policy=name)


def seed_bound(
    nodes: Sequence[OpenbNode], pods: Sequence[OpenbPod], seed: int, tune: float, order: str
) -> SeedBound:
    """The upper bound on each KPI of the run with `seed` (the same arrivals as its replay)."""
    from gpuctl.bench import bound  # scipy, imported only for --bound

    capacity = gpu_capacity_milli(nodes)
    arrivals = arrivals_for(pods, NumpyRng(seed), capacity, tune=tune, order=order)
    b100, s100 = bound.column_bound(nodes, arrivals, 100)
    b130, s130 = bound.column_bound(nodes, arrivals, 130)
    end = bound.allocation_bound(nodes, arrivals)
    return SeedBound(
        seed=seed,
        alloc_100=b100,
        alloc_130=b130,
        alloc_end=round(100 * end.milli / capacity, 2),
        seconds=s100 + s130 + end.seconds,
    )


def run_bench(
    nodes_path: Path,
    pods_path: Path,
    policy_names: Sequence[str],
    seeds: Sequence[int],
    *,
    tune: float = 1.3,
    jobs: int = 1,
    progress: Progress | None = None,
    order: str = "paper",
    with_bound: bool = False,
) -> BenchReport:
    """Replay the trace once per (policy, seed). Each run's seconds are its own wall time.
    `with_bound`: also the upper bound of every seed's arrivals (`gpuctl.bench.bound`)."""
    if not tune > 0 or math.isinf(tune):
        raise UsageError(f"--tune must be a positive number, got {tune}")
    if order not in ORDERS:
        raise UsageError(f"--order must be one of {', '.join(ORDERS)}, got {order!r}")
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    nodes = load_nodes(nodes_path)
    pods = load_pods(pods_path)
    tasks = [(name, seed) for name in policy_names for seed in seeds]
    results: dict[tuple[str, int], RunResult] = {}
    done = 0

    def record(result: RunResult) -> None:
        nonlocal done
        results[(result.policy, result.seed)] = result
        done += 1
        if progress is not None:
            progress(done, len(tasks), result)

    if jobs == 1 or len(tasks) == 1:
        for name, seed in tasks:
            record(_run_one(nodes, pods, name, seed, tune, order))
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
            futures = [pool.submit(_run_one, nodes, pods, n, s, tune, order) for n, s in tasks]
            for future in futures:
                record(future.result())
    bounds = None
    if with_bound:
        bounds = tuple(seed_bound(nodes, pods, seed, tune, order) for seed in seeds)

    summaries = []
    for name in policy_names:
        runs = tuple(results[(name, seed)] for seed in seeds)
        frags = [r.frag_ratio_100 for r in runs if r.frag_ratio_100 is not None]
        summaries.append(
            PolicySummary(
                policy=name,
                alloc_100=Stat.of([r.alloc_100 for r in runs]),
                alloc_130=Stat.of([r.alloc_130 for r in runs]),
                alloc_end=Stat.of([r.alloc_end for r in runs]),
                frag_ratio_100=statistics.fmean(frags) if frags else None,
                seconds_per_run=statistics.fmean(r.seconds for r in runs),
                runs=runs,
            )
        )
    return BenchReport(
        workload=workload_name(pods_path),
        seeds=tuple(seeds),
        tune=tune,
        summaries=tuple(summaries),
        order=order,
        bounds=bounds,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Published:
    mean: float
    std: float


PUBLISHED_COLUMNS = ("workload", "policy", "x", "mean", "std")


def load_published(path: Path) -> dict[tuple[str, str, int], Published]:
    """`fgd-published.csv`: workload, policy, x, mean, std (and seeds)."""
    out: dict[tuple[str, str, int], Published] = {}
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
    with handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in PUBLISHED_COLUMNS if c not in header]
        if missing:
            raise ConfigError(f"missing column(s) {', '.join(missing)}", path=str(path), line=1)
        for row in reader:
            key_x = row.get("x") or ""
            try:
                key = (row["workload"], row["policy"], int(key_x))
                out[key] = Published(mean=float(row["mean"]), std=float(row["std"] or 0))
            except ValueError:
                raise ConfigError(
                    "expected numbers in x, mean and std",
                    path=str(path),
                    line=reader.line_num,
                    field="x/mean/std",
                ) from None
    return out


def report_document(
    report: BenchReport, published: dict[tuple[str, str, int], Published] | None = None
) -> dict[str, object]:
    """The `-o json` document: one object keyed by policy name."""
    doc: dict[str, object] = {}
    for s in report.summaries:
        entry: dict[str, object] = {
            "alloc_100": _stat_doc(s.alloc_100),
            "alloc_130": _stat_doc(s.alloc_130),
            "alloc_end": _stat_doc(s.alloc_end),
            "frag_ratio_100": None if s.frag_ratio_100 is None else round(s.frag_ratio_100, 2),
            "seconds_per_run": round(s.seconds_per_run, 3),
            "seeds": list(report.seeds),
            "workload": report.workload,
            "tune": report.tune,
            "order": report.order,
        }
        if report.bounds is not None:
            entry["bound"] = _bound_doc(report.bounds)
            entry["gap_to_bound"] = {k: gap_to_bound(report.bounds, s, k) for k in KPIS}
        if published is not None:
            entry["published"] = _published_doc(report.workload, s.policy, published)
        doc[s.policy] = entry
    return doc


def _stat_doc(stat: Stat) -> dict[str, object]:
    ci = stat.ci95
    return {
        "mean": None if stat.mean is None else round(stat.mean, 3),
        "std": None if stat.std is None else round(stat.std, 3),
        "ci95": None if ci is None else round(ci, 3),
        "per_seed": [None if v is None else round(v, 2) for v in stat.per_seed],
    }


KPIS = ("alloc_100", "alloc_130", "alloc_end")


def bound_stat(bounds: Sequence[SeedBound], kpi: str) -> Stat:
    return Stat.of([getattr(b, kpi) for b in bounds])


def gap_to_bound(bounds: Sequence[SeedBound], summary: PolicySummary, kpi: str) -> float | None:
    """The mean over seeds of (the seed's bound - the policy's KPI), in points."""
    stat: Stat = getattr(summary, kpi)
    gaps = [
        b - v
        for b, v in zip((getattr(x, kpi) for x in bounds), stat.per_seed, strict=True)
        if b is not None and v is not None
    ]
    return round(statistics.fmean(gaps), 3) if gaps else None


def _bound_doc(bounds: Sequence[SeedBound]) -> dict[str, object]:
    doc: dict[str, object] = {k: _stat_doc(bound_stat(bounds, k)) for k in KPIS}
    doc["seconds_per_run"] = round(statistics.fmean(b.seconds for b in bounds), 3)
    return doc


def published_for(
    workload: str, policy: str, x: int, published: dict[tuple[str, str, int], Published]
) -> Published | None:
    name = PUBLISHED_NAMES.get(policy)
    return None if name is None else published.get((workload, name, x))


def _published_doc(
    workload: str, policy: str, published: dict[tuple[str, str, int], Published]
) -> dict[str, object]:
    out: dict[str, object] = {}
    for x in (100, 130):
        own = published_for(workload, policy, x, published)
        fgd = published.get((workload, "FGD", x))
        out[f"alloc_{x}"] = None if own is None else {"mean": own.mean, "std": own.std}
        out[f"fgd_{x}"] = None if fgd is None else {"mean": fgd.mean, "std": fgd.std}
    return out
