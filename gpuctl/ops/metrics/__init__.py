"""Prometheus metrics: the fleet's latest reading as an exposition, refreshed by its own loop.

A `Refresher` polls the fleet (one `Gatherer` kept for its life) and reads the store every
`interval_s`, and turns what it saw into a `Reading`: the five numbers exactly as `gpuctl status`
computes them (`gpuctl.ops.fleetstatus.numbers`), each node's reachability and health verdict,
each GPU's allocated / observed / total memory, utilization, temperature and what the probe read
of it (power, ECC, retired pages, remapped rows, thermal slowdown, XIDs), the live jobs and the
jobs on each GPU, counts of the store's failover, preemption and drain events, and every started
job's queue wait (a histogram). `FleetCollector` holds the latest reading and the server
(`_serve`) sends its exposition, written once per reading: a scrape never triggers a poll. With
`from_store`, nothing is polled: the job figures, the live jobs, the counters and the control
loop's view of node liveness come from the store.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from gpuctl.adapters.protocols import Clock, Store
from gpuctl.core.health import HealthRules, NodeVerdict, evaluate_fleet
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSnapshot, Reach, XidEvent, pci_key
from gpuctl.errors import GpuctlError, StateError
from gpuctl.ops import fleetstatus
from gpuctl.ops.health import FleetGatherer, SampleHistory
from gpuctl.ops.history import Recorder
from gpuctl.ops.metrics._exposition import (
    COUNTED_EVENTS,
    NodeReading,
    Reading,
    families,
    series,
)
from gpuctl.ops.metrics._jobs import read_jobs
from gpuctl.ops.metrics._serve import serve
from gpuctl.ops.metrics._text import GpuReading, JobReading

log = logging.getLogger(__name__)


def event_counts(store: Store) -> dict[str, int]:
    """How many events of each counted kind the audit log holds."""
    counts = dict.fromkeys(COUNTED_EVENTS, 0)
    for event in store.events(kinds=tuple(COUNTED_EVENTS)):
        counts[event.kind] += 1
    return counts


def queue_waits(store: Store) -> tuple[float, ...]:
    """Submit to first start of every job of the store that ever started (never below 0)."""
    return tuple(
        max(0.0, j.first_started_at - j.submitted_at)
        for j in store.jobs()
        if j.first_started_at is not None
    )


def read_fleet(
    snapshot: FleetSnapshot,
    store: Store | None,
    now: float,
    verdicts: Sequence[NodeVerdict],
) -> Reading:
    """The reading of one poll: `numbers` exactly as `gpuctl status` computes them."""
    state = fleetstatus.fleet_state(snapshot, store)
    figures = fleetstatus.numbers(snapshot, store, now, state=state)
    states = fleetstatus.node_states(snapshot, store)
    placed = {n.name: n for n in state.nodes}
    judged = {v.name: v for v in verdicts}
    polled = {
        n.name: n.observation.processes
        for n in snapshot.nodes
        if n.reach is Reach.OK and n.observation is not None
    }
    jobs = read_jobs(store, now, polled) if store is not None else None
    on_cards = jobs.on_cards if jobs is not None else {}
    nodes, gpus = [], []
    for node in snapshot.nodes:
        place = placed.get(node.name)
        verdict = judged.get(node.name)
        nodes.append(
            NodeReading(
                node.name,
                node.reach is Reach.OK,
                None if place is None else place.schedulable,
                None if verdict is None else verdict.verdict,
                states[node.name].state.value,
            )
        )
        cards = {c.index: c for c in place.cards} if place is not None else {}
        gpu_verdicts = {g.index: g.verdict for g in verdict.gpus} if verdict is not None else {}
        xids = _xids_by_gpu(node)
        hostname = node.observation.facts.hostname if node.observation is not None else None
        for g in node.gpus:
            card = cards.get(g.index)
            pci = pci_key(g.pci_bus_id)
            mine = xids.get(pci, ()) if pci is not None else ()
            gpus.append(
                GpuReading(
                    node=node.name,
                    index=g.index,
                    uuid=g.uuid,
                    model=g.model,
                    total_mib=g.mem_total_mib,
                    observed_mib=g.mem_used_mib,
                    allocated_mib=None if card is None else card.allocated_mib,
                    ghost_mib=None if card is None else card.ghost_mib,
                    util_pct=g.util_pct,
                    temp_c=g.temp_c,
                    verdict=gpu_verdicts.get(g.index),
                    hostname=hostname,
                    pci_bus_id=g.pci_bus_id,
                    card=g,
                    last_xid=mine[-1].xid if mine else 0,
                    xids=tuple(sorted(Counter(x.xid for x in mine).items())),
                    jobs=on_cards.get((node.name, g.index), ()),
                )
            )
    counters = event_counts(store) if store is not None else None
    waits = queue_waits(store) if store is not None else None
    return Reading(
        now,
        0.0,
        "gather",
        figures,
        tuple(nodes),
        tuple(gpus),
        counters,
        queue_waits=waits,
        jobs=jobs.jobs if jobs is not None else None,
    )


def _xids_by_gpu(node: NodeSnapshot) -> dict[tuple[int, int, int] | None, list[XidEvent]]:
    """The XIDs of the node's kernel log by the PCI address they name, oldest first."""
    out: dict[tuple[int, int, int] | None, list[XidEvent]] = {}
    for x in node.observation.xids if node.observation is not None else ():
        out.setdefault(pci_key(x.pci_bus_id), []).append(x)
    return out


def read_store(store: Store, now: float) -> Reading:
    """The reading of the store alone: job figures, counters, the control loop's liveness."""
    figures = fleetstatus.numbers(FleetSnapshot(taken_at=now, nodes=()), store, now)
    figures = figures.without_poll()
    nodes = tuple(
        NodeReading(name, not live.down, None, None)
        for name, live in sorted(store.liveness().items())
    )
    return Reading(
        now,
        0.0,
        "store",
        figures,
        nodes,
        (),
        event_counts(store),
        queue_waits=queue_waits(store),
        jobs=read_jobs(store, now, None).jobs,
    )


class FleetCollector:
    """Holds the latest reading for the server; a scrape never polls."""

    def __init__(self) -> None:
        self._latest: Reading | None = None

    @property
    def latest(self) -> Reading | None:
        return self._latest

    def update(self, reading: Reading) -> None:
        self._latest = reading  # one reference swap: a scrape sees one whole reading

    def render(self) -> tuple[Reading | None, bytes]:
        """The latest reading and its exposition."""
        latest = self._latest
        return latest, exposition(latest)


class _Families:
    def __init__(self, reading: Reading) -> None:
        self._reading = reading

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return families(self._reading)


def exposition_parts(reading: Reading | None) -> list[bytes]:
    """The text exposition of one reading in pieces (the server sends them as they are): the
    fleet's families through prometheus_client, then the per-node, per-GPU and per-job ones
    (`series`). Nothing before the first refresh (None)."""
    if reading is None:
        return []
    registry = CollectorRegistry(auto_describe=False)  # our own, never the process-wide one
    registry.register(_Families(reading))
    return [generate_latest(registry), *series(reading)]


def exposition(reading: Reading | None) -> bytes:
    """The text exposition of one reading (`gpuctl metrics dump`)."""
    return b"".join(exposition_parts(reading))


# --- refreshing ----------------------------------------------------------------------------------

StoreOpener = Callable[[], Store]
WriterOpener = Callable[[], AbstractContextManager[Store]]


class Refresher:
    """Polls (unless `inventory` is None: store only) and reads the store into a `Reading`.

    Keeps the health samples of its own polls in memory (the same keep and age as the health
    history), so sustained heat is told from a spike across refreshes. After `record_history`, a
    poll also records the fleet's history (`ops.history`), once per resolution step and only when
    no one (a control loop) has recorded that step already, into a store that exists; it writes
    nothing else.
    """

    def __init__(
        self,
        *,
        open_store: StoreOpener,
        clock: Clock,
        rules: HealthRules,
        inventory: Inventory | None = None,
        gatherer: FleetGatherer | None = None,
    ) -> None:
        if (inventory is None) != (gatherer is None):
            raise ValueError("a poll needs both the inventory and a gatherer")
        self._recorder: Recorder | None = None
        self._open_writer: WriterOpener | None = None
        self._open_store = open_store
        self._clock = clock
        self._rules = rules
        self._inventory = inventory
        self.inventory = inventory
        self._gatherer = gatherer
        self._history = SampleHistory()  # in memory: the server never writes the CLI's file
        self._counters: Mapping[str, int] | None = None
        self._queue_waits: tuple[float, ...] | None = None

    def refresh(self) -> Reading:
        started = self._clock.monotonic()
        now = self._clock.now()
        snapshot = None
        if self._inventory is not None and self._gatherer is not None:
            snapshot = self._gatherer.gather(self._inventory.nodes)
        store: Store | None = None
        error: str | None = None
        try:
            store = self._open_store()
        except StateError as exc:
            error = exc.message
        try:
            if snapshot is not None:
                reading = read_fleet(snapshot, store, now, self._judge(snapshot))
                if store is not None:
                    self._record(store, now, snapshot, reading)
            elif store is not None:
                reading = read_store(store, now)
            else:
                reading = Reading(now, 0.0, "store", None)
        finally:
            if store is not None:
                store.close()
        if reading.counters is not None:
            self._counters = reading.counters
        if reading.queue_waits is not None:
            self._queue_waits = reading.queue_waits
        return dataclasses.replace(
            reading,
            duration_s=self._clock.monotonic() - started,
            counters=self._counters,  # the last counts read, while the store refuses
            queue_waits=self._queue_waits,  # likewise: a histogram is a counter
            store_error=error,
        )

    def record_history(self, recorder: Recorder, open_writer: WriterOpener) -> None:
        """Record the fleet's history with `recorder` (made `shared`) into the store
        `open_writer` opens for writing, from each poll on (never from the store alone)."""
        recorder.shared = True
        self._recorder, self._open_writer = recorder, open_writer

    def _record(self, store: Store, now: float, snapshot: FleetSnapshot, reading: Reading) -> None:
        """The fleet's history, when a step is due (asked of the store read, then again of the
        store written); a store that refuses is logged, never raised."""
        recorder, open_writer = self._recorder, self._open_writer
        if recorder is None or open_writer is None or getattr(store, "ephemeral", False):
            return  # (a store not created yet stays so: the exporter of a fleet gpuctl does
            # not run creates no state; the control loop's first write creates it)
        try:
            if not recorder.due(store, now):
                return
            with open_writer() as writer:
                recorder.record(writer, now, snapshot, numbers=reading.numbers)
        except GpuctlError as exc:
            log.warning("the fleet's history was not recorded: %s", exc.message)

    def seen_line(self) -> str | None:
        """How old the fleet the last refresh read was, when it read the controller's published
        snapshot instead of polling (`ops.shared_fleet`); None when it polled or read none."""
        seen = getattr(self._gatherer, "seen_line", None)
        return seen() if callable(seen) else None

    def _judge(self, snapshot: FleetSnapshot) -> tuple[NodeVerdict, ...]:
        assert self._inventory is not None
        expected = {s.name: s.expected_gpus for s in self._inventory.nodes}
        earlier = self._history.record(snapshot.nodes)
        return evaluate_fleet(snapshot, earlier, expected_gpus=expected, rules=self._rules)

    def run(
        self,
        collector: FleetCollector,
        interval_s: float,
        stop: threading.Event,
        on_refresh: Callable[[Reading | None, str | None], None] | None = None,
    ) -> None:
        """Refresh every `interval_s` until `stop` is set. A refresh that fails keeps the last
        values served (`on_refresh(None, why)`); one that takes longer than the interval is
        followed by the next at once, never by a pile-up."""
        while not stop.is_set():
            started = self._clock.monotonic()
            try:
                reading = self.refresh()
            except GpuctlError as exc:
                self._report(on_refresh, None, exc.message)
            except Exception as exc:  # the server outlives one bad refresh
                self._report(on_refresh, None, f"{type(exc).__name__}: {exc}")
            else:
                collector.update(reading)
                self._report(on_refresh, reading, None)
            stop.wait(max(0.0, interval_s - (self._clock.monotonic() - started)))

    @staticmethod
    def _report(
        on_refresh: Callable[[Reading | None, str | None], None] | None,
        reading: Reading | None,
        error: str | None,
    ) -> None:
        if on_refresh is not None:
            on_refresh(reading, error)


# --- serving -------------------------------------------------------------------------------------


class MetricsServer:
    """The HTTP endpoint (`/metrics`, any path) on `address:port`; port 0 picks a free one."""

    def __init__(self, collector: FleetCollector, address: str, port: int) -> None:
        self._httpd, self._thread = serve(address, port, lambda: collector.latest, exposition_parts)
        self.address = address
        self.port = int(self._httpd.server_port)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)


__all__ = [
    "COUNTED_EVENTS",
    "FleetCollector",
    "GpuReading",
    "JobReading",
    "MetricsServer",
    "NodeReading",
    "Reading",
    "Refresher",
    "event_counts",
    "exposition",
    "exposition_parts",
    "families",
    "queue_waits",
    "read_fleet",
    "read_store",
]
