"""Recording the fleet's history (`core.history`) into the store, and reading it back.

`Recorder.record` runs once per control-loop pass: it writes one sample of the five numbers
(`fleetstatus.numbers`, the function the CLI, dashboard, metrics and report read) and one of each
node's use, throttled to the history's resolution (a pass every 5 s records once a minute), and
prunes (downsampling, retention, events) about once an hour. Reading is `window`: the samples of
the last hours, as stored or averaged by the store, for the dashboard's sparklines, the report
and `gpuctl history show`; `series_rows` puts them in the long form report -o csv and history
show print.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from gpuctl.adapters.protocols import Store
from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.history import (
    FLEET_SERIES,
    NODE_SERIES,
    FleetSample,
    NodeSample,
    Pruned,
    Retention,
    average_fleet,
    bucket,
    parse_retention,
)
from gpuctl.core.model import FleetSnapshot, NodeSnapshot, Reach
from gpuctl.core.placement.model import FleetState
from gpuctl.errors import GpuctlError, LeaseLost, UsageError

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 3600.0


def fleet_sample(at: int, step_s: int, numbers: FleetNumbers) -> FleetSample:
    doc = numbers.to_dict()
    return FleetSample(at, step_s, {k: doc.get(k) for k in FLEET_SERIES})


def node_util(node: NodeSnapshot) -> float | None:
    """A node's SM utilization as its samples keep it: the mean of its GPUs that answered,
    whole %; None where the node did not answer."""
    if node.reach is not Reach.OK:
        return None
    utils = [g.util_pct for g in node.gpus if g.util_pct is not None]
    return float(round(sum(utils) / len(utils))) if utils else None


def node_samples(
    at: int, step_s: int, snapshot: FleetSnapshot, state: FleetState
) -> list[NodeSample]:
    """Each node's use: SM utilization and observed memory from the poll (None where the node
    did not answer), allocated and ghost memory and capacity from placement's view."""
    placement = {n.name: n for n in state.nodes}
    out: list[NodeSample] = []
    for node in snapshot.nodes:
        answered = node.reach is Reach.OK
        used = [g.mem_used_mib for g in node.gpus if g.mem_used_mib is not None] if answered else []
        p = placement.get(node.name)
        cards = p.cards if p is not None else ()
        out.append(
            NodeSample(
                at,
                step_s,
                node.name,
                node_util(node),
                sum(used) if used else None,
                sum(c.allocated_mib for c in cards) if p is not None else None,
                sum(c.ghost_mib for c in cards) if p is not None else None,
                sum(c.capacity_mib for c in cards) if cards else None,
            )
        )
    return out


def retention(
    flag: str | None, inventory_s: int | None = None, option: str = "--history-retention"
) -> Retention:
    """How long the history is kept: the flag (`option`) when given, else the inventory's
    `defaults: history_retention:`, else 30 days (`Retention`). UsageError for a bad flag."""
    keep = inventory_s
    if flag is not None:
        try:
            keep = parse_retention(flag)
        except ValueError as exc:
            raise UsageError(f"{option}: {exc}") from None
    return Retention() if keep is None else Retention().with_keep(keep)


class Recorder:
    """Records a sample per resolution step and prunes about once an hour (see the module).

    `shared`: another recorder may write the same store (`metrics serve` beside a control loop):
    the newest stored sample is read again before each write, and a step already recorded by
    either is not recorded again."""

    def __init__(
        self,
        retention: Retention | None = None,
        prune_every_s: float = PRUNE_EVERY_S,
        *,
        shared: bool = False,
    ):
        self.retention = retention or Retention()
        self.prune_every_s = prune_every_s
        self.shared = shared
        self._last_at: float | None = None
        self._read_last = False
        self._pruned_at: float | None = None
        self.last_pruned: Pruned | None = None

    def due(self, store: Store, now: float) -> bool:
        if self.shared or not self._read_last:
            self._last_at, self._read_last = store.last_sample_at(), True
        at = bucket(now, self.retention.resolution_s)
        return self._last_at is None or at > self._last_at

    def record(
        self,
        store: Store,
        now: float,
        snapshot: FleetSnapshot,
        state: FleetState | None = None,
        numbers: FleetNumbers | None = None,
    ) -> bool:
        """One sample, when a resolution step has passed since the last one; then a prune when
        one is due. True when a sample was written."""
        from gpuctl.ops import fleetstatus

        if not self.due(store, now):
            return False
        step = self.retention.resolution_s
        at = bucket(now, step)
        state = state if state is not None else fleetstatus.fleet_state(snapshot, store)
        numbers = (
            numbers
            if numbers is not None
            else fleetstatus.numbers(snapshot, store, now, state=state)
        )
        store.record_samples(
            fleet_sample(at, step, numbers), node_samples(at, step, snapshot, state)
        )
        self._last_at = at
        if self._pruned_at is None or now - self._pruned_at >= self.prune_every_s:
            self.last_pruned = store.prune_history(now, self.retention)
            self._pruned_at = now
        return True

    def record_quietly(self, store: Store, now: float, snapshot: FleetSnapshot) -> bool:
        """`record`, a store that refuses logged, never raised: history never stops the loop
        (but a controller's lost lease goes through: it steps down at once)."""
        try:
            return self.record(store, now, snapshot)
        except LeaseLost:  # a controller that lost its lease steps down now
            raise
        except GpuctlError as exc:
            log.warning("the fleet's history was not recorded: %s", exc.message)
            return False


def window(
    store: Store,
    now: float,
    seconds: float,
    *,
    step_s: int | None = None,
    until: float | None = None,
    node: str | None = None,
) -> tuple[list[FleetSample], list[NodeSample]]:
    """The fleet's and the nodes' samples of the last `seconds` (up to `until`, only `node`'s
    when given, and then no fleet sample), oldest first, then by node. `step_s`: averaged into
    buckets of `step_s` (`core.history.average_fleet`, `average_nodes`), the nodes' by the store
    (one row per node and bucket read, not every sample); None: as stored."""
    since = now - seconds
    fleet = [] if node is not None else store.fleet_samples(since, until)
    if step_s is None:
        return fleet, store.node_samples(since, until, node)
    return average_fleet(fleet, step_s), store.node_sample_buckets(since, step_s, until, node)


CSV_COLUMNS = ("at", "step_s", "series", "node", "value")
SERIES = FLEET_SERIES + NODE_SERIES


def series_rows(
    fleet: Sequence[FleetSample], nodes: Sequence[NodeSample], name: str | None = None
) -> Iterator[tuple[int, int, str, str, float | None]]:
    """The samples in long form, `CSV_COLUMNS`' order (at, step_s, series, node, value; node ""
    for a fleet number): the fleet's rows, then the nodes'; only series `name` when given.
    `gpuctl report -o csv` and `gpuctl history show` print these."""
    fleet_names = [k for k in FLEET_SERIES if name in (None, k)]
    node_names = [(i, k) for i, k in enumerate(NODE_SERIES) if name in (None, k)]
    for s in fleet if fleet_names else ():
        for k in fleet_names:
            yield s.at, s.step_s, k, "", s.get(k)
    for n in nodes if node_names else ():
        values = n.values()
        for i, k in node_names:
            yield n.at, n.step_s, k, n.node, values[i]


def fleet_series(samples: Sequence[FleetSample], name: str) -> list[float | None]:
    """One number's values, oldest first (a sparkline's points)."""
    return [s.get(name) for s in samples]
