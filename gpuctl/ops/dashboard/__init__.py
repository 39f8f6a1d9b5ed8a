"""The dashboard's headless services: what `gpuctl dash` shows, worked out without a terminal.

`Services` is what the dashboard is given (a snapshot source, the store, the clock, the actions of
`gpuctl.ops.actions`, the health rules, job logs; `gpuctl.ops.compose` builds it). `collect` makes
one refresh of it into one frozen `DashData`: the snapshot, the numbers, each node's placement
view, state, health verdict and cordon, the jobs (and why each queued one waits), recent events
and alerts. The TUI draws a `DashData`; `gpuctl dash --once` prints one.

This front re-exports the package's public names; the pieces are private: the sources and the
services bundle (`_sources`), one refresh's values and how they are collected (`_view`), which
events are listed (`_events`: `:events drain,failover`, checkpoints hidden), whose each GPU
process is (`_owners`), each GPU's recent use (`_gpu_history`), the sparklines' points over
the chosen window from the store's history (`_history`).
"""

from __future__ import annotations

from gpuctl.ops.dashboard._events import (
    ALL_EVENTS,
    NO_CHECKPOINTS,
    EventFilter,
    parse_event_filter,
    recent_events,
)
from gpuctl.ops.dashboard._gpu_history import GPU_POINTS, GpuHistory
from gpuctl.ops.dashboard._history import (
    DEFAULT_WINDOW,
    HISTORY_WINDOWS,
    DashHistory,
    HistoryView,
    next_history_window,
    parse_history_window,
)
from gpuctl.ops.dashboard._owners import (
    NOT_GPUCTL,
    ProcessLister,
    ProcessOwners,
    RemoteProcesses,
    owners_of,
    read_owners,
)
from gpuctl.ops.dashboard._sources import (
    LOG_TAIL_BYTES,
    LiveSource,
    LogReader,
    Poller,
    RemoteLogs,
    SavedSource,
    Services,
    SnapshotSource,
)
from gpuctl.ops.dashboard._view import (
    Alert,
    DashData,
    HealthKeeper,
    JobLine,
    NodeView,
    alerts,
    collect,
    waiting_reasons,
)

__all__ = [
    "ALL_EVENTS",
    "DEFAULT_WINDOW",
    "GPU_POINTS",
    "HISTORY_WINDOWS",
    "LOG_TAIL_BYTES",
    "NOT_GPUCTL",
    "NO_CHECKPOINTS",
    "Alert",
    "DashData",
    "DashHistory",
    "EventFilter",
    "GpuHistory",
    "HealthKeeper",
    "HistoryView",
    "JobLine",
    "LiveSource",
    "LogReader",
    "NodeView",
    "Poller",
    "ProcessLister",
    "ProcessOwners",
    "RemoteLogs",
    "RemoteProcesses",
    "SavedSource",
    "Services",
    "SnapshotSource",
    "alerts",
    "collect",
    "next_history_window",
    "owners_of",
    "parse_event_filter",
    "parse_history_window",
    "read_owners",
    "recent_events",
    "waiting_reasons",
]
