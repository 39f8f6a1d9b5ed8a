"""A remote `sh` script as gpuctl sends it to a node, and what all of gpuctl's scripts share: the
command line with its stdin (`RemoteCommand`, `sh_command`), the `gpuctl_tilde` shell function,
the check on text a script takes as a parameter, and the reading of the lines a script marks in
its output. PURE: no I/O. The scripts: `gpuctl.adapters.node._runs` (observe, signal, logs),
`gpuctl.adapters.node._launch` (launch) and `gpuctl.adapters.node._checkpoints` (checkpoint
folders).

Every script is a constant; the values that vary reach it as positional parameters through
`shlex.quote` (`sh_command`), so a value is never parsed as shell code.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterable

from gpuctl.errors import UsageError

# `~` and `~/...` in a path mean the node user's $HOME (as a shell assignment would read them);
# the value is rewritten in place, without a fork. `$1` is always a literal variable name.
TILDE_FUNCTION = r"""
gpuctl_tilde() {
  eval "gpuctl_v=\${$1}"
  case $gpuctl_v in "~") gpuctl_v=$HOME ;; "~/"*) gpuctl_v="$HOME/${gpuctl_v#"~/"}" ;; esac
  eval "$1=\$gpuctl_v"
}
"""


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteCommand:
    """A command line for `Transport.run` and what to write on its stdin (None: nothing)."""

    command: str
    stdin: bytes | None = None

    def __repr__(self) -> str:  # stdin may hold secrets
        return f"RemoteCommand(command={self.command!r}, stdin=<{len(self.stdin or b'')} bytes>)"


def sh_command(script: str, name: str, args: Iterable[str]) -> str:
    return shlex.join(["sh", "-c", script, name, *args])


def check_text(what: str, value: str) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise UsageError(f"{what} is not valid: text without NUL characters")
    return value


def marked_lines(stdout: bytes, mark: str) -> list[list[str]]:
    """Lines that start with `mark ` (login shells may print other things first)."""
    text = stdout.decode("utf-8", errors="replace")  # bounded by the transport's output cap
    return [line.split(" ")[1:] for line in text.splitlines() if line.startswith(mark + " ")]
