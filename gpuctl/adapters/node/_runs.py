"""Remote `sh` scripts that watch, signal and read jobs on a node, and parsers of what they
print. PURE: no I/O; `gpuctl.adapters.node` sends these over a `Transport`. The launch script
is `gpuctl.adapters.node._launch`, the checkpoint scripts `gpuctl.adapters.node._checkpoints`, and
what every script shares (the command line, `~`, marked output lines)
`gpuctl.adapters.node._script`.

Every script is a constant; the values that vary (job id, incarnation, argv, env, paths) reach it
as positional parameters through `shlex.quote`, so a value is never parsed as shell code. Secret
values never appear on a command line: they travel on the launch command's stdin.

Layout on the node, per incarnation (`RUNS_DIR` under `$HOME`, 0700):

    ~/.gpuctl/runs/<job_id>/<n>/
        launch.lock   claimed atomically (mkdir) by the one launch of this incarnation
        run.sh        the wrapper (constant text, no secrets)
        pid           "<pgid> <start time>": the wrapper, leader of the job's own session/group
        checkpoint_dir  the job's GPUCTL_CHECKPOINT_DIR, absolute (one line)
        started       epoch seconds
        log           the job's stdout and stderr (appended)
        exit          the job's exit status, written atomically by the wrapper when it ends
"""

from __future__ import annotations

import re

from gpuctl.adapters.node._script import RemoteCommand, marked_lines, sh_command
from gpuctl.core.jobs.model import CommitSeen, Fenced, JobProcess, RunStatus
from gpuctl.errors import UsageError

RUNS_DIR = ".gpuctl/runs"  # under the node user's $HOME
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SIGNALS = frozenset({"TERM", "USR1", "KILL"})
MAX_LOG_CHUNK_BYTES = 16 << 20

# -- shared shell functions -----------------------------------------------------------------------

# gpuctl_st PID: sets st_state, st_pgrp, st_start from /proc/PID/stat (the fields after the
# command name, which may itself hold spaces and parentheses).
# gpuctl_alive DIR JOB N: is the incarnation of DIR running? Its recorded leader is alive with the
# recorded start time (a recycled pid has another), or the leader is gone but a live member of its
# process group carries GPUCTL_JOB_ID=JOB and GPUCTL_INCARNATION=N (a worker the job left behind).
# Sets p (the process group id).
_FUNCTIONS = r"""
gpuctl_st() {
  { IFS= read -r l <"/proc/$1/stat"; } 2>/dev/null || return 1
  l=${l##*") "}
  set -f; set -- $l; set +f
  [ $# -ge 20 ] || return 1
  st_state=$1 st_pgrp=$3 st_start=${20}
}
gpuctl_ours() {
  nl='
'
  for f in /proc/[0-9]*/stat; do
    q=${f#/proc/}; q=${q%/stat}
    gpuctl_st "$q" || continue
    [ "$st_pgrp" = "$1" ] && [ "$st_state" != Z ] || continue
    e=$(tr '\000' '\n' <"/proc/$q/environ" 2>/dev/null) || continue
    case "$nl$e$nl" in *"${nl}GPUCTL_JOB_ID=$2$nl"*) ;; *) continue ;; esac
    case "$nl$e$nl" in *"${nl}GPUCTL_INCARNATION=$3$nl"*) return 0 ;; esac
  done
  return 1
}
gpuctl_alive() {
  p= s=
  { read -r p s <"$1/pid"; } 2>/dev/null || [ -n "$p" ] || return 1
  case $p in '' | *[!0-9]*) return 1 ;; esac
  if gpuctl_st "$p" && [ "$st_state" != Z ] && [ -n "$s" ] && [ "$st_start" = "$s" ]; then
    return 0
  fi
  kill -0 -"$p" 2>/dev/null || return 1
  gpuctl_ours "$p" "$2" "$3"
}
"""


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not JOB_ID_RE.fullmatch(job_id):
        raise UsageError(
            f"job id {job_id!r} is not valid: letters, digits, '.', '_' and '-', 1-64 characters, "
            "not starting with '.', '_' or '-'"
        )
    return job_id


def check_incarnation(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"incarnation {n!r} is not valid: a whole number from 1")
    return n


# -- observe --------------------------------------------------------------------------------------

_OBSERVE = (
    _FUNCTIONS
    + r"""
runs="${HOME:-/nonexistent}/.gpuctl/runs"
c=0
for d in "$runs"/*/*; do
  [ -d "$d" ] || continue
  n=${d##*/} j=${d%/*}; j=${j##*/}
  case $n in '' | *[!0-9]*) continue ;; esac
  case $j in '' | *[!A-Za-z0-9._-]*) continue ;; esac
  a=0 x=-
  if gpuctl_alive "$d" "$j" "$n"; then a=1; fi
  [ -n "$p" ] || p=-
  if [ -f "$d/exit" ]; then read -r x <"$d/exit" || x=-; fi
  k=
  if [ "$a" = 1 ] && { IFS= read -r k <"$d/checkpoint_dir"; } 2>/dev/null && [ -n "$k" ]; then
    b=
    for m in "$k"/step-*/COMMITTED; do
      [ -f "$m" ] || continue
      cs=${m%/COMMITTED}; cs=${cs##*/step-}
      case $cs in '' | *[!0-9]*) continue ;; esac
      if [ -z "$b" ] || ! [ "$b" -nt "$m" ]; then b=$m bs=$cs; fi
    done
    if [ -n "$b" ]; then
      t=$(date -r "$b" +%s.%N 2>/dev/null) || t=-
      printf 'gpuctl-commit %s %s %s %s\n' "$j" "$n" "$bs" "${t:--}"
    else
      printf 'gpuctl-commit %s %s - -\n' "$j" "$n"
    fi
  fi
  printf 'gpuctl-run %s %s %s %s %s %s\n' "$j" "$n" "$p" "$a" "${x:--}" "$d"
  c=$((c + 1))
done
printf 'gpuctl-observed %s\n' "$c"
"""
)


def observe_command() -> RemoteCommand:
    """ONE exec listing every incarnation's run dir on the node and, for each alive one whose
    launch recorded its checkpoint dir, the step and time of its most recently written `COMMITTED`
    marker (`gpuctl-commit JOB N STEP TIME`, `-` for none): a stat per folder, no marker read."""
    return RemoteCommand(sh_command(_OBSERVE, "gpuctl-observe", []))


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) < 19 else None


def parse_observe(stdout: bytes) -> list[RunStatus] | None:
    """The runs the observe script listed, or None when its output is not whole: the end line
    (`gpuctl-observed COUNT`) is missing or counts other lines than arrived. A listing cut short
    (sshd killed mid-session, a half-open connection) must never read as "those runs are gone"."""
    ends = marked_lines(stdout, "gpuctl-observed")
    listed = marked_lines(stdout, "gpuctl-run")
    if len(ends) != 1 or ends[0] != [str(len(listed))]:
        return None
    commits = _commits(marked_lines(stdout, "gpuctl-commit"))
    out = []
    for fields in listed:
        if len(fields) < 6:
            continue
        job_id, n, pid, alive, exit_code = fields[:5]
        if not JOB_ID_RE.fullmatch(job_id) or _int_or_none(n) is None:
            continue
        code = None if exit_code == "-" else _int_or_none(exit_code)
        out.append(
            RunStatus(
                job_id=job_id,
                incarnation=int(n),
                pid=_int_or_none(pid),
                alive=alive == "1",
                exit_code=code,
                run_dir=" ".join(fields[5:]),
                commit=commits.get((job_id, int(n))),
            )
        )
    return sorted(out, key=lambda r: (r.job_id, r.incarnation))


def _commits(lines: list[list[str]]) -> dict[tuple[str, int], CommitSeen]:
    """`gpuctl-commit JOB N STEP TIME` lines: (job, n) -> the newest commit seen (a line that does
    not parse says nothing: the loop then reads the markers on its own schedule)."""
    out = {}
    for fields in lines:
        if len(fields) != 4 or not JOB_ID_RE.fullmatch(fields[0]):
            continue
        n, step, at = _int_or_none(fields[1]), fields[2], fields[3]
        if n is None:
            continue
        if step == "-":
            out[(fields[0], n)] = CommitSeen(None, None)
        elif _int_or_none(step) is not None:
            out[(fields[0], n)] = CommitSeen(_int_or_none(step), _time_or_none(at))
    return out


def _time_or_none(text: str) -> float | None:
    if not re.fullmatch(r"[0-9]{1,12}(\.[0-9]{1,9})?", text):
        return None  # `-`, or a `date` without %N that printed it as it is
    return float(text)


# -- signal ---------------------------------------------------------------------------------------

_SIGNAL = (
    _FUNCTIONS
    + r"""
d="${HOME:-/nonexistent}/.gpuctl/runs/$1/$2"
if gpuctl_alive "$d" "$1" "$2" && kill -"$3" -"$p" 2>/dev/null; then
  echo "gpuctl-signal delivered $p"
else
  echo "gpuctl-signal not-alive"
fi
"""
)


def normalize_signal(signal: str) -> str:
    name = signal.upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise UsageError(f"signal {signal!r} is not one gpuctl sends: TERM, USR1 or KILL")
    return name


def signal_command(job_id: str, incarnation: int, signal: str) -> RemoteCommand:
    """Signal the process group of `<job_id>/<incarnation>` only if that incarnation is alive."""
    args = [check_job_id(job_id), str(check_incarnation(incarnation)), normalize_signal(signal)]
    return RemoteCommand(sh_command(_SIGNAL, "gpuctl-signal", args))


def parse_signal(stdout: bytes) -> bool:
    lines = marked_lines(stdout, "gpuctl-signal")
    return bool(lines) and lines[-1][:1] == ["delivered"]


# -- fence and the processes of jobs ---------------------------------------------------------------

# gpuctl_procs JOB N: one line "gpuctl-proc PID JOB N" per live process carrying a job's contract
# environment (JOB and N empty: every job). Found by environment, not by run dir: a copy whose run
# dir is gone, or a worker that left its process group, is still found. One grep reads every
# environ file; only the matches are read again. On a lab node (many nodes on one machine), a
# process is this node's when it carries the session's own GPUCTL_LAB_STATE (the node's state file,
# unique to one node of one lab); on a real node neither side has it.
_PROCS = r"""
gpuctl_procs_ok() {
  printf 'x\000' | grep -qzF x 2>/dev/null && return 0
  echo "this node's grep cannot read NUL-separated files (GNU or BusyBox grep -z)" >&2
  exit 3
}
gpuctl_procs() {
  me=${GPUCTL_LAB_STATE-}
  for f in $(grep -lzsF -e GPUCTL_JOB_ID= /proc/[0-9]*/environ 2>/dev/null); do
    q=${f#/proc/}; q=${q%/environ}
    gpuctl_st "$q" && [ "$st_state" != Z ] || continue
    e=$(tr '\000' '\n' <"$f" 2>/dev/null) || continue
    j= i= l=
    while IFS= read -r v; do
      case $v in
        GPUCTL_JOB_ID=*) j=${v#*=} ;;
        GPUCTL_INCARNATION=*) i=${v#*=} ;;
        GPUCTL_LAB_STATE=*) l=${v#*=} ;;
      esac
    done <<gpuctl_end
$e
gpuctl_end
    case $j in '' | *[!A-Za-z0-9._-]*) continue ;; esac
    case $i in '' | *[!0-9]*) continue ;; esac
    [ "$l" = "$me" ] || continue
    [ -z "$1" ] || [ "$j" = "$1" ] || continue
    [ -z "$2" ] || [ "$i" = "$2" ] || continue
    printf 'gpuctl-proc %s %s %s\n' "$q" "$j" "$i"
  done
}
"""

# Fence one incarnation: claim its launch lock first (a launch still in flight, delayed by a node
# that hung, is then refused), kill its process group (identity checked) and every process that
# carries its job id and incarnation, and look again until none is left or the tries run out.
_FENCE = (
    _FUNCTIONS
    + _PROCS
    + r"""
umask 077
gpuctl_procs_ok
runs="${HOME:-/nonexistent}/.gpuctl/runs"
d="$runs/$1/$2"
mkdir -p "$d" 2>/dev/null && mkdir "$d/launch.lock" 2>/dev/null
killed=0 left=0 t=0
while :; do
  found=
  if gpuctl_alive "$d" "$1" "$2" && kill -KILL -"$p" 2>/dev/null; then found=1; fi
  for q in $(gpuctl_procs "$1" "$2" | cut -d " " -f 2); do
    kill -KILL "$q" 2>/dev/null && found=1
  done
  [ -n "$found" ] || { left=0; break; }
  killed=1 left=1 t=$((t + 1))
  [ "$t" -le __TRIES__ ] || break
  sleep 0.05 2>/dev/null || sleep 1
done
printf 'gpuctl-fence %s %s\n' "$killed" "$left"
"""
).replace("__TRIES__", "40")

_PROCESSES = (
    _FUNCTIONS
    + _PROCS
    + r"""
gpuctl_procs_ok
c=0
while IFS= read -r l; do
  [ -n "$l" ] || continue
  printf '%s\n' "$l"
  c=$((c + 1))
done <<gpuctl_end
$(gpuctl_procs "" "")
gpuctl_end
printf 'gpuctl-procs %s\n' "$c"
"""
)


def fence_command(job_id: str, incarnation: int) -> RemoteCommand:
    """Kill every process of `<job_id>/<incarnation>` on the node and report whether any is left."""
    args = [check_job_id(job_id), str(check_incarnation(incarnation))]
    return RemoteCommand(sh_command(_FENCE, "gpuctl-fence", args))


def parse_fence(stdout: bytes) -> Fenced | None:
    """What the fence found, or None when its report did not arrive whole."""
    lines = marked_lines(stdout, "gpuctl-fence")
    if len(lines) != 1 or len(lines[0]) != 2 or not all(x in ("0", "1") for x in lines[0]):
        return None
    killed, left = lines[0]
    return Fenced(killed=int(killed), remaining=int(left))


def processes_command() -> RemoteCommand:
    """ONE exec listing every live process on the node that carries a job's contract env."""
    return RemoteCommand(sh_command(_PROCESSES, "gpuctl-processes", []))


def parse_processes(stdout: bytes) -> list[JobProcess] | None:
    """The job processes listed, or None when the listing did not arrive whole."""
    ends = marked_lines(stdout, "gpuctl-procs")
    listed = marked_lines(stdout, "gpuctl-proc")
    if len(ends) != 1 or ends[0] != [str(len(listed))]:
        return None
    out = []
    for fields in listed:
        if len(fields) != 3:
            return None
        pid, job_id, n = fields
        if _int_or_none(pid) is None or _int_or_none(n) is None or not JOB_ID_RE.fullmatch(job_id):
            return None
        out.append(JobProcess(job_id=job_id, incarnation=int(n), pid=int(pid)))
    return sorted(out, key=lambda x: (x.job_id, x.incarnation, x.pid))


# -- logs -----------------------------------------------------------------------------------------

_LOGS = r"""
d="${HOME:-/nonexistent}/.gpuctl/runs/$1/$2"
[ -d "$d" ] || { echo "gpuctl-log missing"; exit 0; }
[ -f "$d/log" ] || { echo "gpuctl-log 0"; exit 0; }
size=$(wc -c <"$d/log")
echo "gpuctl-log $((size + 0))"
tail -c +"$(($3 + 1))" "$d/log" | head -c "$4"
"""


def logs_command(job_id: str, incarnation: int, offset: int, limit: int) -> RemoteCommand:
    if offset < 0 or limit < 0:
        raise UsageError("log offset and limit must be 0 or more")
    args = [
        check_job_id(job_id),
        str(check_incarnation(incarnation)),
        str(int(offset)),
        str(min(int(limit), MAX_LOG_CHUNK_BYTES)),
    ]
    return RemoteCommand(sh_command(_LOGS, "gpuctl-logs", args))


def parse_logs(stdout: bytes, offset: int, limit: int) -> tuple[bytes, int] | None:
    """(bytes from `offset`, next offset), or None when the incarnation has no run dir."""
    start = stdout.find(b"gpuctl-log ")  # the header precedes the log's own bytes
    end = stdout.find(b"\n", start)
    if start < 0 or end < 0:
        return (b"", offset)
    if stdout[start + len(b"gpuctl-log ") : end].strip() == b"missing":
        return None
    data = stdout[end + 1 :][: min(limit, MAX_LOG_CHUNK_BYTES)]
    return data, offset + len(data)
