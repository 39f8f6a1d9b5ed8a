"""The protocols adapters implement. Tests fake these, never paramiko or pynvml call by call."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from gpuctl.core.model import NodeSpec


@dataclasses.dataclass(frozen=True, slots=True)
class ExecResult:
    """What a remote command returned. `truncated` is set when output passed the byte limit."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    duration_s: float
    truncated: bool = False


class Transport(Protocol):
    """Runs one shell command on one node.

    `command` is a complete POSIX shell command line whose every variable part was quoted by the
    caller (`shlex.quote` / `shlex.join`). Raises a `gpuctl.errors.TransportError` subclass when the
    node cannot be reached, refuses, fails auth, has an untrusted host key, or a deadline passes
    (the remote command is then killed on the node). Implementations are thread-safe and reuse
    connections between calls.
    """

    def run(
        self, node: NodeSpec, command: str, *, timeout_s: float, max_output_bytes: int = 8 << 20
    ) -> ExecResult: ...

    def close(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...

    def monotonic(self) -> float: ...
