"""The lab fleet: real `sshd` processes on loopback, each a node with simulated GPUs.

`up` writes everything into one folder (`DIR`): `lab.json` (what was started: pids, ports, user),
`inventory.yaml`, `known_hosts`, the client key `id_ed25519`, and one folder per node under
`nodes/<name>/` (sshd_config, host key, GPU state, `bin/` with the fake tools, `home/`, `run/`,
sshd.log).
`down`, `kill`, `revive`, `freeze`, `thaw` and `inject` work from any later process through
`lab.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from gpuctl.adapters.files import write_atomic
from gpuctl.errors import LabError
from gpuctl.lab import netns, node_tools, nodestate, record
from gpuctl.lab import sshd as sshd_mod
from gpuctl.lab.record import Lab, LabNode, load

__all__ = [
    "DEFAULT_GPU_MODEL",
    "LAB_HOST",
    "NODE_ENV",
    "STATE_ENV",
    "Lab",
    "LabNode",
    "NodeStatus",
    "down",
    "freeze",
    "inject",
    "kill",
    "load",
    "revive",
    "status",
    "thaw",
    "up",
]

LAB_HOST = "127.0.0.1"
DEFAULT_GPU_MODEL = "NVIDIA H100 80GB HBM3"
NODE_ENV = "GPUCTL_LAB_NODE"
STATE_ENV = "GPUCTL_LAB_STATE"
RUN_DIR = "run"  # the fake tools' memo of the current probe run (node_tools.RUN_DIR_ENV)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeStatus:
    node: LabNode
    running: bool
    frozen: bool
    partitioned: bool = False


# -- up ----------------------------------------------------------------------------------------


def up(
    lab_dir: Path,
    *,
    nodes: int,
    gpus: int = 8,
    gpu_model: str = DEFAULT_GPU_MODEL,
    gpu_mem_gib: int = 80,
    sshd: Path = sshd_mod.DEFAULT_SSHD,
    start_timeout_s: float = 15.0,
) -> Lab:
    """Start `nodes` lab nodes in `lab_dir`; on any failure stop what was started and raise."""
    if not 1 <= nodes <= 1000:
        raise LabError(f"--nodes must be between 1 and 1000, not {nodes}")
    if gpus < 0 or gpu_mem_gib <= 0:
        raise LabError("--gpus must be 0 or more and --gpu-mem-gib more than 0")
    sshd_mod.check_sshd(sshd)
    lab_dir = lab_dir.absolute()
    if (lab_dir / record.LAB_FILE).exists() and any(s.running for s in status(lab_dir)):
        raise LabError(
            f"{lab_dir}: a lab is already running here",
            hint=f"stop it first: gpuctl lab down --dir {lab_dir}",
        )
    if not lab_dir.exists():
        record.mkdir(lab_dir, parents=True)
    user = sshd_mod.lab_user()
    sshd_mod.check_traversable(lab_dir, user)
    if os.geteuid() == 0:
        record.mkdir(Path("/run/sshd"), exist_ok=True)  # sshd's privilege separation dir
    with record.locked(lab_dir):
        lab = _prepare(lab_dir, user, nodes, gpus, gpu_model, gpu_mem_gib, sshd)
        try:
            lab = _start_all(lab, start_timeout_s)
        except BaseException:
            if (lab_dir / record.LAB_FILE).exists():
                lab = load(lab_dir)  # what was started: pids are recorded as soon as they exist
            _stop_all(lab)
            record.save(dataclasses.replace(lab, nodes=tuple(_without_pid(n) for n in lab.nodes)))
            raise
    return lab


def _prepare(
    lab_dir: Path,
    user: sshd_mod.LabUser,
    count: int,
    gpus: int,
    gpu_model: str,
    gpu_mem_gib: int,
    sshd: Path,
) -> Lab:

    client_pub = sshd_mod.generate_ed25519(lab_dir / "id_ed25519", "gpuctl-lab-client")
    write_atomic(lab_dir / "authorized_keys", client_pub + "\n", mode=0o644)
    shutil.rmtree(lab_dir / "nodes", ignore_errors=True)
    record.mkdir(lab_dir / "nodes")
    width = max(2, len(str(count)))
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    lab_nodes = []
    lab = Lab(dir=lab_dir, user=user.name, sshd=str(sshd), nodes=())
    for index in range(1, count + 1):
        name = f"lab-{index:0{width}d}"
        node_dir = lab.node_dir(name)
        for folder in (node_dir, node_dir / "bin", node_dir / "home", node_dir / RUN_DIR):
            record.mkdir(folder)
        state = nodestate.new_node_state(
            name, gpus=gpus, model=gpu_model, mem_gib=gpu_mem_gib, node_index=index
        )
        nodestate.write_state(lab.state_path(name), state)
        node_tools.install_node_tools(node_dir / "bin", python=python)
        sshd_mod.generate_ed25519(node_dir / "ssh_host_ed25519_key", name)
        if user.dedicated:
            for path in (node_dir, node_dir / "bin", node_dir / "home", node_dir / RUN_DIR,
                         lab.state_path(name)):  # fmt: skip
                os.chown(path, user.uid, user.gid)
            for tool in (node_dir / "bin").iterdir():
                os.chown(tool, user.uid, user.gid)
        lab_nodes.append(LabNode(name, index, LAB_HOST, 0, None, gpus, gpu_model, gpu_mem_gib))
    return dataclasses.replace(lab, nodes=tuple(lab_nodes))


def _write_config(lab: Lab, node: LabNode, version: tuple[int, int] | None) -> None:
    node_dir = lab.node_dir(node.name)
    env = {
        NODE_ENV: node.name,
        STATE_ENV: str(lab.state_path(node.name)),
        node_tools.RUN_DIR_ENV: str(node_dir / RUN_DIR),
        "HOME": str(node_dir / "home"),
        "PATH": f"{node_dir / 'bin'}:/usr/local/bin:/usr/bin:/bin",
    }
    text = sshd_mod.render_sshd_config(
        host=netns.NODE_ADDR if node.netns else node.host,
        port=node.port,
        host_key=node_dir / "ssh_host_ed25519_key",
        authorized_keys=lab.dir / "authorized_keys",
        user=lab.user,
        env=env,
        sshd_version=version,
    )
    write_atomic(lab.config_path(node.name), text, mode=0o644)


def _start_all(lab: Lab, timeout_s: float) -> Lab:
    version = sshd_mod.sshd_version(Path(lab.sshd))
    pending = list(lab.nodes)
    for _attempt in range(3):
        ports = sshd_mod.free_ports(LAB_HOST, len(pending))
        started = []
        for node, port in zip(pending, ports, strict=True):
            node = dataclasses.replace(node, port=port)
            _write_config(lab, node, version)
            log = lab.log_path(node.name)
            log.write_text("")
            pid = sshd_mod.spawn_sshd(Path(lab.sshd), lab.config_path(node.name), log)
            node = dataclasses.replace(node, pid=pid)
            lab = lab.with_node(node)
            started.append(node)
        record.save(lab)  # so that `down` can clean up even if this process dies now
        deadline = time.monotonic() + timeout_s
        pending = []
        for node in started:
            assert node.pid is not None
            why = sshd_mod.wait_listening(node.pid, lab.log_path(node.name), deadline)
            if why is None:
                continue
            if "Address already in use" in why:  # lost a race for the port: try another
                _stop_node(lab, node)
                lab = lab.with_node(dataclasses.replace(node, pid=None))
                pending.append(node)
                continue
            raise LabError(f"{node.name}: sshd did not start: {why}")
        if not pending:
            break
    else:
        raise LabError("could not find free ports for the lab nodes")
    record.save(lab)
    _write_known_hosts(lab)
    _write_inventory(lab)
    return lab


def _write_known_hosts(lab: Lab) -> None:
    lines = []
    for node in lab.nodes:
        public = lab.node_dir(node.name) / "ssh_host_ed25519_key.pub"
        key_type, blob = public.read_text().split()[:2]
        lines.append(f"[{node.host}]:{node.port} {key_type} {blob}\n")
    write_atomic(lab.known_hosts_path, "".join(lines), mode=0o644)


def _write_inventory(lab: Lab) -> None:
    lines = [
        "# written by gpuctl lab up",
        "defaults:",
        f"  user: {lab.user}",
        "  key_file: id_ed25519",
        "  known_hosts: [known_hosts]",
        "nodes:",
    ]
    for n in lab.nodes:
        lines.append(
            f"  - {{name: {n.name}, host: {n.host}, port: {n.port}, gpus: {n.gpus}, "
            f'gpu_model: {json.dumps(n.gpu_model)}, labels: {{lab: "true"}}}}'
        )
    write_atomic(lab.inventory_path, "\n".join(lines) + "\n", mode=0o644)


# -- status, kill, revive, freeze, thaw, down --------------------------------------------------


def status(lab_dir: Path) -> list[NodeStatus]:
    lab = load(lab_dir)
    out = []
    for node in lab.nodes:
        running = node.pid is not None and sshd_mod.is_sshd_of(node.pid, lab.config_path(node.name))
        frozen = running and node.pid is not None and _stopped(node.pid)
        partitioned = node.netns is not None and not netns.link_up(node.netns)
        out.append(NodeStatus(node, running, frozen, partitioned))
    return out


def _stopped(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].startswith("T")


def _node_pids(lab: Lab, node: LabNode, table: sshd_mod.ProcTable) -> set[int]:
    """The node's sshd, its sessions, and every process started with the node's environment."""
    pids: set[int] = set()
    if node.pid is not None and sshd_mod.is_sshd_of(node.pid, lab.config_path(node.name)):
        pids.add(node.pid)
        pids |= table.descendants(node.pid)
    # STATE_ENV holds this lab's own path: another lab's node of the same name is left alone
    for pid in table.with_env(str(lab.state_path(node.name))):
        pids.add(pid)
        pids |= table.descendants(pid)
    return pids


def _stop_nodes(lab: Lab, nodes: Iterable[LabNode]) -> int:
    """SIGKILL the nodes' sshd and processes until none is left; how many were killed.

    A node dies at once: every process of it is stopped (SIGSTOP) before any is killed, so none
    acts on another's death (a job's wrapper recording the exit status of its killed job, as no
    wrapper on a node that lost power could)."""
    nodes = list(nodes)
    killed: set[int] = set()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        table = sshd_mod.ProcTable(STATE_ENV)
        pids = set().union(*(_node_pids(lab, node, table) for node in nodes))
        pids = {p for p in pids if sshd_mod.alive(p)}
        if not pids:
            break
        sshd_mod.signal_all(pids, signal.SIGSTOP)
        if pids - killed:  # newly found (forked meanwhile): look again before any dies
            killed |= pids
            continue
        sshd_mod.signal_all(pids, signal.SIGKILL)
        time.sleep(0.01)
    return len(killed)


def _stop_node(lab: Lab, node: LabNode) -> int:
    return _stop_nodes(lab, [node])


def _stop_all(lab: Lab) -> int:
    return _stop_nodes(lab, lab.nodes)


def down(lab_dir: Path) -> int:
    """Stop every sshd and node process of the lab; how many processes were stopped. Idempotent."""
    lab_dir = lab_dir.absolute()
    if not (lab_dir / record.LAB_FILE).exists():
        return 0
    with record.locked(lab_dir):
        lab = load(lab_dir)
        stopped = _stop_all(lab)
        for node in lab.nodes:
            stopped += _stop_relay(lab, node)
            if node.netns is not None:
                netns.delete(*netns.names(lab.dir, node.name))
        nodes = tuple(
            dataclasses.replace(n, pid=None, netns=None, relay_pid=None) for n in lab.nodes
        )
        record.save(dataclasses.replace(lab, nodes=nodes))
    return stopped


def _stop_relay(lab: Lab, node: LabNode) -> int:
    pid = node.relay_pid
    if pid is None or not netns.is_relay_of(pid, lab.node_dir(node.name)):
        return 0
    sshd_mod.signal_all([pid], signal.SIGKILL)
    sshd_mod.wait_gone([pid])  # until then it still accepts on the node's port
    return 1


def _without_pid(node: LabNode) -> LabNode:
    return dataclasses.replace(node, pid=None)


def kill(lab_dir: Path, name: str) -> int:
    """Simulate node death: SIGKILL its sshd and every process of the node."""
    lab_dir = lab_dir.absolute()
    with record.locked(lab_dir):
        lab = load(lab_dir)
        node = lab.node(name)
        stopped = _stop_node(lab, node)
        record.save(lab.with_node(_without_pid(node)))
    return stopped


def revive(lab_dir: Path, name: str, *, timeout_s: float = 10.0) -> LabNode:
    """Start a killed node's sshd again: same host key, same port."""
    lab_dir = lab_dir.absolute()
    with record.locked(lab_dir):
        lab = load(lab_dir)
        node = lab.node(name)
        if node.pid is not None and sshd_mod.is_sshd_of(node.pid, lab.config_path(name)):
            if _stopped(node.pid):
                _signal_node(lab, node, signal.SIGCONT)
            return node
        sshd_mod.check_sshd(Path(lab.sshd))
        log = lab.log_path(name)
        offset = sshd_mod.log_size(log)
        pid = sshd_mod.spawn_sshd(Path(lab.sshd), lab.config_path(name), log, netns=node.netns)
        node = dataclasses.replace(node, pid=pid)
        record.save(lab.with_node(node))
        why = sshd_mod.wait_listening(pid, log, time.monotonic() + timeout_s, offset=offset)
        if why is not None:
            _stop_node(lab, node)
            record.save(lab.with_node(_without_pid(node)))
            raise LabError(f"{name}: sshd did not start again: {why}")
    return node


def _signal_node(lab: Lab, node: LabNode, sig: signal.Signals) -> int:
    pids = _node_pids(lab, node, sshd_mod.ProcTable(STATE_ENV))
    sshd_mod.signal_all(pids, sig)
    return len(pids)


def freeze(lab_dir: Path, name: str) -> int:
    """SIGSTOP the node's sshd, its sessions and processes: it accepts TCP but never answers."""
    lab = load(lab_dir)
    node = lab.node(name)
    if node.pid is None:
        raise LabError(f"{name} is not running", hint=f"gpuctl lab revive {name} --dir {lab.dir}")
    count = _signal_node(lab, node, signal.SIGSTOP)
    _wait_stopped(node.pid, True)
    return count


def thaw(lab_dir: Path, name: str) -> int:
    """Undo `freeze`."""
    lab = load(lab_dir)
    node = lab.node(name)
    count = _signal_node(lab, node, signal.SIGCONT)
    if node.pid is not None:
        _wait_stopped(node.pid, False)
    return count


def _wait_stopped(pid: int, stopped: bool) -> None:
    """Signals land asynchronously: wait (briefly) until the sshd shows the wanted state."""
    deadline = time.monotonic() + 2.0
    while _stopped(pid) != stopped and sshd_mod.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.005)


def inject(
    lab_dir: Path,
    name: str,
    *,
    gpu: int | None = None,
    ecc_uncorrected: int | None = None,
    xid: int | None = None,
    temp_c: int | None = None,
    missing: bool = False,
    garbage: bool = False,
    hang: bool = False,
    clear: bool = False,
) -> None:
    """Change a node's simulated GPUs (see `gpuctl.lab.nodestate.inject` for the faults)."""

    lab = load(lab_dir)
    lab.node(name)
    nodestate.inject(
        lab.state_path(name),
        gpu=gpu,
        ecc_uncorrected=ecc_uncorrected,
        xid=xid,
        temp_c=temp_c,
        missing=missing,
        garbage=garbage,
        hang=hang,
        clear=clear,
    )
