"""What the dashboard is given (`Services`): where snapshots come from (the live fleet through
one gatherer, or a saved `gpuctl status -o json`), how to open the state store, the clock, the
actions, job logs. `gpuctl.ops.compose` builds them; tests build them with scripted parts.
"""

from __future__ import annotations

import codecs
import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuctl.adapters.protocols import Clock, JobRunner, Store
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSpec
from gpuctl.core.placement.model import Settings
from gpuctl.ops.stores import KeptStore, SessionStore

if TYPE_CHECKING:
    from gpuctl.core.health import HealthRules
    from gpuctl.ops.action_plans import ActionService
    from gpuctl.ops.dashboard._owners import ProcessLister

POLL_MARGIN_S = 5.0
LOG_TAIL_BYTES = 64 << 10


class SnapshotSource(Protocol):
    """One poll of the fleet per call. `deadline_s`: a poll still running after this long is
    overdue (the dashboard says so and keeps the last view)."""

    label: str
    live: bool
    deadline_s: float

    def poll(self) -> FleetSnapshot: ...

    def close(self) -> None: ...


class Poller(Protocol):
    """A fleet reader kept for the app's life (`parts.FleetLink`, or a `Gatherer`)."""

    def gather(self, nodes: Inventory | Iterable[NodeSpec]) -> FleetSnapshot: ...

    def close(self) -> None: ...


class LiveSource:
    """The inventory through one fleet reader, reused for the app's life (connections stay
    open). Every node has its own deadline in the Gatherer: a hung node comes back as a
    `timeout` snapshot, never a stuck poll."""

    live = True

    def __init__(self, inventory: Inventory, gatherer: Poller, label: str) -> None:
        self.inventory = inventory
        self.gatherer = gatherer
        self.label = self.base_label = label
        slowest = max(
            (n.connect_timeout_s + n.command_timeout_s for n in inventory.nodes), default=0.0
        )
        self.deadline_s = slowest + POLL_MARGIN_S

    def poll(self) -> FleetSnapshot:
        """A poll; a reader that read the controller's published snapshot instead says how old
        it is, in the label (`ops.shared_fleet.SharedFleet.seen_line`)."""
        snapshot = self.gatherer.gather(self.inventory)
        seen = getattr(self.gatherer, "seen_line", None)
        said = seen() if callable(seen) else None
        self.label = self.base_label if said is None else f"{self.base_label} · {said}"
        return snapshot

    def close(self) -> None:
        self.gatherer.close()


class SavedSource:
    """A saved `gpuctl status -o json` (offline review): read again at every refresh, so a file
    rewritten by a cron job shows its newest state."""

    live = False
    deadline_s = 30.0

    def __init__(self, path: Path) -> None:
        self.path = path
        self.label = f"snapshot {path.name}"

    def poll(self) -> FleetSnapshot:
        from gpuctl.ops.place import load_snapshot

        return load_snapshot(self.path)

    def close(self) -> None:
        return None


class LogReader(Protocol):
    def tail(self, store: Store, job_ref: str, max_bytes: int = LOG_TAIL_BYTES) -> str: ...


class RemoteLogs:
    """A job's log from its node through `gpuctl.ops.jobs.read_logs`; the last `max_bytes`."""

    def __init__(self, runner: JobRunner, inventory: Inventory) -> None:
        self.runner = runner
        self.inventory = inventory

    def tail(self, store: Store, job_ref: str, max_bytes: int = LOG_TAIL_BYTES) -> str:
        from gpuctl.ops.jobs import read_logs

        kept: deque[bytes] = deque()
        size = 0
        for chunk in read_logs(store, self.runner, self.inventory, job_ref):
            if chunk.note is not None or not chunk.data:
                continue
            kept.append(chunk.data)
            size += len(chunk.data)
            while size - len(kept[0]) >= max_bytes:
                size -= len(kept.popleft())
        data = b"".join(kept)[-max_bytes:]
        return codecs.decode(data, "utf-8", "replace")


@dataclasses.dataclass
class Services:
    """Everything the dashboard calls. Tests build one with a scripted source and a memory store."""

    source: SnapshotSource
    open_store: SessionStore
    clock: Clock
    actions: ActionService | None = None
    rules: HealthRules | None = None
    expected_gpus: Mapping[str, int | None] = dataclasses.field(default_factory=dict)
    logs: LogReader | None = None
    processes: ProcessLister | None = None  # the node screen names each GPU process's job
    settings: Settings = dataclasses.field(default_factory=Settings)
    operator: str = "unknown"

    def close(self) -> None:
        self.source.close()
        if isinstance(self.open_store, KeptStore):
            self.open_store.close()
