"""What `gpuctl lab up` records in `DIR/lab.json` (nodes, ports, sshd pids, the lab user), and the
file helpers of the lab: atomic writes and folders with explicit modes, one lock per lab folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from gpuctl.adapters.files import write_atomic
from gpuctl.errors import LabError

LAB_FILE = "lab.json"
_FORMAT = 1


@dataclasses.dataclass(frozen=True, slots=True)
class LabNode:
    name: str
    index: int
    host: str
    port: int
    pid: int | None  # the node's sshd; None while killed or stopped
    gpus: int
    gpu_model: str
    gpu_mem_gib: int
    netns: str | None = None  # the node's network namespace, once enclosed (gpuctl lab partition)
    relay_pid: int | None = None  # the relay to its sshd across the namespace's link


@dataclasses.dataclass(frozen=True, slots=True)
class Lab:
    """What `lab.json` records. Paths derive from `dir`."""

    dir: Path
    user: str
    sshd: str
    nodes: tuple[LabNode, ...]

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.yaml"

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def key_path(self) -> Path:
        return self.dir / "id_ed25519"

    def node_dir(self, name: str) -> Path:
        return self.dir / "nodes" / name

    def config_path(self, name: str) -> Path:
        return self.node_dir(name) / "sshd_config"

    def state_path(self, name: str) -> Path:
        return self.node_dir(name) / "state.json"

    def log_path(self, name: str) -> Path:
        return self.node_dir(name) / "sshd.log"

    def node(self, name: str) -> LabNode:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes) or "none"
        raise LabError(f"{self.dir / LAB_FILE}: no node {name!r} (nodes: {known})")

    def with_node(self, node: LabNode) -> Lab:
        nodes = tuple(node if n.name == node.name else n for n in self.nodes)
        return dataclasses.replace(self, nodes=nodes)


# -- lab.json ----------------------------------------------------------------------------------


def load(lab_dir: Path) -> Lab:
    lab_dir = lab_dir.absolute()
    path = lab_dir / LAB_FILE
    try:
        data = json.loads(path.read_text())
        return Lab(
            dir=lab_dir,
            user=str(data["user"]),
            sshd=str(data["sshd"]),
            nodes=tuple(LabNode(**n) for n in data["nodes"]),
        )
    except FileNotFoundError:
        raise LabError(
            f"{path}: no lab here", hint=f"start one with: gpuctl lab up --dir {lab_dir}"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(f"{path}: unreadable lab record: {exc}") from None


def save(lab: Lab) -> None:
    doc = {
        "format": _FORMAT,
        "user": lab.user,
        "sshd": lab.sshd,
        "nodes": [dataclasses.asdict(n) for n in lab.nodes],
    }
    write_atomic(lab.dir / LAB_FILE, json.dumps(doc, indent=2) + "\n", mode=0o644)


def mkdir(path: Path, *, parents: bool = False, exist_ok: bool = False) -> None:
    """A folder the lab user can enter, whatever the umask."""
    path.mkdir(parents=parents, exist_ok=exist_ok)
    path.chmod(0o755)


@contextlib.contextmanager
def locked(lab_dir: Path) -> Iterator[None]:
    """One lab-changing command at a time per folder."""
    fd = os.open(lab_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
