#!/usr/bin/env bash
# Full placement benchmark: five openb traces x (best-fit, fgd, default) x seeds 42-51.
# Usage: benchmarks/placement/run_all.sh [DATA_DIR] [OUT_DIR]
#   DATA_DIR: folder with the openb CSVs and fgd-published.csv beside it (default ../shared/data)
set -euo pipefail
DATA="${1:-../shared/data}"
OUT="${2:-benchmarks/placement/out}"
mkdir -p "$OUT"
for trace in default cpu050 gpushare40 gpuspec10 multigpu20; do
  gpuctl bench placement \
    --nodes "$DATA/openb/openb_node_list_gpu_node.csv" \
    --pods "$DATA/openb/openb_pod_list_$trace.csv" \
    --policy best-fit,fgd,default --tune 1.3 --seeds 42-51 \
    --published "$DATA/fgd-published.csv" -o json > "$OUT/$trace.json"
  echo "$trace done" >&2
done
