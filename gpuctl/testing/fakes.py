"""Shipped fakes of gpuctl's own protocols, for tests and demos."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuctl.adapters.protocols import ExecResult
from gpuctl.core.model import NodeSpec

Script = ExecResult | Exception | Callable[[NodeSpec, str], ExecResult]


@dataclass
class FakeTransport:
    """Answers from a script per node name; refuses anything unscripted (loudly, as a test failure).

    `calls` records (node name, command) in call order; `stdins` what each call had on stdin.
    """

    script: Mapping[str, Script]
    calls: list[tuple[str, str]] = field(default_factory=list)
    stdins: list[bytes | None] = field(default_factory=list)
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(
        self,
        node: NodeSpec,
        command: str,
        *,
        timeout_s: float,
        max_output_bytes: int = 8 << 20,
        stdin: bytes | None = None,
    ) -> ExecResult:
        with self._lock:
            self.calls.append((node.name, command))
            self.stdins.append(stdin)
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


@dataclass
class ShellTransport:
    """Runs commands with the local `sh`, as if on the node: each node name maps to the extra
    environment of that node (e.g. the lab's `PATH`, `GPUCTL_LAB_STATE`, `GPUCTL_LAB_NODE`).

    A real shell below the Transport protocol, without sshd: for unit tests of gather, probe and
    the job runner. `stdin` is written to the shell's standard input (else it reads end-of-file).
    """

    envs: Mapping[str, Mapping[str, str]]
    calls: list[tuple[str, str]] = field(default_factory=list)

    def run(
        self,
        node: NodeSpec,
        command: str,
        *,
        timeout_s: float,
        max_output_bytes: int = 8 << 20,
        stdin: bytes | None = None,
    ) -> ExecResult:
        import os
        import subprocess
        import time

        if node.name not in self.envs:
            raise AssertionError(f"ShellTransport: no environment for node {node.name!r}")
        self.calls.append((node.name, command))
        env = {**os.environ, **self.envs[node.name]}
        start = time.monotonic()
        done = subprocess.run(
            ["/bin/sh", "-c", command],
            env=env,
            input=stdin if stdin is not None else b"",
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        out = done.stdout[:max_output_bytes]
        return ExecResult(
            exit_code=done.returncode,
            stdout=out,
            stderr=done.stderr[:max_output_bytes],
            duration_s=time.monotonic() - start,
            truncated=len(done.stdout) > max_output_bytes,
        )

    def close(self) -> None:
        pass


def fake_node_env(
    folder: Path,
    name: str,
    *,
    gpus: int = 2,
    model: str = "NVIDIA H100 80GB HBM3",
    index: int = 0,
    tools: Path | None = None,
) -> dict[str, str]:
    """The environment of one node run with the local `sh`: its own GPU state file and HOME under
    `folder/name`, the lab's fake `nvidia-smi` (installed into `tools`, default `folder/bin`)."""
    from gpuctl.lab import node_tools, nodestate

    tools = tools or folder / "bin"
    if not (tools / "nvidia-smi").exists():
        node_tools.install_node_tools(tools, python="/usr/bin/python3")
    state = folder / name / "state.json"
    state.parent.mkdir(parents=True)
    nodestate.write_state(
        state, nodestate.new_node_state(name, gpus=gpus, model=model, mem_gib=80, node_index=index)
    )
    home = folder / name / "home"
    home.mkdir()
    return {
        "PATH": f"{tools}:/usr/bin:/bin",
        "GPUCTL_LAB_STATE": str(state),
        "GPUCTL_LAB_NODE": name,
        "HOME": str(home),
    }


def shell_fleet(
    folder: Path, names: Sequence[str], *, gpus: int = 2, model: str = "NVIDIA H100 80GB HBM3"
) -> tuple[Path, ShellTransport]:
    """Nodes that run commands with the local `sh` and answer the probe with the lab's fake
    `nvidia-smi` (each its own state file and HOME under `folder`), and their inventory file."""
    envs: dict[str, dict[str, str]] = {}
    lines = ["nodes:"]
    for i, name in enumerate(names):
        envs[name] = fake_node_env(folder, name, gpus=gpus, model=model, index=i)
        lines.append(f"  - {{name: {name}, host: 127.0.0.1, port: {2201 + i}, gpus: {gpus}}}")
    inventory = folder / "fleet.yaml"
    inventory.write_text("\n".join(lines) + "\n")
    return inventory, ShellTransport(envs)
