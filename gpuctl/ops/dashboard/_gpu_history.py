"""Each GPU's recent use, for the node screen's sparklines: SM utilization and memory in use (% of
the card) at each of the last `GPU_POINTS` polls, kept in memory by the dashboard.

The store's history (`gpuctl reconcile --watch` records it) is per node, not per GPU, so a GPU's
own line starts when the dashboard does. A node's polls are kept as two small byte strings (one
byte per GPU, whole %: 255 unknown), which keeps 1,000 nodes × 8 GPUs × 60 polls near 5 MB.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence

from gpuctl.core.model import GpuSnapshot, NodeSnapshot

GPU_POINTS = 60
_UNKNOWN = 255
_GAP: tuple[tuple[int, ...], bytes, bytes] = ((), b"", b"")


def _utils(gpus: Sequence[GpuSnapshot]) -> list[int | None]:
    return [g.util_pct for g in gpus]


def _mem(gpus: Sequence[GpuSnapshot]) -> bytes:
    return _bytes(
        [
            (g.mem_used_mib * 100 + g.mem_total_mib // 2) // g.mem_total_mib
            if g.mem_total_mib and g.mem_used_mib is not None
            else None
            for g in gpus
        ]
    )


def _bytes(values: list[int | None]) -> bytes:
    """Whole % as bytes; unknown (None, or outside 0..100) as 255."""
    try:
        return bytes(values)  # type: ignore[arg-type]  # the common case: every value known
    except (TypeError, ValueError):
        return bytes([v if v is not None and 0 <= v <= 100 else _UNKNOWN for v in values])


class GpuHistory:
    """Per node, per poll: (GPU indexes, utilization bytes, memory bytes). Recorded from the
    poll's worker thread, read by the node screen on the UI thread (under a lock)."""

    def __init__(self, points: int = GPU_POINTS) -> None:
        self.points = points
        self._nodes: dict[str, deque[tuple[tuple[int, ...], bytes, bytes]]] = {}
        self._lock = threading.Lock()

    def record(self, nodes: Iterable[NodeSnapshot]) -> None:
        """One poll; a node that did not answer gets a gap. (Plain comprehensions: this runs
        over every GPU of the fleet at every poll.)"""
        nodes_kept = self._nodes
        points = self.points
        with self._lock:
            for n in nodes:
                kept = nodes_kept.get(n.name)
                if kept is None:
                    kept = nodes_kept[n.name] = deque(maxlen=points)
                obs = n.observation
                gpus = obs.gpus if obs is not None else ()
                if not gpus:
                    kept.append(_GAP)
                    continue
                kept.append((tuple([g.index for g in gpus]), _bytes(_utils(gpus)), _mem(gpus)))

    def series(self, node: str) -> dict[int, tuple[Sequence[float | None], Sequence[float | None]]]:
        """Each GPU of `node`: its utilization % and memory in use % at each poll kept, oldest
        first (None: not read at that poll)."""
        with self._lock:
            polls = list(self._nodes.get(node, ()))
        indexes = sorted({i for idx, _, _ in polls for i in idx})
        out: dict[int, tuple[list[float | None], list[float | None]]] = {
            i: ([], []) for i in indexes
        }
        for idx, util, mem in polls:
            at = {i: k for k, i in enumerate(idx)}
            for i, (utils, mems) in out.items():
                k = at.get(i)
                utils.append(None if k is None or util[k] == _UNKNOWN else float(util[k]))
                mems.append(None if k is None or mem[k] == _UNKNOWN else float(mem[k]))
        return {i: (u, m) for i, (u, m) in out.items()}
