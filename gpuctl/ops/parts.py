"""The parts every front end runs on besides the store (`gpuctl.ops.stores`), and how each is made
(`gpuctl.ops.compose` puts them together for a run):

- the fleet link: the gatherer that reads the nodes and the job runner that starts and stops jobs
  on them, over one transport (`ssh_link`);
- the clock, and how a wait passes on it (`sleep_of`), and the local minute of day it reads.

The control loop over a store, a fleet link, the inventory and a clock is built by
`gpuctl.ops.loop.control_loop`, beside the loop itself.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from gpuctl.adapters.protocols import Clock, JobRunner, Transport
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSpec

# --- the fleet link ------------------------------------------------------------------------------


class FleetReader(Protocol):
    """One poll of the nodes (`gpuctl.ops.gather.Gatherer` is one)."""

    def gather(self, nodes: Inventory | Iterable[NodeSpec]) -> FleetSnapshot: ...


@dataclasses.dataclass
class FleetLink:
    """How gpuctl reaches the nodes: `gatherer` reads them and `runner` starts, signals and reads
    jobs on them, both over `transport`. It polls as its gatherer does; `close()` closes what the
    link opened (the gatherer's pool and the transport's connections)."""

    gatherer: FleetReader
    runner: JobRunner
    transport: Transport
    closer: Callable[[], None] | None = None

    def gather(self, nodes: Inventory | Iterable[NodeSpec]) -> FleetSnapshot:
        return self.gatherer.gather(nodes)

    def close(self) -> None:
        if self.closer is not None:
            self.closer()


LinkFactory = Callable[[Transport, Clock], FleetLink]


def ssh_link(transport: Transport, clock: Clock) -> FleetLink:
    """The `Gatherer` and the SSH job runner over `transport`; closing it closes the transport."""
    from gpuctl.adapters.node import SshJobRunner
    from gpuctl.ops.gather import Gatherer

    gatherer = Gatherer(transport, clock=clock)
    return FleetLink(gatherer, SshJobRunner(transport), transport, gatherer.close)


# --- the clock -----------------------------------------------------------------------------------


@runtime_checkable
class Sleeps(Protocol):
    def sleep(self, seconds: float) -> None: ...


def sleep_of(clock: Clock) -> Callable[[float], None]:
    """How a wait passes on `clock`: a clock that sleeps by itself (a test's manual clock moves
    on) does; any other waits in real time."""
    return clock.sleep if isinstance(clock, Sleeps) else time.sleep


def minute_of_day(clock: Clock) -> int:
    """The local time of `clock` as minutes since midnight (maintenance windows read it)."""
    local = time.localtime(clock.now())
    return local.tm_hour * 60 + local.tm_min
