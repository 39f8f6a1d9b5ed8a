"""Restarts after a job's own failures (pure: times are arguments): a budget of failures within a
window, and a thrash guard (a job that exits non-zero within a few seconds of each of its last
starts is held, and its node is not blamed).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence

from gpuctl.core.jobs.model import EndReason, Incarnation
from gpuctl.core.timefmt import duration

DEFAULT_RESTART_BUDGET = 3
DEFAULT_RESTART_WINDOW_S = 3600.0
DEFAULT_THRASH_WINDOW_S = 60.0
DEFAULT_THRASH_STARTS = 3


@dataclasses.dataclass(frozen=True, slots=True)
class RestartPolicy:
    budget: int = DEFAULT_RESTART_BUDGET  # restarts after failures of the job itself...
    window_s: float = DEFAULT_RESTART_WINDOW_S  # ... within this window
    thrash_window_s: float = DEFAULT_THRASH_WINDOW_S  # a failure this soon after a start is quick
    thrash_starts: int = DEFAULT_THRASH_STARTS  # held when the last this many starts failed quickly

    def __post_init__(self) -> None:
        if self.budget < 0 or self.window_s <= 0 or self.thrash_window_s < 0:
            raise ValueError("a restart policy is never negative")
        if self.thrash_starts < 1:
            raise ValueError("thrash_starts must be 1 or more")


@dataclasses.dataclass(frozen=True, slots=True)
class RunEnd:
    """How one incarnation ended."""

    started_at: float
    ended_at: float
    reason: EndReason
    exit_code: int | None = None

    @property
    def own_failure(self) -> bool:
        """The job itself failed (not its node, not gpuctl): a crash or a launch that failed."""
        if self.reason is EndReason.LAUNCH_FAILED:
            return True
        return self.reason is EndReason.EXITED and self.exit_code != 0


class RestartVerdict(enum.StrEnum):
    RESTART = "restart"
    HOLD = "hold"


@dataclasses.dataclass(frozen=True, slots=True)
class RestartDecision:
    verdict: RestartVerdict
    reason: str
    failures_in_window: int
    thrashing: bool = False
    blame_node: bool = False  # a crash loop is the job's fault, not its node's


def restart_decision(runs: Sequence[RunEnd], now: float, policy: RestartPolicy) -> RestartDecision:
    """After the last of `runs` (oldest first) failed: restart, or hold with a reason."""
    failures = sum(1 for r in runs if r.own_failure and r.ended_at >= now - policy.window_s)
    recent = runs[-policy.thrash_starts :]
    thrashing = len(recent) == policy.thrash_starts and all(
        r.own_failure and r.ended_at - r.started_at <= policy.thrash_window_s for r in recent
    )
    if thrashing:
        return RestartDecision(
            RestartVerdict.HOLD,
            f"crash loop: exited non-zero within {policy.thrash_window_s:g}s of each of its last "
            f"{policy.thrash_starts} starts (the node is not blamed)",
            failures,
            thrashing=True,
        )
    if failures > policy.budget:
        return RestartDecision(
            RestartVerdict.HOLD,
            f"restart budget spent: {failures} failures within {duration(policy.window_s)} "
            f"(budget {policy.budget})",
            failures,
        )
    return RestartDecision(
        RestartVerdict.RESTART, f"restart {failures} of {policy.budget} within the window", failures
    )


def run_ends(incarnations: Iterable[Incarnation]) -> list[RunEnd]:
    """The ended incarnations of one job as `RunEnd`s, oldest first."""
    out = []
    for inc in sorted(incarnations, key=lambda i: i.n):
        if inc.end_reason is None or inc.ended_at is None:
            continue
        out.append(RunEnd(inc.started_at, inc.ended_at, inc.end_reason, inc.exit_code))
    return out
