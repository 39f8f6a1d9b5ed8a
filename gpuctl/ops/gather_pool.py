"""Fleet gather over several poller processes: each process polls its own share of the nodes with
its own SSH connections and answering sessions (an in-process `Gatherer` on a transport of its
own), so one round of a large fleet uses several cores, not one (one process covers about 1,400
warm node polls per second of a core: benchmarks/README.md).

- **Sharding**: a node's poller is chosen by a stable hash of its name (crc32), once, and kept for
  the gatherer's life, so its connection and session stay warm in that process. A poller takes at
  most `max_connections` nodes (its connections, beside the jump hosts they go through); a node
  whose poller is full goes to the next one with room, and a fleet larger than all of them
  together gets more pollers than asked for.
- **What comes back**: the workers parse each probe themselves and send the node's snapshot back
  pickled (about 0.09 ms of the parent's CPU to load one, against 0.37 ms to parse the answer:
  the parse runs on every core, the parent only collects).
- **The same outcomes**: each worker uses the same `SshTransport` (host keys, known_hosts,
  ProxyJump, deadlines), so a node's reach and one-line error are what they are in process.
  Slurm's view is read once, in the parent, over the parent's transport.
- **A worker that dies**: its nodes read as transport errors for that round ("poller process N
  died ..."), it is started again at once (its nodes connect afresh the next round), and no round
  waits for it. A worker still busy far past every deadline its nodes could take is killed the
  same way: a round never hangs.
- **Start method**: `spawn`, never `fork`: the parent runs paramiko's reader threads, the
  watchdog and the thread pool, and a fork copies their locks as they are (one held at the fork
  stays held in the child forever); a spawned worker is a fresh interpreter.
- **Shutdown**: `close()` asks each worker to stop and waits for it (then kills it); a worker whose
  parent is gone sees its pipe close and exits, so none is left behind. Workers ignore SIGINT and
  SIGTERM: they stop with their parent (a Ctrl-C of the terminal reaches the whole group).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import multiprocessing
import os
import resource
import signal
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.protocols import Clock, Transport
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSnapshot, NodeSpec, NodeState, Reach
from gpuctl.errors import TransportError
from gpuctl.ops.fanout import DEFAULT_MAX_WORKERS
from gpuctl.ops.gather import Gatherer, Progress
from gpuctl.ops.slurm import SlurmPoll

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 2000  # nodes (each one SSH connection) per poller process
AUTO_MIN_NODES = 200  # smaller fleets are polled in process: a worker costs more than it saves
AUTO_MAX_POLLERS = 16
STOP_WAIT_S = 5.0  # how long close() waits for a worker to stop before killing it
_SLACK_S = 30.0

TransportFactory = Callable[[], Transport]


def auto_pollers(nodes: int, cores: int | None = None) -> int:
    """The pollers a fleet of `nodes` gets by default: 1 (in process) under `AUTO_MIN_NODES`,
    else one per core this process may run on (`os.sched_getaffinity`), at most
    `AUTO_MAX_POLLERS`."""
    if nodes < AUTO_MIN_NODES:
        return 1
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return max(1, min(cores, AUTO_MAX_POLLERS))


@dataclasses.dataclass(frozen=True, slots=True)
class PollerInfo:
    """One poller process as its last answer left it."""

    index: int
    pid: int | None  # None: not running (never started, or died and not started again yet)
    nodes: int  # nodes assigned to it
    connects: int  # SSH connections its transport opened so far
    cpu_s: float  # its CPU time so far (user + system, every thread)


@dataclasses.dataclass
class _Poller:
    index: int
    process: BaseProcess | None = None
    conn: Connection | None = None
    sent: dict[str, NodeSpec] = dataclasses.field(default_factory=dict)  # what it holds
    nodes: int = 0
    connects: int = 0
    cpu_s: float = 0.0  # the running process's, as it last said
    cpu_past_s: float = 0.0  # its processes' before this one (died or were killed)
    starts: int = 0


class PoolGatherer:
    """`gather` (a `FleetReader`) over `pollers` worker processes; see the module's doc. Keep one
    for the life of a command: the workers keep their connections between polls. `transport` is
    the parent's (for Slurm's view only), borrowed: `close()` leaves it open."""

    def __init__(
        self,
        transport_factory: TransportFactory,
        *,
        pollers: int,
        transport: Transport | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        clock: Clock | None = None,
        threads: int = DEFAULT_MAX_WORKERS,
    ) -> None:
        if pollers < 1 or max_connections < 1:
            raise ValueError("pollers and max_connections must be at least 1")
        self._factory = transport_factory
        self._wanted = pollers
        self._max = max_connections
        self._clock = clock or SystemClock()
        self._threads = threads
        self._ctx = multiprocessing.get_context("spawn")
        self._pollers: list[_Poller] = [_Poller(i) for i in range(pollers)]
        self._home: dict[str, int] = {}
        self._slurm = SlurmPoll(transport) if transport is not None else None
        self._round = 0
        self._closed = False

    # -- the FleetReader -----------------------------------------------------------------------

    def gather(
        self, nodes: Inventory | Iterable[NodeSpec], *, progress: Progress | None = None
    ) -> FleetSnapshot:
        if self._closed:
            raise RuntimeError("the gatherer is closed")
        specs: Sequence[NodeSpec] = nodes.nodes if isinstance(nodes, Inventory) else tuple(nodes)
        taken_at = self._clock.now()
        if self._slurm is not None:
            self._slurm.start(specs, taken_at)
        shards: dict[int, dict[str, NodeSpec]] = {}
        for spec in specs:
            shards.setdefault(self._assign(spec.name), {})[spec.name] = spec
        self._round += 1
        results: dict[str, NodeSnapshot] = {}
        busy: dict[int, tuple[list[NodeSpec], float]] = {}  # poller -> (its nodes, deadline)
        started = time.monotonic()

        def report(done: Sequence[NodeSnapshot]) -> None:
            results.update((snap.name, snap) for snap in done)
            if progress is not None:
                base = len(results) - len(done)
                for k, snap in enumerate(done, 1):
                    progress(snap, base + k, len(specs))

        for index, shard in shards.items():
            poller = self._pollers[index]
            work = list(shard.values())
            if self._send(poller, work):
                busy[index] = (work, started + _bound(work, self._threads))
            else:
                report(self._lost(poller, work, "could not be reached", taken_at, started))

        while busy:
            waits: dict[Any, int] = {}  # each busy poller's pipe and process sentinel
            for index in busy:
                poller = self._pollers[index]
                assert poller.conn is not None and poller.process is not None
                waits[poller.conn] = waits[poller.process.sentinel] = index
            timeout = max(0.0, min(d for _w, d in busy.values()) - time.monotonic())
            for index in sorted({waits[r] for r in wait(list(waits), timeout)}):
                poller = self._pollers[index]
                work = busy[index][0]
                answer = self._receive(poller)
                if answer is None:  # it died (or closed its pipe) before answering
                    del busy[index]
                    report(self._lost(poller, work, self._death(poller), taken_at, started))
                elif answer[0] == self._round:
                    del busy[index]
                    report(answer[1])
            now = time.monotonic()
            for index, (work, deadline) in list(busy.items()):
                if now >= deadline:
                    del busy[index]
                    poller = self._pollers[index]
                    why = f"did not answer within {deadline - started:.0f}s and was killed"
                    report(self._lost(poller, work, why, taken_at, started))
        for poller in self._pollers:  # the dead ones start again now, warm by the next round
            if poller.nodes and poller.process is None:
                self._start(poller)
        return FleetSnapshot(
            taken_at=taken_at,
            nodes=tuple(results[s.name] for s in specs),
            scheduler=self._slurm.result() if self._slurm is not None else None,
        )

    def pollers(self) -> tuple[PollerInfo, ...]:
        """Each poller process: its pid, its nodes, connections and CPU so far."""
        return tuple(
            PollerInfo(
                index=p.index,
                pid=p.process.pid if p.process is not None else None,
                nodes=p.nodes,
                connects=p.connects,
                cpu_s=p.cpu_past_s + p.cpu_s,
            )
            for p in self._pollers
        )

    def cpu_s(self) -> float:
        """The CPU time of every poller process so far, as their last answers said."""
        return sum(p.cpu_past_s + p.cpu_s for p in self._pollers)

    def close(self) -> None:
        """Stop every worker (asked, then killed past `STOP_WAIT_S`) and wait for it to end."""
        if self._closed:
            return
        self._closed = True
        for poller in self._pollers:
            if poller.conn is not None:
                with contextlib.suppress(OSError):
                    poller.conn.send(None)
        deadline = time.monotonic() + STOP_WAIT_S
        for poller in self._pollers:
            process = poller.process
            if process is not None:
                process.join(max(0.0, deadline - time.monotonic()))
            self._stop(poller)

    def __enter__(self) -> PoolGatherer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pollers -----------------------------------------------------------------------------

    def _assign(self, name: str) -> int:
        """The node's poller: its hash's, or the next one with room; kept once chosen."""
        index = self._home.get(name)
        if index is not None:
            return index
        first = zlib.crc32(name.encode()) % self._wanted
        count = len(self._pollers)
        for step in range(count):
            candidate = self._pollers[(first + step) % count]
            if candidate.nodes < self._max:
                break
        else:
            candidate = _Poller(count)
            self._pollers.append(candidate)
            log.info("poller %d added: every poller holds %d nodes", count, self._max)
        candidate.nodes += 1
        self._home[name] = candidate.index
        return candidate.index

    def _start(self, poller: _Poller) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_serve,
            args=(child, self._factory, self._threads),
            name=f"gpuctl-poller-{poller.index}",
            daemon=True,  # ended by multiprocessing's exit handler should close() be skipped
        )
        process.start()
        child.close()  # only the worker holds its end now: its death closes the pipe
        poller.process, poller.conn, poller.sent = process, parent, {}
        poller.cpu_s = 0.0
        poller.starts += 1

    def _send(self, poller: _Poller, work: list[NodeSpec]) -> bool:
        """Ask the poller for a round of `work`, the specs it does not hold yet shipped along."""
        if poller.process is not None and not poller.process.is_alive():
            self._stop(poller)  # it ended between rounds: a new one, no error to report
        if poller.process is None:
            self._start(poller)
        assert poller.conn is not None
        sent = poller.sent
        changed = [_for_worker(s) for s in work if (old := sent.get(s.name)) is not s and old != s]
        try:
            poller.conn.send((self._round, changed, [s.name for s in work]))
        except OSError:
            return False
        sent.update((s.name, s) for s in work)
        return True

    def _receive(self, poller: _Poller) -> tuple[int, tuple[NodeSnapshot, ...]] | None:
        """The poller's answer: (round, snapshots); None when it died or closed its pipe."""
        conn = poller.conn
        assert conn is not None
        try:
            if not conn.poll():  # only the sentinel was ready: the process ended
                return None
            round_no, snaps, cpu_s, connects = conn.recv()
        except (EOFError, OSError):
            return None
        poller.cpu_s, poller.connects = cpu_s, connects
        return round_no, snaps

    def _death(self, poller: _Poller) -> str:
        process = poller.process
        if process is not None:
            process.join(1.0)
        code = process.exitcode if process is not None else None
        if code is not None and code < 0:
            return f"died (killed by {signal.Signals(-code).name})"
        return "died" if code is None else f"died (exit status {code})"

    def _lost(
        self, poller: _Poller, work: list[NodeSpec], why: str, taken_at: float, started: float
    ) -> tuple[NodeSnapshot, ...]:
        """The poller's nodes this round, as transport errors; its process ended (it is
        started again at the end of the round)."""
        log.warning("poller process %d %s: %d nodes not polled", poller.index, why, len(work))
        self._stop(poller)
        latency = time.monotonic() - started
        return tuple(self._unpolled(spec, poller.index, why, latency, taken_at) for spec in work)

    @staticmethod
    def _unpolled(
        spec: NodeSpec, index: int, why: str, latency: float, taken_at: float
    ) -> NodeSnapshot:
        error = TransportError(
            f"{spec.name}: poller process {index} {why} during this poll; "
            "a new one polls the node next round"
        )
        return NodeSnapshot(
            name=spec.name,
            reach=Reach(error.reach),
            state=NodeState.DOWN,
            error=error.message,
            latency_s=latency,
            taken_at=taken_at,
            labels=dict(spec.labels),
        )

    def _stop(self, poller: _Poller) -> None:
        process, conn = poller.process, poller.conn
        poller.process, poller.conn, poller.sent = None, None, {}
        poller.cpu_past_s += poller.cpu_s
        poller.cpu_s = 0.0
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(STOP_WAIT_S)
            process.close()
        if conn is not None:
            conn.close()


def _bound(work: Sequence[NodeSpec], threads: int) -> float:
    """Longer than a worker could take for `work` with every node at its deadlines: past it the
    worker hangs. Cold nodes go `threads` at a time, each within connect + command (+ a kill)."""
    each = max((s.connect_timeout_s + s.command_timeout_s for s in work), default=0.0)
    return 2 * (math.ceil(len(work) / threads) + 1) * (each + 2.0) + _SLACK_S


def _for_worker(spec: NodeSpec) -> NodeSpec:
    """The spec as a worker polls it: Slurm's view is read by the parent, once."""
    return dataclasses.replace(spec, slurm=None) if spec.slurm is not None else spec


def _serve(conn: Connection, factory: TransportFactory, threads: int) -> None:
    """A poller process: poll the nodes it is asked for with a `Gatherer` of its own, until it
    is told to stop (None) or its parent's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # it stops with its parent, never alone
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    transport = factory()
    specs: dict[str, NodeSpec] = {}
    with Gatherer(transport, max_workers=threads) as gatherer:
        while True:
            try:
                ask: Any = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if ask is None:
                return
            round_no, changed, names = ask
            specs.update((s.name, s) for s in changed)
            fleet = gatherer.gather([specs[n] for n in names])
            usage = resource.getrusage(resource.RUSAGE_SELF)
            connects = getattr(transport, "connects", 0)
            try:
                conn.send((round_no, fleet.nodes, usage.ru_utime + usage.ru_stime, connects))
            except OSError:
                return
