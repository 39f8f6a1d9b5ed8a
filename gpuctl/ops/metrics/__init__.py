"""Prometheus metrics: the fleet's latest reading as an exposition, refreshed by its own loop.

A `Refresher` polls the fleet (one `Gatherer` kept for its life) and reads the store every
`interval_s`, and turns what it saw into a `Reading`: the five numbers exactly as `gpuctl status`
computes them (`gpuctl.ops.fleetstatus.numbers`), each node's reachability and health verdict,
each GPU's allocated / observed / total memory, utilization and temperature, and counts of the
store's failover, preemption and drain events, and every started job's queue wait (a histogram).
`FleetCollector` serves the latest reading from its own `CollectorRegistry`: a scrape never
triggers a poll. With `from_store`, nothing is polled: the job figures, the counters and the
control loop's view of node liveness come from the store.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest, start_http_server
from prometheus_client.registry import CollectorRegistry

from gpuctl.adapters.protocols import Clock, Store
from gpuctl.core.health import HealthRules, NodeVerdict, evaluate_fleet
from gpuctl.core.model import FleetSnapshot, Inventory, Reach
from gpuctl.errors import GpuctlError, StateError
from gpuctl.ops import fleetstatus
from gpuctl.ops.health import FleetGatherer, SampleHistory
from gpuctl.ops.metrics._exposition import (
    COUNTED_EVENTS,
    GpuReading,
    NodeReading,
    Reading,
    families,
)


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
        for g in node.gpus:
            card = cards.get(g.index)
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
                )
            )
    counters = event_counts(store) if store is not None else None
    waits = queue_waits(store) if store is not None else None
    return Reading(
        now, 0.0, "gather", figures, tuple(nodes), tuple(gpus), counters, queue_waits=waits
    )


def read_store(store: Store, now: float) -> Reading:
    """The reading of the store alone: job figures, counters, the control loop's liveness."""
    figures = fleetstatus.numbers(FleetSnapshot(taken_at=now, nodes=()), store, now)
    figures = figures.without_poll()
    nodes = tuple(
        NodeReading(name, not live.down, None, None)
        for name, live in sorted(store.liveness().items())
    )
    return Reading(
        now, 0.0, "store", figures, nodes, (), event_counts(store), queue_waits=queue_waits(store)
    )


class FleetCollector:
    """A custom collector serving the latest reading; `collect` never polls."""

    def __init__(self) -> None:
        self._latest: Reading | None = None

    @property
    def latest(self) -> Reading | None:
        return self._latest

    def update(self, reading: Reading) -> None:
        self._latest = reading  # one reference swap: a scrape sees one whole reading

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return families(self._latest)


def registry_for(collector: FleetCollector) -> CollectorRegistry:
    """Our own registry (never the process-wide default one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(reading: Reading | None) -> bytes:
    """The text exposition of one reading (`gpuctl metrics dump`)."""
    collector = FleetCollector()
    if reading is not None:
        collector.update(reading)
    return generate_latest(registry_for(collector))


# --- refreshing ----------------------------------------------------------------------------------

StoreOpener = Callable[[], Store]


class Refresher:
    """Polls (unless `inventory` is None: store only) and reads the store into a `Reading`.

    Keeps the health samples of its own polls in memory (the same keep and age as the health
    history), so sustained heat is told from a spike across refreshes; it writes nothing.
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
        self._open_store = open_store
        self._clock = clock
        self._rules = rules
        self._inventory = inventory
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
        try:
            self._httpd, self._thread = start_http_server(
                port, addr=address, registry=registry_for(collector)
            )
        except OSError as exc:
            raise GpuctlError(
                f"cannot listen on {address}:{port}: {exc.strerror or exc}",
                hint="pick another --port or --address",
            ) from None
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
    "MetricsServer",
    "NodeReading",
    "Reading",
    "Refresher",
    "event_counts",
    "exposition",
    "families",
    "queue_waits",
    "read_fleet",
    "read_store",
    "registry_for",
]
