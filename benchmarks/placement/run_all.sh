#!/usr/bin/env bash
# Full placement benchmark: five openb traces x (best-fit, fgd, default) x seeds 42-51, under the
# FGD paper's protocol and in trace order (CAFGD's), each with the upper bound (--bound).
# Usage: benchmarks/placement/run_all.sh [DATA_DIR] [OUT_DIR] [TRACE...]
#   DATA_DIR: folder with openb/ (the node list and pod lists) and fgd-published.csv (default
#   ../shared/data). Environment: POLICIES (best-fit,fgd,default), ORDERS ("paper trace"),
#   SEEDS (42-51), JOBS (1: one process, so per-run times are single-process wall time).
set -euo pipefail
DATA="${1:-../shared/data}"
OUT="${2:-benchmarks/placement/out}"
shift $(($# > 2 ? 2 : $#))
TRACES="${*:-default cpu050 gpushare40 gpuspec10 multigpu20}"
mkdir -p "$OUT"
PUBLISHED=()
[ -f "$DATA/fgd-published.csv" ] && PUBLISHED=(--published "$DATA/fgd-published.csv")
for trace in $TRACES; do
  for order in ${ORDERS:-paper trace}; do
    suffix=$([ "$order" = paper ] && echo "" || echo "-trace")
    gpuctl bench placement \
      --nodes "$DATA/openb/openb_node_list_gpu_node.csv" \
      --pods "$DATA/openb/openb_pod_list_$trace.csv" \
      --policy "${POLICIES:-best-fit,fgd,default}" --tune 1.3 --seeds "${SEEDS:-42-51}" \
      --order "$order" --bound --jobs "${JOBS:-1}" "${PUBLISHED[@]}" -o json \
      > "$OUT/$trace$suffix.json"
    echo "$trace ($order order) done" >&2
  done
done
