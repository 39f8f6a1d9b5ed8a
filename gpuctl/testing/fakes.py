"""Shipped fakes of gpuctl's own protocols, for tests and demos."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuctl.adapters.protocols import ExecResult
from gpuctl.core.model import NodeSpec

Script = ExecResult | Exception | Callable[[NodeSpec, str], ExecResult]


@dataclass
class FakeTransport:
    """Answers from a script per node name; refuses anything unscripted (loudly, as a test failure).

    `calls` records (node name, command) in call order.
    """

    script: Mapping[str, Script]
    calls: list[tuple[str, str]] = field(default_factory=list)
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(
        self, node: NodeSpec, command: str, *, timeout_s: float, max_output_bytes: int = 8 << 20
    ) -> ExecResult:
        with self._lock:
            self.calls.append((node.name, command))
        if node.name not in self.script:
            raise AssertionError(f"FakeTransport: no script for node {node.name!r}")
        answer = self.script[node.name]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, ExecResult):
            return answer
        return answer(node, command)

    def close(self) -> None:
        self.closed = True
