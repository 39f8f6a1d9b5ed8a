"""Remote `sh` scripts that start, watch, signal and read jobs on a node, and parsers of what they
print. PURE: no I/O; `gpuctl.ops.jobrunner` sends these over a `Transport`.

Every script is a constant; the values that vary (job id, incarnation, argv, env, paths) reach it
as positional parameters through `shlex.quote`, so a value is never parsed as shell code. Secret
values never appear on a command line: they travel on the launch command's stdin.

Layout on the node, per incarnation (`RUNS_DIR` under `$HOME`, 0700):

    ~/.gpuctl/runs/<job_id>/<n>/
        launch.lock   claimed atomically (mkdir) by the one launch of this incarnation
        run.sh        the wrapper (constant text, no secrets)
        pid           "<pgid> <start time>": the wrapper, leader of the job's own session/group
        started       epoch seconds
        log           the job's stdout and stderr (appended)
        exit          the job's exit status, written atomically by the wrapper when it ends
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

from gpuctl.core import checkpoints
from gpuctl.core.jobs import CheckpointMarker, LaunchRequest, RunStatus
from gpuctl.errors import UsageError

RUNS_DIR = ".gpuctl/runs"  # under the node user's $HOME
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
SIGNALS = frozenset({"TERM", "USR1", "KILL"})
MARKER_NAME = checkpoints.MARKER_NAME
MAX_MARKER_BYTES = checkpoints.MAX_MARKER_BYTES
MAX_MANIFEST_FILES = 4096
MAX_LOG_CHUNK_BYTES = 16 << 20
LAUNCH_WAIT_S = 10  # how long the launcher waits for the wrapper to record its pid

# -- shared shell functions -----------------------------------------------------------------------

# gpuctl_st PID: sets st_state, st_pgrp, st_start from /proc/PID/stat (the fields after the
# command name, which may itself hold spaces and parentheses).
# gpuctl_alive DIR JOB N: is the incarnation of DIR running? Its recorded leader is alive with the
# recorded start time (a recycled pid has another), or the leader is gone but a live member of its
# process group carries GPUCTL_JOB_ID=JOB and GPUCTL_INCARNATION=N (a worker the job left behind).
# Sets p (the process group id).
# `~` and `~/...` in a path mean the node user's $HOME (as a shell assignment would read them);
# the value is rewritten in place, without a fork. `$1` is always a literal variable name.
_TILDE = r"""
gpuctl_tilde() {
  eval "gpuctl_v=\${$1}"
  case $gpuctl_v in "~") gpuctl_v=$HOME ;; "~/"*) gpuctl_v="$HOME/${gpuctl_v#"~/"}" ;; esac
  eval "$1=\$gpuctl_v"
}
"""

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

# -- launch ---------------------------------------------------------------------------------------

# The wrapper: leader of the job's session. It records its pid and start time, runs the job in a
# subshell that `exec`s it (so a builtin name cannot run inside the wrapper, and the job gets
# default signal dispositions), and records the exit status atomically. Its traps only keep it
# alive through TERM/USR1 sent to the group, so that it can record how the job ended.
_WRAPPER = r"""d=$1; shift
trap : HUP INT TERM USR1 USR2
gpuctl_start() {
  { IFS= read -r l <"/proc/$$/stat"; } 2>/dev/null || return 0
  l=${l##*") "}; set -f; set -- $l; set +f; printf %s "${20}"
}
printf '%s %s\n' "$$" "$(gpuctl_start)" >"$d/pid.tmp" && mv -f "$d/pid.tmp" "$d/pid"
date +%s >"$d/started.tmp" && mv -f "$d/started.tmp" "$d/started"
(exec "$@")
c=$?
printf '%s\n' "$c" >"$d/exit.tmp" && mv -f "$d/exit.tmp" "$d/exit"
"""

# Positional parameters: WRAPPER JOB N WORKDIR MPS_LIMIT NENV ENV... -- ARGV...
# stdin: a count line, then that many `NAME=base64(value)` lines (the secret env).
_LAUNCH = (
    _TILDE
    + r"""
say() { printf 'gpuctl-launch %s\n' "$*"; }
[ -n "${HOME:-}" ] || { say failed "HOME is not set on the node"; exit 0; }
umask 077
w=$1 job=$2 n=$3 wd=$4 mps=$5 nenv=$6
shift 6
gpuctl_tilde wd
runs="$HOME/.gpuctl/runs"
d="$runs/$job/$n"
if ! mkdir -p "$runs/$job" 2>/dev/null || ! chmod 700 "$HOME/.gpuctl" "$runs" "$runs/$job"; then
  say failed "cannot create $runs/$job"; exit 0
fi
made=
mkdir "$d" 2>/dev/null && made=1
if [ -e "$d/pid" ] || ! mkdir "$d/launch.lock" 2>/dev/null; then say refused "$d"; exit 0; fi
fail() {
  rmdir "$d/launch.lock" 2>/dev/null
  rm -f "$d/run.sh"
  [ -z "$made" ] || rmdir "$d" 2>/dev/null
  say failed "$1"; exit 0
}
IFS= read -r count || count=0
case $count in '' | *[!0-9]*) fail "secret env: bad framing on stdin" ;; esac
k=0
while [ "$k" -lt "$count" ]; do
  IFS= read -r line || fail "secret env: stdin ended early"
  name=${line%%=*}
  case $name in '' | [0-9]* | *[!A-Za-z0-9_]*) fail "secret env: bad name" ;; esac
  v=$(printf '%s' "${line#*=}" | base64 -d 2>/dev/null && echo .) || fail "secret env: bad value"
  eval "gpuctl_sn_$k=\$name gpuctl_sv_$k=\${v%.}"
  k=$((k + 1))
done
unset line v name
cd "${wd:-$HOME}" 2>/dev/null || fail "working directory ${wd:-\$HOME} not found"
printf '%s' "$w" >"$d/run.sh" || fail "cannot write $d/run.sh"
limited=0
if [ -n "$mps" ] && [ -p "${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control" ]; then limited=1; fi
(
  i=0
  while [ "$i" -lt "$nenv" ]; do
    e=$1 v=${1#*=}
    case $v in "~" | "~/"*) gpuctl_tilde v; e="${1%%=*}=$v" ;; esac
    export "$e"; shift; i=$((i + 1))
  done
  shift
  i=0
  while [ "$i" -lt "$count" ]; do
    eval "nm=\$gpuctl_sn_$i vl=\$gpuctl_sv_$i"; export "$nm=$vl"; i=$((i + 1))
  done
  unset nm vl
  [ "$limited" = 0 ] || export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="$mps"
  exec setsid -f sh "$d/run.sh" "$d" "$@"
) </dev/null >>"$d/log" 2>&1 || fail "setsid failed to start the job"
t=0
while [ ! -s "$d/pid" ]; do
  t=$((t + 1))
  [ "$t" -le __TRIES__ ] || { say unknown "$d"; exit 0; }
  sleep 0.01 2>/dev/null || sleep 1
done
read -r p s <"$d/pid"
say started "$p" "$limited" "$d"
""".replace("__TRIES__", str(LAUNCH_WAIT_S * 100))
)


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteCommand:
    """A command line for `Transport.run` and what to write on its stdin (None: nothing)."""

    command: str
    stdin: bytes | None = None

    def __repr__(self) -> str:  # stdin may hold secrets
        return f"RemoteCommand(command={self.command!r}, stdin=<{len(self.stdin or b'')} bytes>)"


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchOutcome:
    """What the launch script reported: `started` (pid known), `refused` (this incarnation was
    already launched on the node), `failed` (nothing started: `reason`), or `unknown` (the wrapper
    did not record its pid in time: re-observe, never re-launch)."""

    result: str
    pid: int | None = None
    run_dir: str | None = None
    mps_limited: bool = False
    reason: str | None = None


def _sh(script: str, name: str, args: Iterable[str]) -> str:
    return shlex.join(["sh", "-c", script, name, *args])


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


def _check_text(what: str, value: str) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise UsageError(f"{what} is not valid: text without NUL characters")
    return value


def _check_env(what: str, env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not ENV_NAME_RE.fullmatch(name):
            raise UsageError(f"{what}: {name!r} is not a valid environment variable name")
        _check_text(f"{what}: {name}", value)


def contract_env(request: LaunchRequest) -> dict[str, str]:
    """The checkpoint contract's variables (design.md), as the job sees them."""
    return {
        "GPUCTL_JOB_ID": request.job_id,
        "GPUCTL_INCARNATION": str(request.incarnation),
        "CUDA_VISIBLE_DEVICES": request.cuda_visible_devices,
        "GPUCTL_MEM_LIMIT_MIB": str(request.mem_limit_mib),
        "GPUCTL_CHECKPOINT_DIR": request.checkpoint_dir,
        "GPUCTL_RESUME_FROM": request.resume_from,
    }


def mps_limit(request: LaunchRequest) -> str:
    """`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for the job's devices (ordinals as the job enumerates
    them after CUDA_VISIBLE_DEVICES), or "" when no MPS limit is asked for."""
    if request.mps_limit_mib is None:
        return ""
    count = len([d for d in request.cuda_visible_devices.split(",") if d.strip()])
    return ",".join(f"{i}={int(request.mps_limit_mib)}M" for i in range(count))


def encode_secrets(secrets: Mapping[str, str]) -> bytes:
    """The launch script's stdin: a count line, then `NAME=base64(value)` lines."""
    lines = [str(len(secrets))]
    for name, value in sorted(secrets.items()):
        lines.append(f"{name}={base64.b64encode(value.encode('utf-8')).decode('ascii')}")
    return ("\n".join(lines) + "\n").encode("ascii")


def launch_command(request: LaunchRequest) -> RemoteCommand:
    """The launch of one incarnation: user env, then secrets, then the contract (which wins)."""
    check_job_id(request.job_id)
    check_incarnation(request.incarnation)
    if not request.argv or not request.argv[0]:
        raise UsageError(f"job {request.job_id}: command is empty")
    for arg in request.argv:
        _check_text(f"job {request.job_id}: command", arg)
    if request.workdir is not None and not _check_text("workdir", request.workdir):
        raise UsageError(f"job {request.job_id}: workdir is empty")
    if isinstance(request.mem_limit_mib, bool) or request.mem_limit_mib < 0:
        raise UsageError(f"job {request.job_id}: mem_limit_mib must be 0 or more")
    if request.mps_limit_mib is not None and request.mps_limit_mib <= 0:
        raise UsageError(f"job {request.job_id}: mps_limit_mib must be more than 0")
    _check_env(f"job {request.job_id}: env", request.env)
    _check_env(f"job {request.job_id}: secret_env", request.secret_env)
    contract = contract_env(request)
    _check_env(f"job {request.job_id}: contract", contract)
    env = {k: v for k, v in request.env.items() if k not in request.secret_env}
    env = {k: v for k, v in env.items() if k not in contract}
    pairs = [f"{k}={v}" for k, v in env.items()] + [f"{k}={v}" for k, v in contract.items()]
    secrets = {k: v for k, v in request.secret_env.items() if k not in contract}
    args = [
        _WRAPPER,
        request.job_id,
        str(request.incarnation),
        request.workdir or "",
        mps_limit(request),
        str(len(pairs)),
        *pairs,
        "--",
        *request.argv,
    ]
    return RemoteCommand(_sh(_LAUNCH, "gpuctl-launch", args), encode_secrets(secrets))


def _marked_lines(stdout: bytes, mark: str) -> list[list[str]]:
    """Lines that start with `mark ` (login shells may print other things first)."""
    text = stdout.decode("utf-8", errors="replace")  # bounded by the transport's output cap
    return [line.split(" ")[1:] for line in text.splitlines() if line.startswith(mark + " ")]


def parse_launch(stdout: bytes) -> LaunchOutcome:
    lines = _marked_lines(stdout, "gpuctl-launch")
    if not lines:
        return LaunchOutcome("unknown", reason="the launch script printed no result")
    fields = lines[-1]
    kind, rest = fields[0], fields[1:]
    if kind == "started" and len(rest) >= 3 and rest[0].isdigit():
        return LaunchOutcome(
            "started", pid=int(rest[0]), run_dir=" ".join(rest[2:]), mps_limited=rest[1] == "1"
        )
    if kind in ("refused", "unknown"):
        return LaunchOutcome(kind, run_dir=" ".join(rest))
    if kind == "failed":
        return LaunchOutcome("failed", reason=" ".join(rest)[:500])
    return LaunchOutcome("unknown", reason="the launch script printed an unexpected result")


# -- observe --------------------------------------------------------------------------------------

_OBSERVE = (
    _FUNCTIONS
    + r"""
runs="${HOME:-/nonexistent}/.gpuctl/runs"
for d in "$runs"/*/*; do
  [ -d "$d" ] || continue
  n=${d##*/} j=${d%/*}; j=${j##*/}
  case $n in '' | *[!0-9]*) continue ;; esac
  case $j in '' | *[!A-Za-z0-9._-]*) continue ;; esac
  a=0 x=-
  if gpuctl_alive "$d" "$j" "$n"; then a=1; fi
  [ -n "$p" ] || p=-
  if [ -f "$d/exit" ]; then read -r x <"$d/exit" || x=-; fi
  printf 'gpuctl-run %s %s %s %s %s %s\n' "$j" "$n" "$p" "$a" "${x:--}" "$d"
done
"""
)


def observe_command() -> RemoteCommand:
    """ONE exec listing every incarnation's run dir on the node."""
    return RemoteCommand(_sh(_OBSERVE, "gpuctl-observe", []))


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() and len(text) < 19 else None


def parse_observe(stdout: bytes) -> list[RunStatus]:
    out = []
    for fields in _marked_lines(stdout, "gpuctl-run"):
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
            )
        )
    return sorted(out, key=lambda r: (r.job_id, r.incarnation))


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
    return RemoteCommand(_sh(_SIGNAL, "gpuctl-signal", args))


def parse_signal(stdout: bytes) -> bool:
    lines = _marked_lines(stdout, "gpuctl-signal")
    return bool(lines) and lines[-1][:1] == ["delivered"]


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
    return RemoteCommand(_sh(_LOGS, "gpuctl-logs", args))


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


# -- checkpoints ----------------------------------------------------------------------------------

# Positional parameters: DIR MAX. Prints the newest MAX step folders (by step number), each with
# its marker base64-encoded on one line when the marker is there and small enough.
_LIST_CHECKPOINTS = (
    _TILDE
    + r"""
d=$1; gpuctl_tilde d
cd "$d" 2>/dev/null || { echo "gpuctl-ckpt nodir"; exit 0; }
for s in step-*; do
  case $s in step- | step-*[!0-9]*) continue ;; esac
  [ -d "$s" ] && printf '%s\n' "$s"
done | sort -t- -k2,2n | tail -n "$2" | while IFS= read -r s; do
  m="$s/COMMITTED"
  # a folder removed while it is listed (the job pruned an old checkpoint) is not listed
  if [ ! -f "$m" ]; then [ -d "$s" ] && echo "gpuctl-ckpt none $s"; continue; fi
  z=$(wc -c <"$m" 2>/dev/null) || continue
  if [ "$z" -gt __MAX__ ]; then echo "gpuctl-ckpt big $s"; continue; fi
  b=$(base64 <"$m" 2>/dev/null) || continue
  printf 'gpuctl-ckpt marker %s %s\n' "$s" "$(printf '%s' "$b" | tr -d '\n')"
done
""".replace("__MAX__", str(MAX_MARKER_BYTES))
)

# Positional parameters: DIR. stdin: pairs of lines (index, path relative to DIR).
_HASH = (
    _TILDE
    + r"""
d=$1; gpuctl_tilde d
cd "$d" 2>/dev/null || { echo "gpuctl-ckpt nodir"; exit 0; }
while IFS= read -r i && IFS= read -r f; do
  if [ -f "$f" ] && h=$(sha256sum <"$f" 2>/dev/null); then
    echo "gpuctl-sum $i ${h%% *}"
  else
    echo "gpuctl-sum $i missing"
  fi
done
"""
)


@dataclasses.dataclass(frozen=True, slots=True)
class Listed:
    """One step folder as listed on the node: its marker's bytes (None: no marker, or `problem`)
    and the marker's fields as `gpuctl.core.checkpoints.parse_marker` reads them."""

    name: str
    step: int
    marker: bytes | None
    fields: checkpoints.MarkerFields | None
    problem: str | None = None


def list_checkpoints_command(checkpoint_dir: str, max_count: int) -> RemoteCommand:
    _check_text("checkpoint dir", checkpoint_dir)
    if not checkpoint_dir:
        raise UsageError("checkpoint dir is empty")
    args = [checkpoint_dir, str(max(1, int(max_count)))]
    return RemoteCommand(_sh(_LIST_CHECKPOINTS, "gpuctl-checkpoints", args))


def parse_checkpoint_listing(stdout: bytes) -> list[Listed] | None:
    """The listed step folders, newest first, or None when the checkpoint dir does not exist."""
    out = []
    for fields in _marked_lines(stdout, "gpuctl-ckpt"):
        if fields == ["nodir"]:
            return None
        if len(fields) < 2:
            continue
        name = fields[1]
        step = checkpoints.step_of_dir(name)
        if step is None or "/" in name:
            continue
        if fields[0] == "none":
            out.append(Listed(name, step, None, None))
        elif fields[0] == "big":
            out.append(Listed(name, step, None, None, "unreadable marker: too large"))
        elif fields[0] == "marker" and len(fields) == 3 and fields[2]:
            try:
                raw = base64.b64decode(fields[2], validate=True)
            except (ValueError, binascii.Error):
                out.append(Listed(name, step, None, None, "unreadable marker: garbled listing"))
                continue
            out.append(Listed(name, step, raw, checkpoints.parse_marker(raw)))
    return sorted(out, key=lambda c: c.step, reverse=True)


def hash_command(checkpoint_dir: str, listed: Sequence[Listed]) -> RemoteCommand:
    """sha256 of every file the listed markers name, computed on the node; the paths travel on
    stdin (no length limit of a command line, no quoting)."""
    lines = []
    for ci, item in enumerate(listed):
        if item.fields is None or not item.fields.ok:
            continue
        for fi, (name, _digest) in enumerate(item.fields.files):
            if checkpoints.valid_file_name(name):
                lines += [f"{ci}.{fi}", f"{item.name}/{name}"]
    stdin = ("\n".join(lines) + "\n").encode("utf-8") if lines else b""
    return RemoteCommand(_sh(_HASH, "gpuctl-verify", [checkpoint_dir]), stdin)


def parse_hashes(stdout: bytes) -> dict[str, str]:
    """index -> sha256 (or "missing")."""
    out = {}
    for fields in _marked_lines(stdout, "gpuctl-sum"):
        if len(fields) == 2 and (fields[1] == "missing" or SHA256_RE.fullmatch(fields[1])):
            out[fields[0]] = fields[1]
    return out


def verify(
    checkpoint_dir: str, listed: Sequence[Listed], sums: Mapping[str, str]
) -> list[CheckpointMarker]:
    """Listed folders and their on-node checksums -> markers (`judge_checkpoint`), newest first."""
    out = []
    for ci, item in enumerate(listed):
        path = posixpath.join(checkpoint_dir, item.name)
        if item.problem is not None:
            out.append(CheckpointMarker(path, None, item.step, None, False, item.problem))
            continue
        actual: dict[str, str | None] = {}
        if item.fields is not None:
            for fi, (name, _digest) in enumerate(item.fields.files):
                got = sums.get(f"{ci}.{fi}")
                actual[name] = None if got in (None, "missing") else got
        out.append(checkpoints.judge_checkpoint(path, item.marker, actual))
    return out
