"""A jump host (bastion) in front of a lab node that this machine cannot reach directly.

    b = bastion.start(DIR, "lab-02")   # lab-02 behind b: only b reaches it
    b.ssh_config("lab-02", alias="lab-02-behind")  # ssh_config text for the pair
    bastion.stop(b)

The node is enclosed (its sshd in its own network namespace, `gpuctl.lab.netns`) and its relay
stopped, so nothing on this machine reaches its sshd: connecting there is refused. The bastion's
sshd runs in the relay's namespace, across the link from the node (it reaches the node at
169.254.0.2:PORT, with TCP forwarding for the lab user), and a relay forwards 127.0.0.1:PORT here
to it. Needs root and iproute2, as a partition does.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

from gpuctl.adapters.files import write_atomic
from gpuctl.errors import LabError
from gpuctl.lab import faults, fleet, netns, record
from gpuctl.lab import sshd as sshd_mod

HOST = "127.0.0.1"


@dataclasses.dataclass(frozen=True, slots=True)
class Bastion:
    dir: Path
    port: int  # on 127.0.0.1 here
    node_addr: str  # the node's sshd as the bastion reaches it
    node_port: int
    sshd_pid: int
    relay_pid: int
    user: str
    key_path: Path

    @property
    def host_key_public(self) -> Path:
        return self.dir / "ssh_host_ed25519_key.pub"

    def ssh_config(self, alias: str, *, bastion_alias: str = "bastion") -> str:
        """ssh_config text: `alias` reaches the node through `bastion_alias`."""
        return (
            f"Host {bastion_alias}\n  HostName {HOST}\n  Port {self.port}\n  User {self.user}\n"
            f"  IdentityFile {self.key_path}\n\n"
            f"Host {alias}\n  HostName {self.node_addr}\n  Port {self.node_port}\n"
            f"  User {self.user}\n  IdentityFile {self.key_path}\n  ProxyJump {bastion_alias}\n"
        )


def start(lab_dir: Path, name: str, *, timeout_s: float = 10.0) -> Bastion:
    lab_dir = lab_dir.absolute()
    node = faults.enclose(lab_dir, name, timeout_s=timeout_s)
    assert node.netns is not None
    _, relay_ns = netns.names(lab_dir, name)
    with record.locked(lab_dir):
        lab = fleet.load(lab_dir)
        node = lab.node(name)
        fleet._stop_relay(lab, node)  # this machine no longer reaches the node
        record.save(lab.with_node(dataclasses.replace(node, relay_pid=None)))
    folder = lab.dir / f"bastion-{name}"
    folder.mkdir(mode=0o755, exist_ok=True)
    sshd_mod.generate_ed25519(folder / "ssh_host_ed25519_key", f"bastion-{name}")
    port = sshd_mod.free_ports(HOST, 1)[0]
    text = sshd_mod.render_sshd_config(
        host=netns.RELAY_ADDR,
        port=port,
        host_key=folder / "ssh_host_ed25519_key",
        authorized_keys=lab.dir / "authorized_keys",
        user=lab.user,
        env={"GPUCTL_LAB_BASTION": name},
        sshd_version=sshd_mod.sshd_version(Path(lab.sshd)),
        forwarding=True,
    )
    config = folder / "sshd_config"
    write_atomic(config, text, mode=0o644)
    log = folder / "sshd.log"
    pid = sshd_mod.spawn_sshd(Path(lab.sshd), config, log, netns=relay_ns)
    why = sshd_mod.wait_listening(pid, log, time.monotonic() + timeout_s)
    if why is not None:
        sshd_mod.signal_all([pid], signal.SIGKILL)
        raise LabError(f"the bastion of {name} did not start: {why}")
    relay = netns.start_relay(
        relay_ns, HOST, port, folder, folder / "relay.log", to=f"{netns.RELAY_ADDR}:{port}"
    )
    return Bastion(folder, port, netns.NODE_ADDR, node.port, pid, relay, lab.user, lab.key_path)


def stop(bastion: Bastion) -> None:
    """Kill the bastion's sshd with its sessions, and its relay."""
    table = sshd_mod.ProcTable("GPUCTL_LAB_BASTION")
    tree = {bastion.sshd_pid} | table.descendants(bastion.sshd_pid)
    killed: set[int] = set()
    if sshd_mod.is_sshd_of(bastion.sshd_pid, bastion.dir / "sshd_config"):
        killed |= tree
    if netns.is_relay_of(bastion.relay_pid, bastion.dir):
        killed.add(bastion.relay_pid)
    sshd_mod.signal_all(killed, signal.SIGKILL)
    sshd_mod.wait_gone(killed)
