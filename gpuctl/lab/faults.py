"""Lab faults beyond node death: sshd killed while the node's jobs run on, and a network
partition (the node behind a link that goes down, in network namespaces of its own).

    kill_sshd(DIR, "lab-02")     # sshd and its sessions die; jobs live; revive() restarts sshd
    partition(DIR, "lab-02")     # the node's link goes down: no answers, its jobs run on
    heal(DIR, "lab-02")          # the link comes back

`enclose` moves a node into its namespace ahead of time (then the jobs launched on it run there
too); `partition` encloses a node that is not yet. See `gpuctl.lab.netns` for the plumbing.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

from gpuctl.errors import LabError
from gpuctl.lab import fleet, netns, record
from gpuctl.lab import sshd as sshd_mod
from gpuctl.lab.record import Lab, LabNode

__all__ = ["enclose", "heal", "kill_sshd", "partition"]


def kill_sshd(lab_dir: Path, name: str) -> int:
    """Kill only the node's sshd and its SSH sessions: the jobs started on it run on (sshd down
    does not mean its jobs are dead). Revive it with `revive`."""
    lab_dir = lab_dir.absolute()
    with record.locked(lab_dir):
        lab = fleet.load(lab_dir)
        node = lab.node(name)
        killed = _stop_sshd(lab, node)
        record.save(lab.with_node(dataclasses.replace(node, pid=None)))
    return killed


def _stop_sshd(lab: Lab, node: LabNode) -> int:
    """SIGKILL the node's sshd with its sessions; how many processes were killed."""
    if node.pid is None or not sshd_mod.is_sshd_of(node.pid, lab.config_path(node.name)):
        return 0
    # stop the tree first, so that nothing forks or is re-parented while it is gathered
    tree = {node.pid}
    while True:
        sshd_mod.signal_all(tree, signal.SIGSTOP)
        table = sshd_mod.ProcTable(fleet.STATE_ENV)
        found = tree.union(*(table.descendants(p) for p in tree))
        if found == tree:
            break
        tree = found
    sshd_mod.signal_all(tree, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while any(sshd_mod.alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(tree)


def enclose(lab_dir: Path, name: str, *, timeout_s: float = 10.0) -> LabNode:
    """Move the node into its own network namespace behind a link (up): its sshd restarts there
    (same host key, same address and port for gpuctl, through a relay). Jobs already running
    stay where they are; jobs launched from now on run inside the namespace."""
    lab_dir = lab_dir.absolute()
    with record.locked(lab_dir):
        lab = fleet.load(lab_dir)
        node = lab.node(name)
        if node.netns is not None and netns.exists(node.netns):
            return node
        netns.check_available()
        _stop_sshd(lab, node)
        node_ns, relay_ns = netns.create(lab.dir, name)
        node = dataclasses.replace(node, pid=None, netns=node_ns, relay_pid=None)
        try:
            lab = _start_enclosed(lab, node, relay_ns, timeout_s)
        except BaseException:
            _undo(lab.with_node(node), node, node_ns, relay_ns)
            raise
        return lab.node(name)


def _start_enclosed(lab: Lab, node: LabNode, relay_ns: str, timeout_s: float) -> Lab:
    fleet._write_config(lab, node, sshd_mod.sshd_version(Path(lab.sshd)))
    log = lab.log_path(node.name)
    offset = sshd_mod.log_size(log)
    pid = sshd_mod.spawn_sshd(Path(lab.sshd), lab.config_path(node.name), log, netns=node.netns)
    node = dataclasses.replace(node, pid=pid)
    lab = lab.with_node(node)
    record.save(lab)
    why = sshd_mod.wait_listening(pid, log, time.monotonic() + timeout_s, offset=offset)
    if why is not None:
        raise LabError(f"{node.name}: sshd did not start in its namespace: {why}")
    node_dir = lab.node_dir(node.name)
    relay = netns.start_relay(relay_ns, node.host, node.port, node_dir, node_dir / "relay.log")
    lab = lab.with_node(dataclasses.replace(node, relay_pid=relay))
    record.save(lab)
    return lab


def _undo(lab: Lab, node: LabNode, node_ns: str, relay_ns: str) -> None:
    """Enclosing failed: back to a plain node (sshd on loopback) as before."""
    fleet._stop_nodes(lab, [node])
    netns.delete(node_ns, relay_ns)
    plain = dataclasses.replace(node, pid=None, netns=None, relay_pid=None)
    lab = lab.with_node(plain)
    record.save(lab)
    fleet._write_config(lab, plain, sshd_mod.sshd_version(Path(lab.sshd)))


def partition(lab_dir: Path, name: str) -> None:
    """Cut the node off: its link goes down (the node is enclosed first if it is not yet)."""
    node = enclose(lab_dir, name)
    assert node.netns is not None
    netns.set_link(node.netns, up=False)


def heal(lab_dir: Path, name: str) -> None:
    """Bring a partitioned node's link back up."""
    node = fleet.load(lab_dir).node(name)
    if node.netns is None:
        raise LabError(f"{name} is not partitioned", hint=f"gpuctl lab partition {name}")
    netns.set_link(node.netns, up=True)
