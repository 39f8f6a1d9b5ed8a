"""Write openb workloads along the FGD paper's four knobs (see gpuctl/bench/generate.py).

Usage: python benchmarks/placement/generate.py NODES.csv BASE_PODS.csv SPEC_SOURCE.csv OUT_DIR
           [SEED] [WORKLOAD...]
  BASE_PODS: the trace to derive from (openb_pod_list_default.csv)
  SPEC_SOURCE: a trace with gpu_spec set (openb_pod_list_gpuspec10.csv), the specs to draw from
  WORKLOAD: e.g. gpuspec25 cpu250 multigpu40; default: the paper's 16 and some beyond them
Writes OUT_DIR/openb_pod_list_<workload>.csv for each.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpuctl.bench.generate import generate, parse_family, write_pods
from gpuctl.bench.openb import load_nodes, load_pods
from gpuctl.errors import GpuctlError

PAPER = [
    *("cpu050", "cpu100", "cpu200", "cpu250"),
    *("gpushare40", "gpushare60", "gpushare80", "gpushare100"),
    *("gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33"),
    *("multigpu20", "multigpu30", "multigpu40", "multigpu50"),
]
BEYOND = ["cpu025", "cpu400", "gpushare20", "gpuspec50", "gpuspec75", "multigpu60", "multigpu70"]


def main(argv: list[str]) -> None:
    nodes, base, spec_source, out = argv[:4]
    seed = int(argv[4]) if len(argv) > 4 else 2026
    names = argv[5:] or [*PAPER, *BEYOND]
    node_list = load_nodes(Path(nodes))
    pods = load_pods(Path(base))
    specs = load_pods(Path(spec_source))
    Path(out).mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        knob, value = parse_family(name)
        made = generate(pods, knob, value, seed + i, nodes=node_list, specs=specs)
        write_pods(Path(out) / f"openb_pod_list_{name}.csv", made)
        print(f"{name}: {len(made)} pods", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) < 5:
        raise SystemExit(
            f"usage: {Path(__file__).name} NODES BASE_PODS SPEC_PODS OUT_DIR [SEED] [NAME...]"
        )
    try:
        main(sys.argv[1:])
    except GpuctlError as exc:  # bad data paths or files: one line, exit 1
        raise SystemExit(f"{Path(__file__).name}: {exc}") from None
