"""A running job that stopped making progress: its newest committed checkpoint is much older than
the interval it has been committing at. Pure: times are arguments.

The job spec says nothing about checkpoint cadence, so the expected interval is observed: the
median of the job's latest gaps between two commits of one incarnation (commits as gpuctl recorded
them: the loop records a commit at the pass after it, so the gaps are the job's own cadence, or
the pass interval when the loop runs slower than the job commits). A job is stalled when its
current incarnation has committed nothing for `max(factor x interval, min_s)`, counted from its
newest commit, or from its start when it has committed nothing yet. A job that never committed
two checkpoints in one incarnation has no known cadence and is never judged. The factor is 2 and
the floor 60 s, the minute or so an operator expects (a job SIGSTOPped for 70 s is reported). The
factor came down from 3 when the loop read checkpoints only every 30 s, which made a job
committing every few seconds show 30 s gaps; the loop now records each commit within a pass, so a
healthy job's recorded age stays within a pass and a commit period, far inside the floor, and the
rule needs no further slack (runs launched by an older gpuctl are still read every 30 s: their
gaps of 30 s give the same 60 s).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Sequence

from gpuctl.core.jobs.model import Checkpoint, Incarnation
from gpuctl.core.timefmt import duration

DEFAULT_STALL_FACTOR = 2.0
DEFAULT_STALL_MIN_S = 60.0
DEFAULT_STALL_GAPS = 5
STALLED = "stalled: "  # how the job's reason begins while it is stalled


@dataclasses.dataclass(frozen=True, slots=True)
class StallPolicy:
    enabled: bool = True
    factor: float = DEFAULT_STALL_FACTOR  # stalled past this many expected intervals ...
    min_s: float = DEFAULT_STALL_MIN_S  # ... and never sooner than this
    gaps: int = DEFAULT_STALL_GAPS  # the expected interval: the median of this many latest gaps

    def __post_init__(self) -> None:
        if self.factor < 1 or self.min_s < 0 or self.gaps < 1:
            raise ValueError("factor is 1 or more, min_s never negative, gaps 1 or more")


@dataclasses.dataclass(frozen=True, slots=True)
class Stall:
    incarnation: int
    since: float  # the newest commit of the incarnation (its start when none)
    age_s: float
    interval_s: float
    threshold_s: float
    step: int | None  # the newest step it committed; None: nothing yet

    @property
    def reason(self) -> str:
        """What the job's reason says while it is stalled (the same pass after pass)."""
        what = "no checkpoint committed" if self.step is None else f"nothing after step {self.step}"
        return (
            f"{STALLED}{what} for over {duration(self.threshold_s)} (it committed every "
            f"{duration(self.interval_s)})"
        )


def expected_interval(checkpoints: Sequence[Checkpoint], gaps: int) -> float | None:
    """The median of the latest `gaps` gaps between consecutive commits of one incarnation."""
    times: dict[int, set[float]] = {}
    seen: set[tuple[int, int]] = set()
    for c in checkpoints:  # a pulled copy and its original are one commit
        if (c.incarnation, c.step) not in seen:
            seen.add((c.incarnation, c.step))
            times.setdefault(c.incarnation, set()).add(c.committed_at)
    found: list[tuple[float, float]] = []  # (when, gap)
    for stamps in times.values():
        ordered = sorted(stamps)
        found += [(b, b - a) for a, b in itertools.pairwise(ordered)]
    if not found:
        return None
    latest = sorted(found)[-gaps:]
    return float(statistics.median(gap for _, gap in latest))


def judge(
    inc: Incarnation, checkpoints: Sequence[Checkpoint], *, now: float, policy: StallPolicy
) -> Stall | None:
    """`inc` (running) is stalled at `now`, or None. `checkpoints`: every checkpoint of its job."""
    interval = expected_interval(checkpoints, policy.gaps)
    if interval is None:
        return None
    mine = [c for c in checkpoints if c.incarnation == inc.n]
    newest = max(mine, key=lambda c: (c.committed_at, c.step), default=None)
    since = inc.started_at if newest is None else max(newest.committed_at, inc.started_at)
    threshold = max(policy.factor * interval, policy.min_s)
    age = now - since
    if age <= threshold:
        return None
    step = None if newest is None else newest.step
    return Stall(inc.n, since, age, interval, threshold, step)
