"""`gpuctl bench ...`: benchmarks (the openb placement replay)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.errors import UsageError

if TYPE_CHECKING:
    from gpuctl.bench.replay import RunResult
    from gpuctl.bench.runner import BenchReport, Published, Stat

app = typer.Typer(help="Benchmarks: replay public traces through gpuctl's policies.")


@app.callback()
def _bench() -> None:
    """Benchmarks: replay public traces through gpuctl's policies."""


@app.command("placement")
def placement(
    nodes: Path = typer.Option(
        ..., "--nodes", help="Node list CSV (openb_node_list_gpu_node.csv)."
    ),
    pods: Path = typer.Option(..., "--pods", help="Pod list CSV (openb_pod_list_*.csv)."),
    policy: str = typer.Option(
        "best-fit,fgd,default", "--policy", help="Policy or comma-separated policies."
    ),
    tune: float = typer.Option(1.3, "--tune", help="Arrived GPU demand to replay, x capacity."),
    seeds: str = typer.Option("42-51", "--seeds", help="Seeds: 42-51, or 42,45,50."),
    published: Path | None = typer.Option(
        None, "--published", help="Published means CSV (fgd-published.csv) to show alongside."
    ),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Processes (per-run times stay per run)."),
    progress: bool | None = typer.Option(
        None, "--progress/--no-progress", help="Progress on stderr (default: when a TTY)."
    ),
    consolidate_every: int = typer.Option(
        0,
        "--consolidate-every",
        help="Also replay with a consolidation pass every K arrivals, beside each policy (0: off).",
    ),
    max_moves_pct: float = typer.Option(
        5.0, "--max-moves-pct", help="With --consolidate-every: at most this % of placed pods move."
    ),
    order: str = typer.Option(
        "paper",
        "--order",
        help="paper: shuffled and tuned (the FGD paper); trace: the trace's order, each pod once "
        "(CAFGD's protocol; reports the allocation after the last pod).",
    ),
    bound: bool = typer.Option(
        False,
        "--bound",
        help="Also an upper bound per seed on what any placement of its arrivals can allocate "
        "(an LP solved by HiGHS; needs scipy), and each policy's gap to it.",
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Replay an openb trace under the FGD paper's protocol and report the GPU allocation ratio
    at x=100 and x=130 (mean ± std over seeds), the fragmentation ratio and the time per run.

    Example: gpuctl bench placement --nodes openb_node_list_gpu_node.csv
    --pods openb_pod_list_default.csv --seeds 42-51 --bound
    """
    from gpuctl.bench import runner

    names = runner.parse_policies(policy)
    seed_list = runner.parse_seeds(seeds)
    pub = runner.load_published(published) if published is not None else None
    show = sys.stderr.isatty() if progress is None else progress
    if consolidate_every:
        from gpuctl.bench.consolidation_report import run_cli

        document = output.value if output in (Output.JSON, Output.YAML) else None
        args = (nodes, pods, names, seed_list, tune, jobs, consolidate_every, max_moves_pct)
        sys.stdout.write(run_cli(*args, show=show, document=document))
        return
    if bound:
        from gpuctl.bench import bound as lp

        if not lp.available():
            raise UsageError(lp.MISSING)
    report = runner.run_bench(
        nodes,
        pods,
        names,
        seed_list,
        tune=tune,
        jobs=jobs,
        progress=_progress if show else None,
        order=order,
        with_bound=bound,
    )
    if output in (Output.JSON, Output.YAML):
        emit_document(runner.report_document(report, pub), output)
    else:
        sys.stdout.write(render_table(report, pub, wide=output is Output.WIDE))


def _num(value: float | None, spec: str = ".2f") -> str:
    return "N/A" if value is None else format(value, spec)


def _stat(stat: Stat) -> str:
    return "N/A" if stat.mean is None else f"{stat.mean:.2f} ± {_num(stat.std)}"


def _progress(done: int, total: int, result: RunResult) -> None:
    sys.stderr.write(
        f"[{done}/{total}] {safe(result.policy)} seed {result.seed}: "
        f"{_num(result.alloc_100)} @100, {_num(result.alloc_130)} @130 "
        f"({result.seconds:.1f} s)\n"
    )
    sys.stderr.flush()


def render_table(
    report: BenchReport, published: dict[tuple[str, str, int], Published] | None, *, wide: bool
) -> str:
    from gpuctl.bench.runner import bound_stat, gap_to_bound, published_for

    seeds = report.seeds
    span = f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
    trace = report.order == "trace"
    kpis = ("alloc_end",) if trace else ("alloc_100", "alloc_130")
    labels = {"alloc_end": "@END", "alloc_100": "@100", "alloc_130": "@130"}
    head = ["POLICY", *(f"ALLOC{labels[k]}" for k in kpis), "FRAG%@100", "S/RUN"]
    if published is not None and not trace:
        head[3:3] = ["PUBLISHED@100", "PUBLISHED@130", "VS FGD@100", "VS FGD@130"]
    if report.bounds is not None:
        head[-1:-1] = [f"GAP{labels[k]}" for k in kpis]
    rows = [head]
    for s in report.summaries:
        row = [
            s.policy,
            *(_stat(getattr(s, k)) for k in kpis),
            _num(s.frag_ratio_100),
            f"{s.seconds_per_run:.2f}",
        ]
        if report.bounds is not None:
            row[-1:-1] = [_num(gap_to_bound(report.bounds, s, k), "+.2f") for k in kpis]
        if published is not None and not trace:
            cells = []
            for x in (100, 130):
                own = published_for(report.workload, s.policy, x, published)
                cells.append("-" if own is None else f"{own.mean:.2f} ± {own.std:.2f}")
            for x, stat in ((100, s.alloc_100), (130, s.alloc_130)):
                fgd = published.get((report.workload, "FGD", x))
                gap = None if fgd is None or stat.mean is None else stat.mean - fgd.mean
                cells.append(_num(gap, "+.2f"))
            row[3:3] = cells
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    setup = "trace order" if trace else f"tune {report.tune:g}"
    lines = [
        f"workload {safe(report.workload)}, {setup}, seeds {span} "
        f"({len(seeds)} run{'' if len(seeds) == 1 else 's'} per policy)"
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if report.bounds is not None:
        took = sum(b.seconds for b in report.bounds) / len(report.bounds)
        text = ", ".join(f"{labels[k]} {_stat(bound_stat(report.bounds, k))}" for k in kpis)
        lines.append(
            f"upper bound (no placement of the arrivals allocates more; GAP = bound - policy): "
            f"{text} ({took:.2f} s per seed)"
        )
    if wide:
        lines.append("")
        for s in report.summaries:
            per = ", ".join(f"{r.seed}: {_num(r.alloc_100)}/{_num(r.alloc_130)}" for r in s.runs)
            lines.append(f"{safe(s.policy)} per seed (@100/@130): {per}")
    return "\n".join(lines) + "\n"
