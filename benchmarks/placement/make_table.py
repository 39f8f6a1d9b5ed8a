"""Turn the JSON documents of `run_all.sh` into the markdown tables of results.md.

Usage: python benchmarks/placement/make_table.py OUT_DIR [TRACE...] > tables.md
       python benchmarks/placement/make_table.py OUT_DIR --versus TRACE... (default against
       our FGD, one line per workload: the generated workloads; "room" is the bound less FGD,
       the most any policy could lead FGD by at x=100)

Two tables: the FGD paper's protocol (OUT_DIR/<trace>.json) and trace order, CAFGD's protocol
(OUT_DIR/<trace>-trace.json), each cell mean ± the half-width of its 95% confidence interval over
the seeds, with the upper bound (`--bound`) and each policy's gap to it when the documents have it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

TRACES = ("default", "cpu050", "gpushare40", "gpuspec10", "multigpu20")
POLICIES = ("best-fit", "fgd", "default")
# CAFGD (ICDCS '25), pods in trace order, one run: the default trace only.
CAFGD_REPORTED = {"fgd": 94.29, "cafgd": 94.69}


def ci(stat: dict[str, float | None] | None) -> str:
    if stat is None or stat.get("mean") is None:
        return "-"
    half = stat.get("ci95")
    return f"{stat['mean']:.2f} ± {half:.2f}" if half is not None else f"{stat['mean']:.2f}"


def sd(stat: dict[str, float] | None) -> str:
    return "-" if stat is None else f"{stat['mean']:.2f} ± {stat['std']:.2f}"


def gap(e: dict[str, object], kpi: str) -> str:
    g = e.get("gap_to_bound")
    value = g.get(kpi) if isinstance(g, dict) else None
    return "-" if value is None else f"{value:+.2f}"


def bound(e: dict[str, object], kpi: str) -> str:
    b = e.get("bound")
    return ci(b.get(kpi)) if isinstance(b, dict) else "-"


def paper_table(out_dir: Path, traces: list[str]) -> None:
    print(
        "| trace | policy | x=100 ours | x=100 published | x=130 ours | x=130 published "
        "| vs FGD @100 | vs FGD @130 | bound @100 | gap @100 | bound @130 | gap @130 | s/run |"
    )
    print("|" + "---|" * 13)
    gaps: list[float] = []
    for trace in traces:
        doc = json.loads((out_dir / f"{trace}.json").read_text())
        for policy in (p for p in POLICIES if p in doc):
            e = doc[policy]
            pub = e.get("published") or {}
            vs = []
            for x in (100, 130):
                fgd = pub.get(f"fgd_{x}") or doc["fgd"][f"alloc_{x}"]
                d = e[f"alloc_{x}"]["mean"] - fgd["mean"]
                vs.append(f"{d:+.2f}")
                if policy == "default":
                    gaps.append(d)
            print(
                f"| {trace} | {policy} | {ci(e['alloc_100'])} | {sd(pub.get('alloc_100'))} "
                f"| {ci(e['alloc_130'])} | {sd(pub.get('alloc_130'))} | {vs[0]} | {vs[1]} "
                f"| {bound(e, 'alloc_100')} | {gap(e, 'alloc_100')} "
                f"| {bound(e, 'alloc_130')} | {gap(e, 'alloc_130')} | {e['seconds_per_run']:.2f} |"
            )
    print()
    print(
        f"default vs FGD (published where there is a published mean, else ours): mean "
        f"{statistics.fmean(gaps):+.2f} points, min {min(gaps):+.2f}, max {max(gaps):+.2f} "
        f"({len(gaps)} numbers: {len(traces)} traces x 2 columns)"
    )


def trace_table(out_dir: Path, traces: list[str]) -> None:
    print(
        "| trace | policy | allocation after the last pod | vs our FGD | CAFGD paper's number "
        "| bound | gap | s/run |"
    )
    print("|" + "---|" * 8)
    for trace in traces:
        path = out_dir / f"{trace}-trace.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        fgd = doc["fgd"]["alloc_end"]["mean"]
        for policy in (p for p in POLICIES if p in doc):
            e = doc[policy]
            reported = CAFGD_REPORTED.get(policy) if trace == "default" else None
            theirs = "-" if reported is None else f"{reported:.2f} (FGD)"
            if trace == "default" and policy == "default":
                theirs = f"{CAFGD_REPORTED['cafgd']:.2f} (CAFGD)"
            print(
                f"| {trace} | {policy} | {ci(e['alloc_end'])} "
                f"| {e['alloc_end']['mean'] - fgd:+.2f} | {theirs} "
                f"| {bound(e, 'alloc_end')} | {gap(e, 'alloc_end')} | {e['seconds_per_run']:.2f} |"
            )


def versus_table(out_dir: Path, traces: list[str]) -> None:
    """One line per trace: default against our FGD (for generated workloads, no published mean)."""
    print(
        "| workload | FGD @100 | default @100 | Δ @100 | FGD @130 | default @130 | Δ @130 "
        "| bound @100 | default's gap @100 | room @100 |"
    )
    print("|" + "---|" * 10)
    deltas: list[float] = []
    for trace in traces:
        doc = json.loads((out_dir / f"{trace}.json").read_text())
        f, d = doc["fgd"], doc["default"]
        cells = []
        for x in (100, 130):
            delta = d[f"alloc_{x}"]["mean"] - f[f"alloc_{x}"]["mean"]
            deltas.append(delta)
            cells.append(f"{ci(f[f'alloc_{x}'])} | {ci(d[f'alloc_{x}'])} | {delta:+.2f}")
        room = "-"
        if d.get("bound") and d["bound"]["alloc_100"].get("mean") is not None:
            room = f"{d['bound']['alloc_100']['mean'] - f['alloc_100']['mean']:+.2f}"
        print(
            f"| {trace} | {cells[0]} | {cells[1]} | {bound(d, 'alloc_100')} "
            f"| {gap(d, 'alloc_100')} | {room} |"
        )
    print()
    print(
        f"default vs our FGD: mean {statistics.fmean(deltas):+.2f} points, min {min(deltas):+.2f}, "
        f"max {max(deltas):+.2f}; at least +0.5 in {sum(1 for v in deltas if v >= 0.5)} of "
        f"{len(deltas)} ({len(traces)} workloads x 2 columns)"
    )


def main(out_dir: Path, traces: list[str]) -> None:
    if traces[:1] == ["--versus"]:
        versus_table(out_dir, traces[1:])
        return
    print("### The FGD paper's protocol (shuffled, tuned to 1.3x capacity), seeds 42-51\n")
    paper_table(out_dir, traces)
    if any((out_dir / f"{t}-trace.json").exists() for t in traces):
        print("\n### Trace order (CAFGD's protocol: each pod once, as listed), seeds 42-51\n")
        trace_table(out_dir, traces)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        name = Path(__file__).name
        raise SystemExit(f"usage: {name} OUT_DIR [TRACE...] | {name} OUT_DIR --versus TRACE...")
    try:
        main(Path(sys.argv[1]), sys.argv[2:] or list(TRACES))
    except FileNotFoundError as exc:  # a trace without its JSON document: one line, exit 1
        raise SystemExit(f"{Path(__file__).name}: no such file: {exc.filename}") from None
