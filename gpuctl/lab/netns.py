"""Network namespaces for lab nodes: a node behind a link that can go down (a partition).

An *enclosed* node runs its sshd (and so every job started over it) in a network namespace of its
own, `<ns>-n`, joined by a veth pair to a second namespace, `<ns>-r`, where a small relay
(`gpuctl.lab.relay`) forwards the node's usual address, 127.0.0.1:PORT in the machine's own
namespace, to the sshd across the link. Setting the node's end of the link down cuts the node
off: connections get no answer and open ones stall, while the node's processes run on. Setting it
up again heals the partition.

Every address is inside the two namespaces the lab creates (169.254.0.1 and .2 on the veth
pair); the machine's own namespace only sees the relay's listening socket on loopback. Needs root
and iproute2 (`ip`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

from gpuctl.errors import LabError
from gpuctl.lab import sshd as sshd_mod

NODE_ADDR = "169.254.0.2"
RELAY_ADDR = "169.254.0.1"
NODE_LINK = "gl-node"
RELAY_LINK = "gl-relay"
RELAY_SCRIPT = Path(__file__).with_name("relay.py")


def names(lab_dir: Path, node: str) -> tuple[str, str]:
    """The node's namespace and the relay's: unique per lab folder and node."""
    digest = hashlib.sha256(str(lab_dir.absolute()).encode()).hexdigest()[:8]
    base = f"gpuctl-{digest}-{node}"
    return f"{base}-n", f"{base}-r"


def check_available() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "a network partition needs network namespaces, which need root",
            hint="run the lab as root (CI does), or use gpuctl lab freeze for a hung node",
        )
    if not Path(sshd_mod.IP).exists():
        raise LabError(
            f"iproute2 not found ({sshd_mod.IP}): install it with apt-get install -y iproute2"
        )


def _ip(*args: str) -> None:
    out = subprocess.run(
        [sshd_mod.IP, *args], capture_output=True, text=True, timeout=15, check=False
    )
    if out.returncode != 0:
        raise LabError(f"ip {' '.join(args)} failed: {out.stderr.strip()}")


def exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def create(lab_dir: Path, node: str) -> tuple[str, str]:
    """Make the node's namespace pair and the link between them (up); return their names."""
    check_available()
    node_ns, relay_ns = names(lab_dir, node)
    delete(node_ns, relay_ns)  # left over from a lab that was not taken down
    try:
        _ip("netns", "add", node_ns)
        _ip("netns", "add", relay_ns)
        _ip("-n", relay_ns, "link", "add", RELAY_LINK, "type", "veth", "peer", "name", NODE_LINK,
            "netns", node_ns)  # fmt: skip
        _ip("-n", relay_ns, "addr", "add", f"{RELAY_ADDR}/30", "dev", RELAY_LINK)
        _ip("-n", node_ns, "addr", "add", f"{NODE_ADDR}/30", "dev", NODE_LINK)
        for ns, link in ((relay_ns, RELAY_LINK), (node_ns, NODE_LINK)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", link, "up")
    except BaseException:
        delete(node_ns, relay_ns)
        raise
    return node_ns, relay_ns


def set_link(node_ns: str, up: bool) -> None:
    """The node's end of its link: down is a partition, up heals it."""
    _ip("-n", node_ns, "link", "set", NODE_LINK, "up" if up else "down")


def link_up(node_ns: str) -> bool:
    out = subprocess.run(
        [sshd_mod.IP, "-n", node_ns, "-o", "link", "show", NODE_LINK],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )
    flags = out.stdout.split("<", 1)[-1].split(">", 1)[0].split(",")
    return out.returncode == 0 and "UP" in flags


def delete(*namespaces: str) -> None:
    """Remove namespaces (and the link between them); ones that are gone are fine."""
    for ns in namespaces:
        if exists(ns):
            with contextlib.suppress(LabError):
                _ip("netns", "del", ns)


def relay_tag(node_dir: Path) -> str:
    return f"gpuctl-lab-relay:{node_dir}"


def start_relay(
    relay_ns: str, host: str, port: int, node_dir: Path, log: Path, *, to: str | None = None
) -> int:
    """Listen on host:port here and forward every connection to the node's sshd across the
    link (or to `to`, HOST:PORT as seen in the relay's namespace); return the relay's pid."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
        fd = listener.fileno()
        python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        argv = [
            sshd_mod.IP, "netns", "exec", relay_ns, python, str(RELAY_SCRIPT),
            "--listen-fd", str(fd), "--to", to or f"{NODE_ADDR}:{port}",
            "--tag", relay_tag(node_dir),
        ]  # fmt: skip
        return sshd_mod.spawn_detached(argv, log, pass_fds=(fd,))
    except OSError as exc:
        raise LabError(f"cannot listen on {host}:{port} for the relay: {exc}") from None
    finally:
        listener.close()


def is_relay_of(pid: int, node_dir: Path) -> bool:
    return sshd_mod.alive(pid) and relay_tag(node_dir) in sshd_mod.cmdline(pid)
