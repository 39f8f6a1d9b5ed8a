"""The thin adapter bundle the dashboard receives: where snapshots come from (a live `Gatherer`
over the inventory, or a saved `gpuctl status -o json`), how to open the state store, the clock,
the actions, job logs. No textual here: `gpuctl dash --once` and the benchmark use it headless.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuctl.adapters.protocols import Clock, JobRunner, Store, Transport
from gpuctl.core.model import FleetSnapshot, Inventory
from gpuctl.core.placement.model import Settings
from gpuctl.errors import StateError

if TYPE_CHECKING:
    from gpuctl.adapters.store.memo import MemoStore
    from gpuctl.core.health import HealthRules
    from gpuctl.ops.gather import Gatherer
    from gpuctl.tui.actions import ActionService

StoreOpener = Callable[[bool], AbstractContextManager[Store]]  # (write) -> the store, closed after
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


class LiveSource:
    """The inventory through one `Gatherer`, reused for the app's life (connections stay open).
    Every node has its own deadline in the Gatherer: a hung node comes back as a `timeout`
    snapshot, never a stuck poll."""

    live = True

    def __init__(self, inventory: Inventory, gatherer: Gatherer, label: str) -> None:
        self.inventory = inventory
        self.gatherer = gatherer
        self.label = label
        slowest = max(
            (n.connect_timeout_s + n.command_timeout_s for n in inventory.nodes), default=0.0
        )
        self.deadline_s = slowest + POLL_MARGIN_S

    def poll(self) -> FleetSnapshot:
        return self.gatherer.gather(self.inventory)

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
    open_store: StoreOpener
    clock: Clock
    actions: ActionService | None = None
    rules: HealthRules | None = None
    expected_gpus: Mapping[str, int | None] = dataclasses.field(default_factory=dict)
    logs: LogReader | None = None
    settings: Settings = dataclasses.field(default_factory=Settings)
    operator: str = "unknown"

    def close(self) -> None:
        self.source.close()
        if isinstance(self.open_store, KeptStore):
            self.open_store.close()


def state_store(state_dir: Path) -> StoreOpener:
    """Open the SQLite store of `state_dir` for one read or one write, closed after."""

    @contextlib.contextmanager
    def opener(write: bool) -> Iterator[Store]:
        from gpuctl.adapters.store import open_store

        store = open_store(state_dir, write=write)
        try:
            yield store
        finally:
            store.close()

    return opener


class KeptStore:
    """A `StoreOpener` for the dashboard: reads go through one read-only connection kept open,
    whose reads are remembered until the database changes (`adapters.store.memo.MemoStore`);
    each write opens the store for that write alone. `close()` closes the kept connection."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._kept: MemoStore | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, write: bool) -> Iterator[Store]:
        from gpuctl.adapters.store import open_store

        if write:
            with open_store(self.state_dir, write=True) as store:
                yield store
            return
        store = self._reader()
        try:
            yield store
        finally:
            if store is not self._kept:
                store.close()

    def _reader(self) -> MemoStore:
        from gpuctl.adapters.store.memo import MemoStore
        from gpuctl.adapters.store.opening import open_connection

        with self._lock:
            kept = self._kept
            if kept is not None:
                try:
                    if kept.still_current():
                        return kept
                except StateError:
                    pass
                self._kept = None
                kept.close()
            store = MemoStore(open_connection(self.state_dir, write=False))
            if not store.ephemeral:  # no database yet: look again next time
                self._kept = store
            return store

    def close(self) -> None:
        with self._lock:
            if self._kept is not None:
                self._kept.close()
                self._kept = None


def live_services(
    inventory: Inventory,
    *,
    label: str,
    open_store: StoreOpener,
    clock: Clock,
    operator: str,
    transport_factory: Callable[[], Transport] | None = None,
    readonly: bool = False,
    env: Mapping[str, str] | None = None,
    state_dir: Path | None = None,
) -> Services:
    """The dashboard over a live fleet: one transport shared by the Gatherer, the log reader and
    the actions (drain and consolidation move jobs through the job runner)."""
    from gpuctl.adapters.node import SshJobRunner
    from gpuctl.config.health_rules import load_rules
    from gpuctl.ops.gather import Gatherer, default_transport
    from gpuctl.tui.actions import FleetActions

    transport = transport_factory() if transport_factory else default_transport()
    gatherer = Gatherer(transport, clock=clock)
    runner = SshJobRunner(transport)
    actions = FleetActions(
        open_store=open_store,
        clock=clock,
        operator=operator,
        inventory=inventory,
        fleet=gatherer,
        runner=runner,
        env=env,
        state_dir=None if state_dir is None else str(state_dir),
    )
    return Services(
        source=LiveSource(inventory, gatherer, label),
        open_store=open_store,
        clock=clock,
        actions=None if readonly else actions,
        rules=load_rules(),
        expected_gpus={n.name: n.expected_gpus for n in inventory.nodes},
        logs=RemoteLogs(runner, inventory),
        operator=operator,
    )


def saved_services(path: Path, *, open_store: StoreOpener, clock: Clock) -> Services:
    """Offline review of a saved snapshot: read-only, no logs (no nodes to ask)."""
    from gpuctl.config.health_rules import load_rules

    return Services(
        source=SavedSource(path), open_store=open_store, clock=clock, rules=load_rules()
    )
