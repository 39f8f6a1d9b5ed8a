"""The dashboard's sparklines over time: the numbers and each node's SM utilization over a window
(`1h`, `6h` or `24h`, one point per minute, 5 or 20 minutes), so they survive a restart and show
hours, not the last two minutes.

`DashHistory` reads the store's history through `ops.history.window` (what the report reads) when
the dashboard starts and again as each point's bucket ends (only what is new), averaged into the
window's points (the nodes' by the store: one row per node and point, not every sample), and
puts each refresh's live values into the newest point. A store without history in the window (no
control loop recording) leaves the last `RECENT_POINTS` refreshes kept in memory, as before. It
lives in the poll worker; each refresh hands the screens a frozen `HistoryView`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Mapping

from gpuctl.adapters.protocols import Store
from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.history import FLEET_SERIES, bucket
from gpuctl.core.model import FleetSnapshot
from gpuctl.errors import GpuctlError, UsageError

log = logging.getLogger(__name__)

# name -> (seconds shown, seconds per point)
HISTORY_WINDOWS: Mapping[str, tuple[int, int]] = {
    "1h": (3600, 60),
    "6h": (6 * 3600, 300),
    "24h": (24 * 3600, 1200),
}
DEFAULT_WINDOW = "6h"
RECENT_POINTS = 60  # refreshes kept in memory while the store has no history

Points = tuple[float | None, ...]


def parse_history_window(name: str) -> str:
    """A history window's name (`1h`, `6h`, `24h`), or UsageError naming the choices."""
    text = name.strip().lower()
    if text not in HISTORY_WINDOWS:
        raise UsageError(
            f"--history must be one of {', '.join(HISTORY_WINDOWS)}, got {name!r}",
            hint="e.g. --history 6h",
        )
    return text


def next_history_window(name: str) -> str:
    """The window after `name`, round again (the dashboard's `h` key)."""
    names = list(HISTORY_WINDOWS)
    return names[(names.index(name) + 1) % len(names)]


@dataclasses.dataclass(frozen=True, slots=True)
class HistoryView:
    """What the sparklines show after one refresh: each fleet series (`core.history.FLEET_SERIES`
    names) and each node's utilization, oldest point first, None where nothing was recorded.
    `stored`: the points are the window's (from the store's history and this run); False: the
    last refreshes, in memory."""

    window: str
    step_s: int
    stored: bool
    fleet: Mapping[str, Points]
    nodes: Mapping[str, Points]

    def series(self, name: str) -> Points:
        return self.fleet.get(name, ())

    def node(self, name: str) -> Points:
        return self.nodes.get(name, ())

    @property
    def label(self) -> str:
        """How the status line names it."""
        return f"history {self.window}" if self.stored else "history: this run"


class DashHistory:
    """The points of the window the operator chose (`want`); see the module. Updated by the
    poll worker only (`update`); `want` may be called from the UI thread."""

    def __init__(self, window: str = DEFAULT_WINDOW, recent: int = RECENT_POINTS) -> None:
        self.wanted = parse_history_window(window)
        self.recent = recent
        self._reset(self.wanted)

    def want(self, window: str) -> None:
        """Show `window` from the next refresh on (read from the store again)."""
        self.wanted = parse_history_window(window)

    def _reset(self, window: str) -> None:
        self.window = window
        self.seconds, self.step_s = HISTORY_WINDOWS[window]
        self.points = self.seconds // self.step_s
        self._first: int | None = None  # the bucket of the first point
        self._fleet: dict[str, list[float | None]] = {k: [] for k in FLEET_SERIES}
        self._nodes: dict[str, list[float | None]] = {}
        self._read_to: int | None = None  # the store was read up to this bucket's start
        self._stored = False
        self._recent_fleet: dict[str, deque[float | None]] = {
            k: deque(maxlen=self.recent) for k in FLEET_SERIES
        }
        self._recent_nodes: dict[str, deque[float | None]] = {}

    def update(
        self,
        store: Store | None,
        now: float,
        numbers: FleetNumbers,
        snapshot: FleetSnapshot,
    ) -> HistoryView:
        """Read what the store has new (when a bucket ended), add this refresh's values, and
        return the view. A store that refuses to be read leaves the points as they were."""
        from gpuctl.ops.history import fleet_sample, node_util

        if self.wanted != self.window:
            self._reset(self.wanted)
        current = bucket(now, self.step_s)
        self._align(current - (self.points - 1) * self.step_s)
        if store is not None and (self._read_to is None or current > self._read_to):
            self._read(store, now, current)
        live = fleet_sample(current, self.step_s, numbers)
        utils = {n.name: node_util(n) for n in snapshot.nodes}
        for name, values in self._fleet.items():
            values[-1] = live.get(name)
            self._recent_fleet[name].append(live.get(name))
        for name, util in utils.items():
            self._node_points(name)[-1] = util
            recent = self._recent_nodes.get(name)
            if recent is None:
                recent = self._recent_nodes[name] = deque(maxlen=self.recent)
            recent.append(util)
        return self._view()

    def _align(self, first: int) -> None:
        """Points from bucket `first` to the current one: older ones dropped, new ones empty."""
        if self._first is None or first - self._first >= self.seconds:
            self._first = first
            for values in (*self._fleet.values(), *self._nodes.values()):
                values[:] = [None] * self.points
            return
        shift = (first - self._first) // self.step_s
        if shift <= 0:
            return
        self._first = first
        for values in (*self._fleet.values(), *self._nodes.values()):
            del values[:shift]
            values.extend([None] * shift)

    def _node_points(self, name: str) -> list[float | None]:
        values = self._nodes.get(name)
        if values is None:
            values = self._nodes[name] = [None] * self.points
        return values

    def _read(self, store: Store, now: float, current: int) -> None:
        from gpuctl.ops.history import window

        assert self._first is not None
        since = self._first if self._read_to is None else max(self._first, self._read_to)
        try:
            fleet, nodes = window(store, now, now - since, step_s=self.step_s)
        except GpuctlError as exc:
            log.warning("the fleet's history could not be read: %s", exc.message)
            return
        self._read_to = current
        for f in fleet:
            i = self._index(f.at)
            if i is not None:
                for name, values in self._fleet.items():
                    values[i] = f.get(name)
        for n in nodes:
            i = self._index(n.at)
            if i is not None:
                self._node_points(n.node)[i] = n.util_pct
        self._stored = self._stored or bool(fleet or nodes)

    def _index(self, at: int) -> int | None:
        assert self._first is not None
        i = (bucket(at, self.step_s) - self._first) // self.step_s
        return i if 0 <= i < self.points else None

    def _view(self) -> HistoryView:
        if self._stored:
            fleet = {k: tuple(v) for k, v in self._fleet.items()}
            nodes = {k: tuple(v) for k, v in self._nodes.items()}
        else:
            fleet = {k: tuple(v) for k, v in self._recent_fleet.items()}
            nodes = {k: tuple(v) for k, v in self._recent_nodes.items()}
        return HistoryView(self.window, self.step_s, self._stored, fleet, nodes)
