"""Turn the JSON documents of `run_all.sh` into the markdown table of results.md.

Usage: python benchmarks/placement/make_table.py OUT_DIR > table.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

TRACES = ("default", "cpu050", "gpushare40", "gpuspec10", "multigpu20")
POLICIES = ("best-fit", "fgd", "default")


def cell(stat: dict[str, float] | None) -> str:
    return "-" if stat is None else f"{stat['mean']:.2f} ± {stat['std']:.2f}"


def main(out_dir: Path) -> None:
    print(
        "| trace | policy | x=100 ours | x=100 published | x=130 ours | x=130 published "
        "| vs FGD @100 | vs FGD @130 | frag % @100 | s/run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    gaps: list[float] = []
    for trace in TRACES:
        doc = json.loads((out_dir / f"{trace}.json").read_text())
        for policy in POLICIES:
            e = doc[policy]
            pub = e["published"]
            vs = []
            for x in (100, 130):
                fgd = pub[f"fgd_{x}"]
                gap = e[f"alloc_{x}"]["mean"] - fgd["mean"]
                vs.append(f"{gap:+.2f}")
                if policy == "default":
                    gaps.append(gap)
            print(
                f"| {trace} | {policy} | {cell(e['alloc_100'])} | {cell(pub['alloc_100'])} "
                f"| {cell(e['alloc_130'])} | {cell(pub['alloc_130'])} | {vs[0]} | {vs[1]} "
                f"| {e['frag_ratio_100']:.2f} | {e['seconds_per_run']:.2f} |"
            )
    print()
    print(
        f"default vs published FGD: mean {statistics.fmean(gaps):+.2f} points, "
        f"min {min(gaps):+.2f}, max {max(gaps):+.2f} (10 numbers: 5 traces x 2 columns)"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
