"""One fleet reader for every operator's view: the snapshot the control loop published into the
store while it is fresh, else a poll of the nodes (`core.shared`). `status`, `dash` and `metrics
serve` read the fleet through it, so N operators cost the fleet one poll, not N; `--live` polls.

Fresh means: younger than a few of the loop's intervals (`core.shared.fresh`), every node asked
for is in it, and, when the store knows of a controller's lease, the loop that published it still
holds that lease (a controller that died stops being read at once, not when its snapshot ages).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from gpuctl.adapters.protocols import Clock, Store
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSpec
from gpuctl.core.shared import PublishedFleet, fresh, seen_line
from gpuctl.errors import StateError
from gpuctl.ops.parts import FleetReader

log = logging.getLogger(__name__)

ReadStore = Callable[[], AbstractContextManager[Store]]


class SharedFleet:
    """A `FleetReader` that prefers the published snapshot (see the module docstring). `seen`:
    what the last `gather` read from the store (None: it polled the nodes)."""

    def __init__(
        self,
        read_store: ReadStore,
        poller: FleetReader | None,
        clock: Clock,
        *,
        live: bool = False,
    ) -> None:
        self.read_store = read_store
        self.poller = poller
        self.clock = clock
        self.live = live
        self.seen: PublishedFleet | None = None
        self._decoded: tuple[int | None, FleetSnapshot] | None = None
        self._lock = threading.Lock()

    def gather(self, nodes: Inventory | Iterable[NodeSpec], progress: Any = None) -> FleetSnapshot:
        specs = tuple(nodes.nodes if isinstance(nodes, Inventory) else nodes)
        found = None if self.live else self.published(specs)
        if found is not None:
            return found
        if self.poller is None:
            raise ValueError("no published snapshot is fresh and there is no poller")
        if progress is not None:
            return self.poller.gather(specs, progress=progress)  # type: ignore[call-arg]
        return self.poller.gather(specs)

    def seen_line(self) -> str | None:
        """`fleet as the controller saw it 4s ago`, or None when the last gather polled."""
        seen = self.seen
        return None if seen is None else seen_line(seen, self.clock.now())

    def close(self) -> None:
        close = getattr(self.poller, "close", None)
        if close is not None:
            close()

    def published(self, nodes: Iterable[NodeSpec]) -> FleetSnapshot | None:
        """The published snapshot of `nodes` when it is fresh (`seen` says which), else None."""
        self.seen = None
        specs = tuple(nodes)
        try:
            with self.read_store() as store:
                published = store.latest_snapshot()
                live = controller_live(store, published)
        except StateError as exc:
            log.info("the published snapshot could not be read: %s", exc.message)
            return None
        now = self.clock.now()
        if published is None or not fresh(published, now, live=live):
            return None
        snapshot = self._decode(published)
        if snapshot is None:
            return None
        by_name = {n.name: n for n in snapshot.nodes}
        if any(s.name not in by_name for s in specs):
            return None  # a node the loop does not poll: ask the nodes
        self.seen = published
        return FleetSnapshot(
            snapshot.taken_at, tuple(by_name[s.name] for s in specs), snapshot.scheduler
        )

    def _decode(self, published: PublishedFleet) -> FleetSnapshot | None:
        with self._lock:
            if self._decoded is not None and self._decoded[0] == published.id:
                return self._decoded[1]
            try:
                snapshot = published.snapshot()
            except ValueError as exc:
                log.warning("the published snapshot %s is unreadable: %s", published.id, exc)
                return None
            self._decoded = (published.id, snapshot)
            return snapshot


def controller_live(store: Store, published: PublishedFleet | None) -> bool | None:
    """Whether the loop that published `published` still holds the controller's lease: False
    when the store's lease is that publisher's and has expired; None when the store has no lease
    for it (a `reconcile --watch` publishes without one: its snapshot's age alone decides)."""
    read = getattr(store, "lease", None)
    if published is None or read is None:
        return None
    lease = read()
    if lease is None or getattr(lease, "holder", None) != published.publisher:
        return None
    return bool(lease.live)
