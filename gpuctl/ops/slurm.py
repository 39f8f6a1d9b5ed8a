"""gpuctl over a Slurm cluster: the inventory's nodes from Slurm (`resolve_inventory`), and one read
of Slurm's nodes and jobs per poll of the fleet (`SlurmPoll`, which the gatherer runs beside its
probes). The commands run through `gpuctl.adapters.slurm` (locally, or over SSH on a login node).

A node Slurm names and the inventory's `nodes:` lists too keeps the inventory's settings (host,
port, user, key...) and gains Slurm's labels; a node only Slurm names is reached at its NodeAddr
(or NodeHostName, or its name: the `slurm: address:` setting) with the file's `defaults:`.
Partitions and features become labels (`partition/<name>: "true"`, `feature/<name>: "true"`),
and `slurm: <cluster or "true">` marks the node as Slurm's.

A cordon of a Slurm node drains it in Slurm too (`SlurmDrains`): `scontrol update ...
state=DRAIN reason="gpuctl: <why>"`, and its uncordon resumes it, but only while the reason
Slurm holds is still gpuctl's (read at that moment): an operator's own drain is never resumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator

from gpuctl.adapters.protocols import Transport
from gpuctl.adapters.slurm import SlurmCommands, SlurmError, SlurmReader, update_node
from gpuctl.core.health.autodrain import HEALTH_SOURCE
from gpuctl.core.jobs.model import Cordon
from gpuctl.core.model import Inventory, NodeSpec, SlurmSource
from gpuctl.core.scheduler import SchedNode, SchedulerView
from gpuctl.errors import GpuctlError, InventoryError

log = logging.getLogger(__name__)

_LABEL = re.compile(r"[^A-Za-z0-9._-]")
_HOST = re.compile(r"^[A-Za-z0-9_.:%-]{1,253}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def resolve_inventory(inventory: Inventory, transport: Transport | None) -> Inventory:
    """`inventory` with the nodes of its Slurm cluster (none: unchanged). Raises
    InventoryError naming the inventory's `slurm:` and the command when Slurm cannot be read."""
    source = inventory.slurm
    if source is None:
        return inventory
    where = source.source or "slurm"
    try:
        view = SlurmReader(SlurmCommands(source, transport)).read()
    except GpuctlError as exc:
        raise InventoryError(
            f"{where}: reading the Slurm cluster: {exc.message}",
            hint=exc.hint or "check the inventory's slurm: section (docs/slurm.md)",
        ) from None
    for note in view.notes:
        log.warning("%s", note)
    listed = inventory.by_name()
    nodes: list[NodeSpec] = []
    slurm_names = set()
    for sn in view.nodes:
        slurm_names.add(sn.name)
        spec = listed.get(sn.name)
        if spec is None:
            spec = _new_node(sn, source, where)
        nodes.append(
            dataclasses.replace(
                spec, labels={**slurm_labels(sn, source), **spec.labels}, slurm=source
            )
        )
    login = source.login.name if source.login is not None else None
    others = [n for n in inventory.nodes if n.name not in slurm_names and n.name != login]
    if not nodes and not others:
        raise InventoryError(
            f"{where}: Slurm lists no nodes"
            + (f" in partitions {', '.join(source.partitions)}" if source.partitions else ""),
            hint="check `slurm: partitions:`, or run sinfo on the cluster",
        )
    return dataclasses.replace(inventory, nodes=(*others, *nodes))


def with_slurm_nodes(inventory: Inventory, transport: Callable[[], Transport]) -> Inventory:
    """`resolve_inventory` with the login node reached over a transport opened for it (and
    closed after); none opened for `via: local` or an inventory without `slurm:`."""
    if inventory.slurm is None:
        return inventory
    if inventory.slurm.via == "local":
        return resolve_inventory(inventory, None)
    opened = transport()
    try:
        return resolve_inventory(inventory, opened)
    finally:
        opened.close()


def _new_node(sn: SchedNode, source: SlurmSource, where: str) -> NodeSpec:
    if not _NAME.match(sn.name):
        raise InventoryError(f"{where}: Slurm node name {sn.name!r} is not a name gpuctl takes")
    host = {"NodeAddr": sn.address, "NodeHostName": sn.hostname}.get(source.address, sn.name)
    host = host or sn.name
    if host.startswith("-") or not _HOST.match(host):
        raise InventoryError(f"{where}: Slurm node {sn.name}: bad {source.address} {host!r}")
    template = source.template or NodeSpec(name=sn.name, host=host)
    return dataclasses.replace(template, name=sn.name, host=host, source=where, labels={})


def slurm_labels(sn: SchedNode, source: SlurmSource) -> dict[str, str]:
    """Partitions and features as labels, and `slurm` naming the cluster."""
    labels = {"slurm": source.cluster or "true"}
    for p in sn.partitions:
        labels[f"partition/{_LABEL.sub('_', p)}"[:63]] = "true"
    for f in sn.features:
        labels[f"feature/{_LABEL.sub('_', f)}"[:63]] = "true"
    return labels


class SlurmPoll:
    """Slurm's view for one poll of the fleet, read in a thread of its own while the nodes are
    probed (`start`, then `result`). Keeps one reader per cluster (it knows the release)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._readers: dict[str, SlurmReader] = {}
        self._thread: threading.Thread | None = None
        self._box: list[SchedulerView] = []

    def start(self, specs: Iterable[NodeSpec], now: float) -> None:
        source = next((s.slurm for s in specs if s.slurm is not None), None)
        self._box = []
        self._thread = None
        if source is None:
            return
        box = self._box
        self._thread = threading.Thread(
            target=lambda: box.append(self.read(source, now)),
            name="gpuctl-slurm-read",
            daemon=True,
        )
        self._thread.start()

    def result(self) -> SchedulerView | None:
        if self._thread is None:
            return None
        self._thread.join()
        return self._box[0] if self._box else None

    def read(self, source: SlurmSource, now: float) -> SchedulerView:
        """Slurm's nodes and jobs, or a view carrying why they could not be read: the poll goes
        on without them (nodes still answer over SSH)."""
        try:
            reader = self._readers.get(source.key)
            if reader is None:
                reader = SlurmReader(SlurmCommands(source, self._transport))
                self._readers[source.key] = reader
            return reader.read_or_error(now)
        except Exception as exc:  # the login node unreachable, or a surprise: one line
            log.debug("reading Slurm failed", exc_info=True)
            return SchedulerView(cluster=source.cluster, taken_at=now, error=str(exc))


REASON_PREFIX = "gpuctl: "  # the reason of every drain gpuctl sets in Slurm starts so
MAX_SLURM_REASON = 200
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


class SlurmDrains:
    """Cordons of Slurm-managed nodes, mirrored in Slurm: the one place the cordon paths (the
    CLI's and the dashboard's actions, playbooks, the control loop's health cordons) reach
    Slurm. `transport`: how the login node is reached (`via: ssh`), opened per call."""

    def __init__(
        self, inventory: Inventory, transport: Callable[[], Transport] | None = None
    ) -> None:
        self.inventory = inventory
        self._transport = transport

    @classmethod
    def of(
        cls, inventory: Inventory, transport: Callable[[], Transport] | None = None
    ) -> SlurmDrains | None:
        """None when no node of `inventory` is Slurm's."""
        if not any(n.slurm is not None for n in inventory.nodes):
            return None
        return cls(inventory, transport)

    def managed(self, node: str) -> SlurmSource | None:
        spec = self.inventory.by_name().get(node)
        return None if spec is None else spec.slurm

    def drain(self, node: str, reason: str) -> str | None:
        """Drain `node` in Slurm with reason `gpuctl: <reason>`; what was done (None: not a
        Slurm node). A drain Slurm holds already with a reason of someone else's is left as it
        is (overwriting it would let a later uncordon resume an operator's drain)."""
        source = self.managed(node)
        if source is None:
            return None
        with self._commands(source) as commands:
            current = _node(commands, node)
            if current.drained and not _ours(current.reason):
                return f"Slurm keeps {node}'s own drain ({_said(current)})"
            update_node(commands, node, state="DRAIN", reason=slurm_reason(reason))
        return f"{node} drained in Slurm"

    def check_resume(self, node: str) -> None:
        """Raise SlurmError when an uncordon of `node` would have to resume a drain that is not
        gpuctl's (before anything changes)."""
        source = self.managed(node)
        if source is not None:
            with self._commands(source) as commands:
                _resumable(commands, node)

    def resume(self, node: str) -> str | None:
        """Resume `node` in Slurm when the drain it holds is gpuctl's (the reason is read at this
        moment); what was done (None: not a Slurm node, or not drained). Raises SlurmError,
        naming who drained it and why, when the drain is someone else's: gpuctl never resumes
        an operator's."""
        source = self.managed(node)
        if source is None:
            return None
        with self._commands(source) as commands:
            if _resumable(commands, node) is None:
                return None
            update_node(commands, node, state="RESUME")
        return f"{node} resumed in Slurm"

    def _commands(self, source: SlurmSource) -> contextlib.AbstractContextManager[SlurmCommands]:
        return slurm_commands(source, self._transport)


@contextlib.contextmanager
def slurm_commands(
    source: SlurmSource, transport: Callable[[], Transport] | None = None
) -> Iterator[SlurmCommands]:
    """The cluster's Slurm commands, here or on its login node (that connection closed after)."""
    if source.via != "ssh":
        yield SlurmCommands(source)
        return
    opened = (transport or _ssh)()
    try:
        yield SlurmCommands(source, opened)
    finally:
        opened.close()


def slurm_drains_due(
    cordons: Iterable[Cordon], view: SchedulerView | None, inventory: Inventory
) -> list[Cordon]:
    """gpuctl's health cordons of Slurm nodes that Slurm, as this poll read it, does not drain
    (the control loop drains them there). None without a view of Slurm or when it failed."""
    if view is None or view.error is not None:
        return []
    specs = inventory.by_name()
    due = []
    for c in cordons:
        spec, node = specs.get(c.node), view.node(c.node)
        if c.source != HEALTH_SOURCE or spec is None or spec.slurm is None or node is None:
            continue
        if not node.drained:
            due.append(c)
    return due


def slurm_reason(reason: str) -> str:
    """`gpuctl: <reason>` on one printable line, short enough for Slurm's reason field."""
    text = _UNPRINTABLE.sub(" ", reason).strip() or "cordoned"
    return (REASON_PREFIX + text)[:MAX_SLURM_REASON]


def _ours(reason: str | None) -> bool:
    return (reason or "").startswith(REASON_PREFIX.rstrip())


def _said(node: SchedNode) -> str:
    who = f" by {node.reason_by}" if node.reason_by else ""
    return f"{node.state_text}{who}: {node.reason or 'no reason given'}"


def _resumable(commands: SlurmCommands, node: str) -> SchedNode | None:
    """`node` when Slurm drains it with gpuctl's reason; None when Slurm does not drain it."""
    current = _node(commands, node)
    if not current.drained:
        return None
    if not _ours(current.reason):
        raise SlurmError(
            f"{node} is drained in Slurm by someone else ({_said(current)}): gpuctl resumes "
            "only its own drains",
            hint=f"if it may run jobs again: scontrol update nodename={node} state=RESUME",
        )
    return current


def _node(commands: SlurmCommands, node: str) -> SchedNode:
    found = next((n for n in SlurmReader(commands).nodes() if n.name == node), None)
    if found is None:
        raise SlurmError(f"Slurm does not list {node} any more")
    return found


def _ssh() -> Transport:
    """SSH as the gatherer's (gpuctl's own known_hosts, the operator's, ssh_config)."""
    from gpuctl.adapters.ssh import SshTransport
    from gpuctl.config import paths

    return SshTransport(
        own_known_hosts=paths.own_known_hosts(),
        system_known_hosts=paths.system_known_hosts(),
        ssh_config=paths.ssh_config(),
    )
