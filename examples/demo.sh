#!/usr/bin/env bash
# gpuctl's demo (`make demo` runs it): a 3-node lab fleet, three training jobs (one spot), a node
# killed mid-training, and the jobs resuming elsewhere from their last committed checkpoints.
# Everything lives in DEMO_DIR (default /tmp/gpuctl-demo): the lab, gpuctl's state
# (--state-dir, never your own), the job specs and their checkpoints. The demo removes all of it
# when it ends, however it ends. About a minute. docs/demo.md walks through it.
#
#   examples/demo.sh                        # with gpuctl on the PATH
#   GPUCTL=.venv/bin/gpuctl DEMO_DIR=/tmp/d examples/demo.sh
set -euo pipefail

DEMO_DIR=${DEMO_DIR:-/tmp/gpuctl-demo}
GPUCTL=${GPUCTL:-gpuctl}
PYTHON=${PYTHON:-python3}
GRACE=${GRACE:-5}
EXAMPLES=$(cd "$(dirname "$0")" && pwd)
LAB=$DEMO_DIR/lab
STATE=$DEMO_DIR/state
SPECS=$DEMO_DIR/jobs
CHECKPOINTS=$DEMO_DIR/checkpoints
JOBS=(train-demo train-demo-2 train-spot)

gpuctl() { "$GPUCTL" --state-dir "$STATE" -i "$LAB/inventory.yaml" "$@"; }
if [ -t 1 ]; then
  step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
else
  step() { printf '\n==> %s\n' "$*"; }
fi
say() { printf '    %s\n' "$*"; }

# one field of `gpuctl jobs show JOB -o json` (a dotted path; "-" when null)
field() {
  gpuctl jobs show "$1" -o json | "$PYTHON" -c '
import json, sys
value = json.load(sys.stdin)
for key in sys.argv[1].split("."):
    value = value.get(key) if isinstance(value, dict) else None
print("-" if value is None else value)' "$2"
}

# run control-loop passes (one `gpuctl reconcile` each) until CONDITION holds, at most LIMIT s
reconcile_until() {
  local what=$1 limit=$2 condition=$3 began=$SECONDS
  while :; do
    gpuctl reconcile --grace "$GRACE" | sed 's/^/    /'
    if eval "$condition"; then return 0; fi
    if ((SECONDS - began > limit)); then
      echo "demo: $what did not happen within ${limit}s" >&2
      return 1
    fi
    sleep 1
  done
}

all_running_at() {  # every demo job runs, at incarnation N or later
  local job
  for job in "${JOBS[@]}"; do
    [ "$(field "$job" state)" = running ] || return 1
    [ "$(field "$job" incarnation)" -ge "$1" ] || return 1
  done
}

all_checkpointed() {
  local job
  for job in "${JOBS[@]}"; do [ "$(field "$job" checkpoint.step)" != - ] || return 1; done
}

# a job spec of examples/ for the demo: its name, its workdir (examples/) and its checkpoints in
# DEMO_DIR, so that nothing is left in /tmp
spec() {
  sed -e "s/^name: .*/name: $3/" -e "s|^workdir: \\.|workdir: $EXAMPLES|" \
    -e "s|^  dir: /tmp/gpuctl-checkpoints/|  dir: $CHECKPOINTS/|" "$EXAMPLES/$1" >"$SPECS/$2"
}

cleanup() {  # the lab stops with its jobs; then everything the demo wrote goes
  "$GPUCTL" lab down --dir "$LAB" >/dev/null 2>&1 || true
  rm -rf "$LAB" "$STATE" "$SPECS" "$CHECKPOINTS"
  rmdir "$DEMO_DIR" 2>/dev/null || true
}
trap cleanup EXIT

step "1. a lab fleet: 3 nodes of real sshd on loopback, 8 simulated H100s each"
cleanup  # what an earlier run left, if it was killed
mkdir -p -m 755 "$DEMO_DIR"
mkdir -p "$SPECS" && mkdir -m 1777 "$CHECKPOINTS"  # the lab user writes the checkpoints
"$GPUCTL" lab up --nodes 3 --dir "$LAB"

step "2. gpuctl status: every node answers, nothing allocated yet"
gpuctl status

step "3. submit three training jobs (examples/train.py: a checkpoint every 10 steps of 0.5 s)"
spec train-job.yaml train-job.yaml train-demo
spec train-job.yaml train-job-2.yaml train-demo-2
spec train-spot-job.yaml train-spot-job.yaml train-spot
gpuctl submit "$SPECS/train-job.yaml" "$SPECS/train-job-2.yaml" "$SPECS/train-spot-job.yaml"
gpuctl jobs list

step "4. the control loop (gpuctl reconcile, one pass a second) places and launches them"
reconcile_until "the jobs starting" 30 "all_running_at 1"
gpuctl jobs list

step "5. training... until each job has committed a checkpoint"
reconcile_until "the first checkpoints" 60 all_checkpointed
gpuctl jobs list
VICTIM=$(field train-demo node)

step "6. kill $VICTIM, the node running train-demo: its sshd and every process on it"
"$GPUCTL" lab kill "$VICTIM" --dir "$LAB"
say "for ${GRACE}s the node only counts as failing (sshd down is not a dead job);"
say "then it is down: its jobs restart elsewhere, from their newest committed checkpoint"
reconcile_until "the failover" 60 'all_running_at 1 && [ "$(field train-demo incarnation)" -ge 2 ]'

step "7. the jobs: same ids, the next incarnation, on the nodes still up"
gpuctl jobs list
gpuctl jobs show train-demo | sed -n '/^incarnations:/,/^$/p'

step "8. gpuctl status after the failover: the fleet, and the five numbers"
gpuctl status || [ $? -eq 3 ]  # exit 3: a node does not answer (the one killed)

step "9. train-demo's log: incarnation 2 resumed from the checkpoint, step after step"
sleep 2  # a few steps of the new incarnation
gpuctl logs train-demo | grep -E '^(train:|resumed|starting|step)' | head -4
echo "    ..."
gpuctl logs train-demo | tail -n 3

step "10. the store is consistent: gpuctl db check"
gpuctl db check

step "11. lab down (the jobs stop with their nodes), and $DEMO_DIR removed"
"$GPUCTL" lab down --dir "$LAB"
trap - EXIT
cleanup
