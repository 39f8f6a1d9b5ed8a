"""A lab fleet for tests and benchmarks: started in a folder the lab user can reach, torn down
after, however the block ends.

    with lab_fleet(nodes=3) as lab:
        transport.run(lab.spec("lab-01"), "nvidia-smi", timeout_s=5)
        lab.kill("lab-02")
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpuctl.core.model import NodeSpec
from gpuctl.lab import faults, fleet, sshd


@dataclasses.dataclass
class LabFleet:
    """A running lab: its folder, its nodes as `NodeSpec`s, and the fault switches."""

    dir: Path
    lab: fleet.Lab

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.lab.nodes)

    def spec(self, name: str, **overrides: Any) -> NodeSpec:
        """The node as the lab's inventory describes it; `overrides` replace NodeSpec fields."""
        node = self.lab.node(name)
        spec = NodeSpec(
            name=node.name,
            host=node.host,
            port=node.port,
            user=self.lab.user,
            key_file=str(self.lab.key_path),
            known_hosts=(str(self.lab.known_hosts_path),),
            labels={"lab": "true"},
            expected_gpus=node.gpus,
            expected_model=node.gpu_model,
        )
        return dataclasses.replace(spec, **overrides)

    def specs(self, **overrides: Any) -> tuple[NodeSpec, ...]:
        return tuple(self.spec(name, **overrides) for name in self.names)

    def host_key_public(self, name: str) -> Path:
        return self.lab.node_dir(name) / "ssh_host_ed25519_key.pub"

    def kill(self, name: str) -> int:
        killed = fleet.kill(self.dir, name)
        self.lab = fleet.load(self.dir)
        return killed

    def kill_sshd(self, name: str) -> int:
        """Only the node's sshd (and its sessions) dies; its jobs run on."""
        killed = faults.kill_sshd(self.dir, name)
        self.lab = fleet.load(self.dir)
        return killed

    def enclose(self, name: str) -> None:
        """Move the node into its own network namespace (needs root), ready for `partition`."""
        faults.enclose(self.dir, name)
        self.lab = fleet.load(self.dir)

    def partition(self, name: str) -> None:
        """The node's link goes down: it stops answering, its processes run on."""
        faults.partition(self.dir, name)
        self.lab = fleet.load(self.dir)

    def heal(self, name: str) -> None:
        faults.heal(self.dir, name)

    def revive(self, name: str) -> None:
        fleet.revive(self.dir, name)
        self.lab = fleet.load(self.dir)

    def freeze(self, name: str) -> None:
        fleet.freeze(self.dir, name)

    def thaw(self, name: str) -> None:
        fleet.thaw(self.dir, name)

    def inject(self, name: str, **faults: Any) -> None:
        fleet.inject(self.dir, name, **faults)

    def processes(self, *names: str) -> set[int]:
        """Live processes of the named nodes (default: all): their sshd with its sessions, and
        every process started on them."""
        table = sshd.ProcTable(fleet.STATE_ENV)
        pids: set[int] = set()
        for node in self.lab.nodes:
            if names and node.name not in names:
                continue
            if node.pid is not None and sshd.is_sshd_of(node.pid, self.lab.config_path(node.name)):
                pids |= {node.pid} | table.descendants(node.pid)
            pids |= table.with_env(str(self.lab.state_path(node.name)))
        return pids


@contextmanager
def lab_fleet(
    nodes: int = 3,
    *,
    gpus: int = 8,
    gpu_model: str = fleet.DEFAULT_GPU_MODEL,
    gpu_mem_gib: int = 80,
    parent: Path = Path("/tmp"),  # noqa: S108 - the lab user must reach it; pytest's tmp is 0700
) -> Iterator[LabFleet]:
    """Start a lab of `nodes` nodes in a fresh folder under `parent`; stop and remove it after."""
    lab_dir = Path(tempfile.mkdtemp(prefix="gpuctl-lab-", dir=parent))
    try:
        lab_dir.chmod(0o755)
        lab = fleet.up(
            lab_dir, nodes=nodes, gpus=gpus, gpu_model=gpu_model, gpu_mem_gib=gpu_mem_gib
        )
        yield LabFleet(dir=lab_dir, lab=lab)
    finally:
        try:
            fleet.down(lab_dir)
        finally:
            shutil.rmtree(lab_dir, ignore_errors=True)
