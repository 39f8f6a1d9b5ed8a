"""Slices (pure): each node's observed per-process GPU memory against the slice of the incarnation
that runs it; a process gpuctl cannot attribute to one of its incarnations is a ghost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from gpuctl.core.jobs.model import Incarnation
from gpuctl.core.model import GpuProcess


@dataclasses.dataclass(frozen=True, slots=True)
class SliceUse:
    """One incarnation's observed memory on one card, against its slice there."""

    job_id: str
    incarnation: int
    node: str
    gpu_uuid: str
    used_mib: int
    slice_mib: int  # 0 on a card it was not granted

    @property
    def over_mib(self) -> int:
        return max(0, self.used_mib - self.slice_mib)


@dataclasses.dataclass(frozen=True, slots=True)
class GhostUse:
    """A GPU process gpuctl did not launch (or cannot attribute to one of its incarnations)."""

    node: str
    pid: int
    gpu_uuid: str | None
    used_mib: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class SliceReport:
    uses: tuple[SliceUse, ...]
    ghosts: tuple[GhostUse, ...]

    @property
    def over(self) -> tuple[SliceUse, ...]:
        return tuple(u for u in self.uses if u.over_mib > 0)


def slice_verdicts(
    incarnations: Sequence[Incarnation],
    processes: Mapping[str, Sequence[GpuProcess]],
) -> SliceReport:
    """Match each node's GPU processes to the incarnations running there (by process id: the
    incarnation's process group leader) and sum their memory per card.

    The slice is the incarnation's `mib_per_card` (a whole card: its capacity). A process on a
    card its incarnation was not granted counts against a slice of 0 there.
    Processes that match no incarnation are ghosts.
    """
    owner: dict[tuple[str, int], Incarnation] = {}
    for inc in incarnations:
        if inc.pid is not None:
            owner[(inc.node, inc.pid)] = inc
    used: dict[tuple[str, int, str], int] = {}
    ghosts: list[GhostUse] = []
    for node in sorted(processes):
        for p in processes[node]:
            mine = owner.get((node, p.pid))
            if mine is None:
                ghosts.append(GhostUse(node, p.pid, p.gpu_uuid, p.used_mib))
                continue
            uuid = p.gpu_uuid
            if uuid is None and len(mine.gpu_uuids) == 1:
                uuid = mine.gpu_uuids[0]
            if uuid is None or p.used_mib is None:
                continue
            key = (mine.job_id, mine.n, uuid)
            used[key] = used.get(key, 0) + p.used_mib
    by_id = {(i.job_id, i.n): i for i in incarnations}
    uses = []
    for (job_id, n, uuid), mib in sorted(used.items()):
        owned = by_id[(job_id, n)]
        slice_mib = owned.mib_per_card if uuid in owned.gpu_uuids else 0
        uses.append(SliceUse(job_id, n, owned.node, uuid, mib, slice_mib))
    return SliceReport(tuple(uses), tuple(ghosts))
