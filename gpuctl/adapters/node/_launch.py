"""The remote `sh` script that launches one incarnation of a job on a node, with the wrapper it
leaves there, and the parser of what it prints. PURE: no I/O; `gpuctl.adapters.node` sends it over
a `Transport`. The run dir it makes is laid out as `gpuctl.adapters.node._runs` says; every value
reaches the script as a positional parameter (`gpuctl.adapters.node._script`), and secret values
never appear on the command line: they travel on the launch command's stdin (`encode_secrets`).
"""

from __future__ import annotations

import base64
import dataclasses
import re
from collections.abc import Mapping

from gpuctl.adapters.exec_wrapper import wrap_command
from gpuctl.adapters.node._runs import check_incarnation, check_job_id
from gpuctl.adapters.node._script import (
    TILDE_FUNCTION,
    RemoteCommand,
    check_text,
    marked_lines,
    sh_command,
)
from gpuctl.core.jobs.model import LaunchRequest
from gpuctl.errors import UsageError

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LAUNCH_WAIT_S = 10  # how long the launcher waits for the wrapper to record its pid
# sshd hands the command line (the exec wrapper's, which holds the launch command twice) to the
# node's login shell as one argument: Linux caps one at 128 KiB with its NUL (MAX_ARG_STRLEN).
# Longer fails with "Argument list too long"; past 256 KiB sshd drops the connection. Job specs
# are refused long before (`config.jobspec_files.MAX_LAUNCH_BYTES`); this guards stored ones.
MAX_COMMAND_LINE_BYTES = 128 * 1024 - 1

# The wrapper: leader of the job's session. It records its pid and start time, runs the job in a
# subshell that `exec`s it (so a builtin name cannot run inside the wrapper, and the job gets
# default signal dispositions), and records the exit status atomically. Its traps only keep it
# alive through TERM/USR1 sent to the group, so that it can record how the job ended. Before its
# pid it records the job's checkpoint dir (absolute), which the observe script looks into.
_WRAPPER = r"""d=$1; shift
trap : HUP INT TERM USR1 USR2
gpuctl_start() {
  { IFS= read -r l <"/proc/$$/stat"; } 2>/dev/null || return 0
  l=${l##*") "}; set -f; set -- $l; set +f; printf %s "${20}"
}
c=${GPUCTL_CHECKPOINT_DIR-}
case $c in '' | /*) ;; *) c="$PWD/$c" ;; esac
printf '%s\n' "$c" >"$d/checkpoint_dir.tmp" && mv -f "$d/checkpoint_dir.tmp" "$d/checkpoint_dir"
printf '%s %s\n' "$$" "$(gpuctl_start)" >"$d/pid.tmp" && mv -f "$d/pid.tmp" "$d/pid"
date +%s >"$d/started.tmp" && mv -f "$d/started.tmp" "$d/started"
(exec "$@")
c=$?
printf '%s\n' "$c" >"$d/exit.tmp" && mv -f "$d/exit.tmp" "$d/exit"
"""

# Positional parameters: WRAPPER JOB N WORKDIR MPS_LIMIT NENV ENV... -- ARGV...
# stdin: a count line, then that many `NAME=base64(value)` lines (the secret env).
_LAUNCH = (
    TILDE_FUNCTION
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
class LaunchOutcome:
    """What the launch script reported: `started` (pid known), `refused` (this incarnation was
    already launched on the node), `failed` (nothing started: `reason`), or `unknown` (the wrapper
    did not record its pid in time: re-observe, never re-launch)."""

    result: str
    pid: int | None = None
    run_dir: str | None = None
    mps_limited: bool = False
    reason: str | None = None


def _check_env(what: str, env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not ENV_NAME_RE.fullmatch(name):
            raise UsageError(f"{what}: {name!r} is not a valid environment variable name")
        check_text(f"{what}: {name}", value)


def contract_env(request: LaunchRequest) -> dict[str, str]:
    """The checkpoint contract's variables (design.md), as the job sees them."""
    return {
        "GPUCTL_JOB_ID": request.job_id,
        "GPUCTL_INCARNATION": str(request.incarnation),
        "CUDA_VISIBLE_DEVICES": request.cuda_visible_devices,
        "GPUCTL_MEM_LIMIT_MIB": str(request.mib_per_card),
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
        check_text(f"job {request.job_id}: command", arg)
    if request.workdir is not None and not check_text("workdir", request.workdir):
        raise UsageError(f"job {request.job_id}: workdir is empty")
    if isinstance(request.mib_per_card, bool) or request.mib_per_card < 0:
        raise UsageError(f"job {request.job_id}: mib_per_card must be 0 or more")
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
    command = sh_command(_LAUNCH, "gpuctl-launch", args)
    size = command_line_bytes(command)
    if size > MAX_COMMAND_LINE_BYTES:
        raise UsageError(
            f"job {request.job_id}: the launch command line is {size:,} bytes, over the "
            f"{MAX_COMMAND_LINE_BYTES:,} a node's shell takes: its command, env, workdir or "
            "checkpoint dir is too long"
        )
    return RemoteCommand(command, encode_secrets(secrets))


def command_line_bytes(command: str) -> int:
    """The size of `command` as sshd hands it to the node's shell: inside the exec wrapper."""
    return len(wrap_command(command, 10.0**6).encode("utf-8"))  # the longest time limit


def parse_launch(stdout: bytes) -> LaunchOutcome:
    lines = marked_lines(stdout, "gpuctl-launch")
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
