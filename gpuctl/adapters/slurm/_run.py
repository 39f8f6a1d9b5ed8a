"""Running Slurm's commands where the inventory says: on this machine, or over SSH on a login node
through gpuctl's transport (the node's host key verified, the command under gpuctl's deadline).
Every argument is quoted (`shlex.join`); `SLURM_CONF` travels in the command line, since sshd
drops environment requests. The one place gpuctl runs a Slurm command: reading the cluster now,
`sbatch` (its secrets and batch script on stdin), `scancel`, `scontrol update` and the reads
of a job's output and exit marker, all through `SlurmCommands.run`.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from gpuctl.adapters.protocols import Transport
from gpuctl.core.model import SlurmSource
from gpuctl.errors import GpuctlError

DEFAULT_TIMEOUT_S = 30.0
MAX_OUTPUT_BYTES = 64 * 1024 * 1024


class SlurmError(GpuctlError):
    """A Slurm command could not be run or failed (one line naming the command; `stderr`: what
    a command that exited non-zero wrote there, at most 4 KiB)."""

    def __init__(self, message: str, *, hint: str | None = None, stderr: str = "") -> None:
        super().__init__(message, hint=hint)
        self.stderr = stderr


class SlurmCommands:
    """Runs Slurm commands for one `SlurmSource` (`local`, or `ssh` on its login node)."""

    def __init__(
        self,
        source: SlurmSource,
        transport: Transport | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if source.via == "ssh" and (source.login is None or transport is None):
            raise SlurmError("slurm: via ssh needs a login node and a transport")
        self.source = source
        self._transport = transport
        self._timeout_s = timeout_s

    def command_line(self, argv: list[str]) -> str:
        """The shell command line run on the login node (every part quoted)."""
        env = f"SLURM_CONF={shlex.quote(self.source.conf)} " if self.source.conf else ""
        return env + shlex.join(argv)

    def run(self, argv: list[str], *, stdin: bytes | None = None, shown: str = "") -> str:
        """`argv`'s standard output (`stdin`: what it reads; `shown`: how errors name it, by
        default the command line). Raises SlurmError when it cannot run, exits non-zero or
        passes the deadline (a TransportError when the login node cannot be reached)."""
        shown = shown or shlex.join(argv)
        if self.source.via == "ssh":
            assert self._transport is not None and self.source.login is not None
            result = self._transport.run(
                self.source.login,
                self.command_line(argv),
                timeout_s=self._timeout_s,
                max_output_bytes=MAX_OUTPUT_BYTES,
                stdin=stdin,
            )
            code, out, err = result.exit_code, result.stdout, result.stderr
            if result.truncated:
                raise SlurmError(f"`{shown}` on {self.source.login.name}: output over the limit")
        else:
            env = dict(os.environ)
            if self.source.conf:
                env["SLURM_CONF"] = self.source.conf
            try:
                done = subprocess.run(
                    argv,
                    input=stdin if stdin is not None else b"",
                    capture_output=True,
                    timeout=self._timeout_s,
                    env=env,
                    check=False,
                )
            except FileNotFoundError:
                raise SlurmError(
                    f"`{shown}`: {argv[0]} not found",
                    hint="install Slurm's client commands (Debian: slurm-client), or read the "
                    "cluster over SSH on a login node (slurm: {via: ssh, login: ...})",
                ) from None
            except subprocess.TimeoutExpired:
                raise SlurmError(f"`{shown}`: no answer within {self._timeout_s:g}s") from None
            code, out, err = done.returncode, done.stdout, done.stderr
        if code != 0:
            why = _first_line(err) or _first_line(out) or "no message"
            where = f" on {self.source.login.name}" if self.source.login is not None else ""
            raise SlurmError(
                f"`{shown}`{where} failed (exit {code}): {why}",
                stderr=err[:4096].decode("utf-8", "replace"),
            )
        return out.decode("utf-8", "replace")


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    line = text.splitlines()[0] if text else ""
    return "".join(c for c in line if c.isprintable())[:300]
