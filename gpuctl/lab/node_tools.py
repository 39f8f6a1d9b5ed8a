"""The lab node's fake `nvidia-smi` and `dmesg` as installed on its PATH, and their fast path.

`install_node_tools` writes the Python fake (`fake_nvidia_smi.py`, copied) and one `sh` wrapper
per tool; `render_answers` pre-renders, beside the node state file, the idle answers to the
probe's own invocations, which the wrappers print without starting Python.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any

from gpuctl.errors import LabError

FAKE_SCRIPT = ".fake_nvidia_smi.py"
ANSWERS_FILE = "answers.sh"  # beside the state file: pre-rendered idle answers of the fake tools
RUN_DIR_ENV = "GPUCTL_LAB_RUN_DIR"  # a folder of the node for the fake tools' runtime memo
GRANT_MEMO = "granted"  # in it: the last probe run's look for GPU-granted processes

_PYTHON = re.compile(r"/[A-Za-z0-9._/+-]{1,200}")


def install_node_tools(bin_dir: Path, *, python: str) -> None:
    """Write the fake `nvidia-smi` and `dmesg` into `bin_dir` (mode 0755).

    Each tool is a small `sh` wrapper: an invocation that the lab pre-rendered (the probe's own
    queries, on a node where no process holds a GPU grant) is answered by the shell from the
    node's `answers.sh` (see `render_answers`), as fast as a real driver; anything else runs
    the Python fake (`#!<python> -IS`), which reads the state file and `/proc`.
    """
    if not _PYTHON.fullmatch(python):
        raise LabError(f"python {python!r}: must be an absolute path without spaces")
    source = (Path(__file__).parent / "fake_nvidia_smi.py").read_text(encoding="utf-8")
    lines = source.split("\n")
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    files = {
        FAKE_SCRIPT: (f"#!{python} -IS\n" + "\n".join(lines), 0o644),
        "nvidia-smi": (_wrapper("nvidia-smi", python, check_busy=True), 0o755),
        "dmesg": (_wrapper("dmesg", python, check_busy=False), 0o755),
    }
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, (body, mode) in files.items():
        target = bin_dir / name
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=bin_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body)
                os.fchmod(f.fileno(), mode)
            Path(tmp).replace(target)
        except BaseException:
            with contextlib.suppress(OSError):
                Path(tmp).unlink()
            raise


# --- pre-rendered answers: the fast path of the fake tools -------------------------------------


def _probe_invocations() -> dict[str, list[str]]:
    """The exact argument lists gpuctl's probe passes to `nvidia-smi`, by answer file name."""
    from gpuctl.adapters.probe import script

    fmt = "--format=csv,nounits"
    combined = [
        *script.GPU_FIELDS,
        *(f for f in script.GPU_HEALTH_FIELDS if f not in script.GPU_FIELDS),
    ]
    return {
        "gpu-all": ["--query-gpu=" + ",".join(combined), fmt],
        "gpu": ["--query-gpu=" + ",".join(script.GPU_FIELDS), fmt],
        "gpu-health": ["--query-gpu=" + ",".join(script.GPU_HEALTH_FIELDS), fmt],
        "apps": ["--query-compute-apps=" + ",".join(script.APP_FIELDS), fmt],
        "version": ["--version"],
    }


def _wrapper(tool: str, python: str, *, check_busy: bool) -> str:
    if tool == "dmesg":
        cases = f"  '') k={_function('dmesg')} ;;\n"
    else:
        cases = "".join(
            f"  {shlex.quote(' '.join(args))}) k={_function(key)} ;;\n"
            for key, args in _probe_invocations().items()
        )
    # a process of this node holding a GPU grant changes memory and processes
    idle = " && idle" if check_busy else ""
    return (
        "#!/bin/sh\n"
        f"# gpuctl lab: fake {tool}. The idle answers to the probe's own invocations are\n"
        f"# pre-rendered in {ANSWERS_FILE} beside the node state (read at once by the shell);\n"
        "# anything else, a fault, or a process of this node holding a GPU grant goes to the\n"
        "# Python fake (reads the state and /proc).\n"
        "d=${GPUCTL_LAB_STATE%/*}\n"
        'case "$*" in\n' + cases + "  *) k= ;;\n"
        "esac\n" + (_IDLE if check_busy else "") + "answers=\n"
        f'if [ -n "$k" ] && [ -f "$d/{ANSWERS_FILE}" ]; then . "$d/{ANSWERS_FILE}"; fi\n'
        f'if [ -n "$answers" ]{idle}; then "$k"; exit 0; fi\n'
        f'exec {python} -IS "${{0%/*}}/{FAKE_SCRIPT}" {tool} "$@"\n'
    )


# Few processes hold a grant: look for those first, then whose node they are. The probe asks
# nvidia-smi twice or more per run and names each run (GPUCTL_PROBE_RUN): on a node with a
# runtime folder (GPUCTL_LAB_RUN_DIR, set by the lab's sshd), the first call's finding serves the
# run's later calls, as the scan costs a grep over every process's environment. A call outside a
# probe run (a test, a terminal) or without the folder (the tests' local-shell fleet) looks.
_IDLE = r"""idle() {  # true when no process of this node holds a GPU grant
  memo=
  if [ -n "${GPUCTL_PROBE_RUN:-}" ] && [ -n "${@RUNENV@:-}" ]; then memo=$@RUNENV@/@MEMO@; fi
  if [ -n "$memo" ] && read -r mr mb 2>/dev/null <"$memo" && [ "$mr" = "$GPUCTL_PROBE_RUN" ]; then
    case $mb in 0) return 0 ;; 1) return 1 ;; esac
  fi
  b=0
  for f in $(grep -lzs '^CUDA_VISIBLE_DEVICES=' /proc/[0-9]*/environ); do
    if grep -qzsxF "GPUCTL_LAB_NODE=$GPUCTL_LAB_NODE" "$f"; then b=1; break; fi
  done
  if [ -n "$memo" ]; then { printf '%s %s\n' "$GPUCTL_PROBE_RUN" "$b" >"$memo"; } 2>/dev/null; fi
  [ "$b" = 0 ]
}
""".replace("@RUNENV@", RUN_DIR_ENV).replace("@MEMO@", GRANT_MEMO)


def _function(key: str) -> str:
    """The shell function in the answers file that prints one answer."""
    return "answer_" + key.replace("-", "_")


def _idle_answers(state: dict[str, Any]) -> dict[str, str] | None:
    """What the fake tools print for the probe's invocations on an idle node; None when the
    answers cannot be fixed in advance (a fault makes every call different, or one fails)."""
    from gpuctl.lab import fake_nvidia_smi as fake

    faults = state.get("faults") or {}
    if faults.get("garbage") or faults.get("hang"):
        return None
    answers: dict[str, str] = {}
    for key, args in _probe_invocations().items():
        buf = io.StringIO()
        if fake.smi_main(args, state=state, out=buf, scan=False) != 0:
            return None
        answers[key] = buf.getvalue()
    buf = io.StringIO()
    fake.dmesg_main([], state=state, out=buf)
    answers["dmesg"] = buf.getvalue()
    return answers


def render_answers(state_path: Path, state: dict[str, Any]) -> None:
    """Pre-render the idle answers of the probe's invocations beside the state file.

    Called after every state write. The answers file is one shell file of functions that print
    them, replaced atomically (rename), so a reader sees old or new answers, never a mix; faults
    that make answers dynamic (garbage, hang) render a file without answers, so the Python fake
    handles every call.
    """
    lines = [
        "# gpuctl lab: idle answers of the fake tools, rendered from the node state by gpuctl",
        "answers=",
    ]
    answers = _idle_answers(state)
    if answers is not None:
        for key, text in answers.items():
            lines.append(f"{_function(key)}() {{ printf %s {shlex.quote(text)}; }}")
        lines.append("answers=1")
    with contextlib.suppress(FileNotFoundError):  # a lab started by an older gpuctl: its tools
        (state_path.parent / "answers" / "valid").unlink()  # would serve the old answers
    target = state_path.parent / ANSWERS_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{ANSWERS_FILE}.", dir=state_path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            os.fchmod(f.fileno(), 0o644)  # the lab user reads it, whatever the umask
        Path(tmp).replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise
