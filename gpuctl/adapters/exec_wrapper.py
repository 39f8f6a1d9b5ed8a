"""How a transport runs every remote command, as text: a wrapper that prints the command's
process group first (so the client can kill it, and everything it starts, when its own deadline
passes) and runs it under coreutils `timeout` as the backstop when the client is gone.

The remote command runs as `printf MARK$$; exec timeout -k 2 LIMIT sh -c COMMAND`: sshd starts
every session command in a new session, so `$$` is the process group of the command and everything
it starts (bar daemons that call `setsid`). A command that starts with the `SELF_BOUNDED` line
bounds every step it takes itself (the gather probe: each step under its own `timeout`) and runs
without that backstop, as `printf MARK$$; exec sh -c COMMAND`: two processes fewer per run (three
when the login shell is itself `sh`: it then runs the command with `eval`).

PURE: text in, text out. The SSH transport (`gpuctl.adapters.ssh`) sends it; the probe script says
it is self-bounded, and the launch script's size is measured inside it.
"""

from __future__ import annotations

import math
import shlex

PGID_MARK = b"\x1egpuctl-pgid="
SELF_BOUNDED = "# gpuctl: every step of this command has its own time limit\n"


def wrap_command(command: str, timeout_s: float) -> str:
    """The command line sent to sshd (`command` itself is already quoted by the caller)."""
    limit = math.ceil(timeout_s) + 2
    inner = shlex.quote(command)
    mark = PGID_MARK.decode("ascii").replace("\x1e", "\\036")
    if command.startswith(SELF_BOUNDED):
        # sshd runs `SHELL -c` with the shell's name as $0: a login shell that is `sh` runs the
        # command itself (one exec fewer, the same $0); any other hands it to sh
        return (
            f"printf '{mark}%s\\n' \"$$\"; gpuctl_c={inner}; "
            'case $0 in sh) eval "$gpuctl_c"; exit ;; esac; exec sh -c "$gpuctl_c"'
        )
    return (
        f"printf '{mark}%s\\n' \"$$\"; "
        f"command -v timeout >/dev/null 2>&1 && exec timeout -k 2 {limit} sh -c {inner}; "
        f"exec sh -c {inner}"
    )


def kill_command(pgid: int) -> str:
    # `kill -9 -PGID`: the one spelling dash, bash and zsh all read as "the process group"
    return f"kill -9 -{int(pgid)} 2>/dev/null || kill -9 {int(pgid)} 2>/dev/null; true"
