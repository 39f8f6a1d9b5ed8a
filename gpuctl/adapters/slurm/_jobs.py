"""A gpuctl job run by Slurm: `sbatch` with gpuctl's batch script, the job's state from `squeue`
and its exit marker, its output file, `scancel`. Every command goes through `SlurmCommands.run`
(locally, or over SSH on the login node), every argument quoted.

What travels where:

- `sbatch` runs inside a small `sh` prologue (`_PROLOGUE`) that makes the job's run dir,
  `$HOME/.gpuctl/slurm/<job id>` (0700) on the submitting account's home, reads the secret
  values from its **stdin** (a count line, then `NAME=base64(value)` lines), exports them and
  `exec`s `sbatch --export=ALL`: the values are in sbatch's own process environment, which Slurm
  keeps with the job and hands to every run of it (a requeue too), never on a command line (`ps`)
  nor in the batch script (which Slurm keeps on disk). The rest of stdin is the batch script.
- The batch script (`batch_script`, no secret in it) exports the checkpoint contract
  (`GPUCTL_JOB_ID`, `GPUCTL_CHECKPOINT_DIR`, `GPUCTL_MEM_LIMIT_MIB`, and `GPUCTL_INCARNATION`
  as `SLURM_RESTART_COUNT + 1`), leaves `GPUCTL_RESUME_FROM` unset (so `gpuctl.checkpoint`
  resumes from the newest committed checkpoint it finds; Slurm, not gpuctl, restarts it) and
  `CUDA_VISIBLE_DEVICES` to Slurm, runs the command and writes `exit` (`INCARNATION CODE`) in
  the run dir when it ends. Output goes to `output.log` there (`--output`, appended across runs).

The run dir must be on a file system the job's node and the login node (or this machine, `via:
local`) share: gpuctl reads the output and the exit marker there.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence

from gpuctl.adapters.slurm._parse import _Fields, _job_state, document
from gpuctl.adapters.slurm._run import SlurmCommands, SlurmError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SLURM_ID = re.compile(r"^\d+(_\d+)?$")
MAX_LOG_READ = 4 * 1024 * 1024  # bytes of output read per call

_PROLOGUE = r"""umask 077
job=$1; shift
d="$HOME/.gpuctl/slurm/$job"
mkdir -p "$d" && chmod 700 "$HOME/.gpuctl" "$HOME/.gpuctl/slurm" "$d" \
  || { echo "cannot create $d" >&2; exit 1; }
IFS= read -r count || count=0
case $count in '' | *[!0-9]*) echo "secret env: bad framing" >&2; exit 1 ;; esac
k=0
while [ "$k" -lt "$count" ]; do
  IFS= read -r line || { echo "secret env: stdin ended early" >&2; exit 1; }
  name=${line%%=*}
  case $name in '' | [0-9]* | *[!A-Za-z0-9_]*) echo "secret env: bad name" >&2; exit 1 ;; esac
  v=$(printf '%s' "${line#*=}" | base64 -d 2>/dev/null && echo .) \
    || { echo "secret env: bad value" >&2; exit 1; }
  export "$name=${v%.}"
  k=$((k + 1))
done
unset line v name count k
GPUCTL_RUN_DIR=$d; export GPUCTL_RUN_DIR
printf 'gpuctl-run-dir %s\n' "$d"
exec sbatch --parsable --export=ALL --requeue --open-mode=append --output="$d/output.log" "$@"
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Submitted:
    slurm_id: str
    run_dir: str


@dataclasses.dataclass(frozen=True, slots=True)
class SlurmJobState:
    """One job as `squeue --json` lists it: its state word (RUNNING, PENDING...), nodes, the
    reason Slurm gives (`state_reason`, "None" dropped) and how often it was restarted."""

    slurm_id: str
    state: str
    nodes: str | None = None
    reason: str | None = None
    restarts: int = 0


def batch_script(
    *,
    job_id: str,
    argv: Sequence[str],
    checkpoint_dir: str,
    mib_per_card: int,
    env: Mapping[str, str],
    header: Sequence[str] = (),
) -> str:
    """The batch script: `header` lines (`#SBATCH ...`), the contract, the command, the exit
    marker. No secret goes in it (they come through sbatch's environment)."""
    for name in env:
        if not _NAME.match(name):
            raise SlurmError(f"job {job_id}: env {name!r} is not a variable name")
    lines = ["#!/bin/sh", *header, f"# gpuctl job {job_id}: Slurm runs it, gpuctl tracks it"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += [
        f"export GPUCTL_JOB_ID={shlex.quote(job_id)}",
        f"export GPUCTL_CHECKPOINT_DIR={shlex.quote(checkpoint_dir)}",
        f"export GPUCTL_MEM_LIMIT_MIB={int(mib_per_card)}",
        "GPUCTL_INCARNATION=$(( ${SLURM_RESTART_COUNT:-0} + 1 )); export GPUCTL_INCARNATION",
        "unset GPUCTL_RESUME_FROM",
        "d=${GPUCTL_RUN_DIR:?}",
        'rm -f "$d/exit"',
        f"{shlex.join(argv)} </dev/null",
        "c=$?",
        'printf \'%s %s\\n\' "$GPUCTL_INCARNATION" "$c" >"$d/exit.tmp"',
        'mv -f "$d/exit.tmp" "$d/exit"',
        'exit "$c"',
    ]
    return "\n".join(lines) + "\n"


def encode_secrets(secrets: Mapping[str, str]) -> bytes:
    lines = [str(len(secrets))]
    for name, value in sorted(secrets.items()):
        if not _NAME.match(name):
            raise SlurmError(f"secret {name!r} is not a variable name")
        lines.append(f"{name}={base64.b64encode(value.encode('utf-8')).decode('ascii')}")
    return ("\n".join(lines) + "\n").encode("ascii")


def sbatch(
    commands: SlurmCommands,
    *,
    job_id: str,
    options: Sequence[str],
    script: str,
    secrets: Mapping[str, str],
    workdir: str | None = None,
) -> Submitted:
    """Submit `script` with `options`; its Slurm id and run dir. SlurmError when sbatch
    refuses (its first line)."""
    if not _JOB_ID.match(job_id):
        raise SlurmError(f"job id {job_id!r} is not one gpuctl makes")
    args = list(options) + ([f"--chdir={workdir}"] if workdir else [])
    stdin = encode_secrets(secrets) + script.encode("utf-8")
    out = commands.run(
        ["sh", "-c", _PROLOGUE, "sh", job_id, *args],
        stdin=stdin,
        shown=shlex.join(["sbatch", *args]),
    )
    run_dir, slurm_id = None, None
    for line in out.splitlines():
        if line.startswith("gpuctl-run-dir "):
            run_dir = line.removeprefix("gpuctl-run-dir ")
        elif line.strip():
            slurm_id = line.strip().split(";")[0]
    if run_dir is None or slurm_id is None or not _SLURM_ID.match(slurm_id):
        raise SlurmError(f"sbatch: no job id in its answer {out.strip()[:200]!r}")
    return Submitted(slurm_id, run_dir)


def job_states(commands: SlurmCommands, ids: Sequence[str]) -> dict[str, SlurmJobState]:
    """The jobs of `ids` that `squeue --json` lists (a job Slurm forgot is left out)."""
    if not ids:
        return {}
    items, _, _ = document(commands.run(["squeue", "--json"]), "squeue --json", "jobs")
    wanted, out = set(ids), {}
    for item in items:
        if not isinstance(item, Mapping) or str(item.get("job_id")) not in wanted:
            continue
        f = _Fields("squeue --json", f"job {item.get('job_id')}", item, [])
        reason = f.text("state_reason")
        restarts = f.number("restart_cnt")
        out[str(item["job_id"])] = SlurmJobState(
            slurm_id=str(item["job_id"]),
            state=_job_state(f),
            nodes=f.text("nodes"),
            reason=None if reason in (None, "None") else reason,
            restarts=int(restarts or 0),
        )
    return out


def exit_marker(commands: SlurmCommands, run_dir: str) -> tuple[int, int] | None:
    """(incarnation, exit code) from the run dir's `exit`; None when there is none."""
    out = commands.run(["sh", "-c", 'cat "$1/exit" 2>/dev/null; true', "sh", run_dir])
    fields = out.split()
    if len(fields) == 2 and all(f.lstrip("-").isdigit() for f in fields):
        return int(fields[0]), int(fields[1])
    return None


def read_output(commands: SlurmCommands, path: str, offset: int) -> bytes:
    """The job's output file from byte `offset` (at most `MAX_LOG_READ` bytes); b"" when none."""
    script = 'tail -c +"$2" "$1" 2>/dev/null | head -c "$3" | base64; true'
    out = commands.run(["sh", "-c", script, "sh", path, str(offset + 1), str(MAX_LOG_READ)])
    try:
        return base64.b64decode("".join(out.split()))
    except ValueError:
        raise SlurmError(f"reading {path}: not base64") from None


def scancel(commands: SlurmCommands, slurm_id: str) -> None:
    if not _SLURM_ID.match(slurm_id):
        raise SlurmError(f"{slurm_id!r} is not a Slurm job id")
    commands.run(["scancel", slurm_id])
