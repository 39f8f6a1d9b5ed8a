"""Fleet vocabulary: inventory nodes and observed snapshots (with Slurm's view of the fleet,
`gpuctl.core.scheduler`, when the inventory reads a Slurm cluster).

Frozen dataclasses, tuples for collections, units in field names, `None` for unknown. Snapshots
round-trip to JSON (`*_to_dict` / `*_from_dict`) so `-o json`, `--snapshot FILE` and the TUI
share the same facts.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from gpuctl.core.scheduler import SchedulerView


class Reach(enum.StrEnum):
    """How a node answered the last poll."""

    OK = "ok"
    REFUSED = "refused"  # TCP connection refused: sshd not running
    UNREACHABLE = "unreachable"  # no route, DNS failure, network down
    AUTH_FAILED = "auth_failed"  # the key was not accepted
    HOST_KEY = "host_key"  # host key unknown or changed: nothing was sent
    TIMEOUT = "timeout"  # a deadline passed (connect, auth, exec or read)
    ERROR = "error"  # anything else at the transport level


class NodeState(enum.StrEnum):
    """Node states of the design vocabulary."""

    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DOWN = "down"
    UNKNOWN = "unknown"  # reachable, but health could not be read


_JUMP_HOST = re.compile(r"^[A-Za-z0-9_.:%-]{1,253}$")
_JUMP_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}$")


@dataclasses.dataclass(frozen=True, slots=True)
class Hop:
    """One jump host (bastion) on the way to a node, as `[user@]host[:port]` names it. `None`:
    not given there (then ssh_config's for that host, else the local user and port 22)."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and self.port is not None else self.host
        user = f"{self.user}@" if self.user else ""
        return f"{user}{host}:{self.port}" if self.port is not None else f"{user}{host}"


def parse_jump(text: str) -> tuple[Hop, ...]:
    """ProxyJump's syntax: `none` (no jump host), or `[user@]host[:port]` hops separated by
    commas, first hop first (`ssh://[user@]host[:port]` too; `[v6]:port` for IPv6). Raises
    ValueError with a one-line reason."""
    text = text.strip()
    if text.lower() == "none":
        return ()
    return tuple(_parse_hop(part.strip()) for part in text.split(","))


def _parse_hop(text: str) -> Hop:
    hop = text.removeprefix("ssh://")
    if not hop:
        raise ValueError("an empty jump host: write [user@]host[:port], hops separated by ','")
    user: str | None = None
    if "@" in hop:
        user, hop = hop.rsplit("@", 1)
        if not _JUMP_USER.match(user):
            raise ValueError(f"bad user {user!r} in jump host {text!r}")
    port_text: str | None = None
    if hop.startswith("["):
        host, sep, rest = hop[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad jump host {text!r}: write [v6-address]:port")
        port_text = rest[1:] if rest else None
    elif hop.count(":") == 1:
        host, port_text = hop.split(":")
    else:
        host = hop  # a name, an IPv4 address, or a bare IPv6 address
    if host.startswith("-") or not _JUMP_HOST.match(host):
        raise ValueError(f"bad host {host!r} in jump host {text!r}")
    port: int | None = None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"bad port {port_text!r} in jump host {text!r}: 1-65535")
        port = int(port_text)
    return Hop(host=host, user=user, port=port)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of the inventory, fully resolved (defaults applied, ranges expanded)."""

    name: str
    host: str
    port: int = 22
    user: str | None = None  # None: the local user's name, as ssh does
    allow_root: bool = False  # logging in as root needs the inventory to say so
    key_file: str | None = None
    known_hosts: tuple[str, ...] = ()
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    groups: tuple[str, ...] = ()
    expected_gpus: int | None = None
    expected_model: str | None = None
    transport: str = "ssh"  # "ssh" or "local"
    connect_timeout_s: float = 5.0
    command_timeout_s: float = 10.0
    source: str | None = None  # "file:line" it came from, for error messages
    # The jump hosts to reach it through, first hop first; () directly; None: not set (the
    # operator's ssh_config may name them with ProxyJump).
    jump: tuple[Hop, ...] | None = None
    ssh_config: str | None = None  # the ssh_config file to read; None: the operator's default
    port_set: bool = True  # False: the inventory left the port to ssh_config (else 22)
    # The Slurm cluster the node is part of (the inventory's `slurm:`): each poll reads it once.
    slurm: SlurmSource | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True, slots=True)
class SlurmSource:
    """How the inventory reaches Slurm (its `slurm:` section): the commands run `local`ly or
    over SSH on the `login` node, with `SLURM_CONF` set to `conf` when given. `partitions`:
    only nodes of these (empty: all). `address`: the Slurm field a node's SSH host comes from
    (`NodeAddr`, `NodeHostName` or `name`) unless the inventory's `nodes:` lists the node.
    `template`: the file's defaults, as a node, for the nodes only Slurm names. `source`: the
    file and line it was set at."""

    via: str = "local"  # "local" or "ssh"
    login: NodeSpec | None = None
    cluster: str | None = None
    partitions: tuple[str, ...] = ()
    address: str = "NodeAddr"
    conf: str | None = None
    template: NodeSpec | None = None
    source: str | None = None

    @property
    def key(self) -> str:
        """Which cluster this is, for a poll that reads each cluster once."""
        login = self.login.address if self.login is not None else ""
        return f"{self.via}|{login}|{self.conf or ''}|{self.cluster or ''}"


@dataclasses.dataclass(frozen=True, slots=True)
class Inventory:
    nodes: tuple[NodeSpec, ...]
    sources: tuple[str, ...] = ()
    slurm: SlurmSource | None = None  # nodes also come from this Slurm cluster
    history_retention_s: int | None = None  # `defaults: history_retention:` (None: not set)

    def by_name(self) -> dict[str, NodeSpec]:
        return {n.name: n for n in self.nodes}


@dataclasses.dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One GPU as NVML reports it. Every measured field may be None (not reported / unparseable)."""

    index: int
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    mem_total_mib: int | None = None
    mem_used_mib: int | None = None
    util_pct: int | None = None
    temp_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    ecc_mode: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    mig_mode: bool | None = None
    thermal_slowdown_hw: bool | None = None
    thermal_slowdown_sw: bool | None = None


def pci_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """`00000000:18:00.0` (nvidia-smi) and `0000:18:00` (kernel log) -> the same (0, 0x18, 0)."""
    if not bus_id:
        return None
    parts = bus_id.split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    gpu_uuid: str | None
    used_mib: int | None
    name: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class XidEvent:
    xid: int
    pci_bus_id: str | None = None
    message: str = ""
    at: str | None = None  # the kernel log's own timestamp text


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFacts:
    hostname: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    clock_s: float | None = None  # the node's own clock (epoch seconds) at probe time
    cpu_count: int | None = None
    host_mem_total_mib: int | None = None
    host_mem_available_mib: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Observation:
    """What one probe of one node returned, parsed. Parsers never raise: problems become notes."""

    gpus: tuple[GpuSnapshot, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    facts: NodeFacts = NodeFacts()
    notes: tuple[str, ...] = ()  # parse problems, one line each
    nvml_ok: bool = True  # False when the GPU query itself failed or was unreadable


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """One node at one poll: how it answered and, if it did, what it reported."""

    name: str
    reach: Reach
    state: NodeState
    error: str | None = None
    observation: Observation | None = None
    latency_s: float | None = None
    taken_at: float | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # from the inventory

    @property
    def gpus(self) -> tuple[GpuSnapshot, ...]:
        return self.observation.gpus if self.observation else ()

    @property
    def clock_offset_s(self) -> float | None:
        """The node's clock minus gpuctl's at this poll (None when unknown). The node reads its
        clock during the probe, gpuctl when the poll began: a slow probe reads as a node a few
        seconds ahead, whole seconds only. Jobs stamp their checkpoints with the node's clock."""
        obs = self.observation
        if obs is None or obs.facts.clock_s is None or self.taken_at is None:
            return None
        return obs.facts.clock_s - self.taken_at


@dataclasses.dataclass(frozen=True, slots=True)
class FleetSnapshot:
    taken_at: float
    nodes: tuple[NodeSnapshot, ...]
    scheduler: SchedulerView | None = None  # Slurm's nodes and jobs, read with this poll

    def node(self, name: str) -> NodeSnapshot | None:
        """The snapshot of the node called `name` (None: not polled)."""
        return next((n for n in self.nodes if n.name == name), None)

    @property
    def version(self) -> str:
        """A content hash of what was observed (not when, nor how fast): plans computed from this
        snapshot carry it. The same for a snapshot and its JSON round trip."""
        digest = hashlib.sha256()
        for node in self.nodes:
            digest.update(repr(_version_key(node)).encode())
            digest.update(b"\n")
        if self.scheduler is not None:  # Slurm's jobs hold cards a plan must not take
            sched = self.scheduler
            digest.update(repr((sched.nodes, sched.jobs, sched.error)).encode())
        return digest.hexdigest()[:16]


def _values(obj: Any) -> tuple[Any, ...]:
    names = _FIELDS.get(type(obj))
    if names is None:
        names = _FIELDS[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    return tuple(getattr(obj, name) for name in names)


def _version_key(node: NodeSnapshot) -> tuple[Any, ...]:
    obs = node.observation
    seen = None
    if obs is not None:
        seen = (
            tuple(_values(g) for g in obs.gpus),
            tuple(_values(p) for p in obs.processes),
            tuple(_values(x) for x in obs.xids),
            _values(dataclasses.replace(obs.facts, clock_s=None)),
            obs.notes,
            obs.nvml_ok,
        )
    labels = tuple(sorted(node.labels.items()))
    return (node.name, node.reach.value, node.state.value, node.error, labels, seen)


# --- JSON round trip ---------------------------------------------------------------------------


_FIELDS: dict[type, tuple[str, ...]] = {}


def _flat(obj: Any) -> dict[str, Any]:
    """A flat dataclass (scalar fields only) as a dict; `dataclasses.asdict` deep-copies every
    value and is ten times slower on a thousand-node fleet."""
    names = _FIELDS.get(type(obj))
    if names is None:
        names = _FIELDS[type(obj)] = tuple(f.name for f in dataclasses.fields(obj))
    return {name: getattr(obj, name) for name in names}


def node_to_dict(node: NodeSnapshot) -> dict[str, Any]:
    obs = node.observation or Observation(nvml_ok=False)
    return {
        "name": node.name,
        "state": node.state.value,
        "reach": node.reach.value,
        "error": node.error,
        "labels": dict(node.labels),
        "latency_s": node.latency_s,
        "taken_at": node.taken_at,
        "gpus": [_flat(g) for g in obs.gpus],
        "processes": [_flat(p) for p in obs.processes],
        "xids": [_flat(x) for x in obs.xids],
        "facts": _flat(obs.facts) if node.observation else None,
        "notes": list(obs.notes),
        "nvml_ok": obs.nvml_ok if node.observation else None,
    }


def fleet_to_dict(fleet: FleetSnapshot) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "taken_at": fleet.taken_at,
        "version": fleet.version,
        "nodes": [node_to_dict(n) for n in fleet.nodes],
    }
    if fleet.scheduler is not None:
        doc["scheduler"] = fleet.scheduler.to_dict()
    return doc


def _build(cls: type[Any], data: Mapping[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def node_from_dict(data: Mapping[str, Any]) -> NodeSnapshot:
    """Inverse of `node_to_dict`. Raises KeyError/TypeError/ValueError on malformed input."""
    facts = data.get("facts")
    observation: Observation | None = None
    if facts is not None or data.get("gpus"):
        observation = Observation(
            gpus=tuple(_build(GpuSnapshot, g) for g in data.get("gpus") or ()),
            processes=tuple(_build(GpuProcess, p) for p in data.get("processes") or ()),
            xids=tuple(_build(XidEvent, x) for x in data.get("xids") or ()),
            facts=_build(NodeFacts, facts or {}),
            notes=tuple(str(s) for s in data.get("notes") or ()),
            nvml_ok=bool(data.get("nvml_ok", True)),
        )
    return NodeSnapshot(
        name=str(data["name"]),
        reach=Reach(data.get("reach", "ok")),
        state=NodeState(data.get("state", "ready")),
        error=data.get("error"),
        observation=observation,
        latency_s=data.get("latency_s"),
        taken_at=data.get("taken_at"),
        labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
    )


def fleet_from_dict(data: Mapping[str, Any]) -> FleetSnapshot:
    sched = data.get("scheduler")
    return FleetSnapshot(
        taken_at=float(data.get("taken_at") or 0.0),
        nodes=tuple(node_from_dict(n) for n in data["nodes"]),
        scheduler=None if sched is None else SchedulerView.from_dict(sched),
    )
