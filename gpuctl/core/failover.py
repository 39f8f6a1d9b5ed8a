"""The control loop's decisions, as functions of values (pure: no clock, no I/O).

- liveness: a node is `down` only after a grace period without answers, never at the first
  failed poll (sshd unreachable does not mean its jobs are dead);
- mass failure: when more than a share of the fleet looks down at once, gpuctl suspects its own
  network and does not requeue anything;
- restarts: a budget of failures within a window, and a thrash guard (a job that exits non-zero
  within a few seconds of each of its last starts is held, and its node is not blamed);
- spot preemption: which spot incarnations to stop so that a job fits (fewest moves, then the
  most recently checkpointed);
- slices: observed per-process GPU memory against each incarnation's slice; the rest is ghost;
- queue order: priority (highest first), then submit time, then id.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence

from gpuctl.core.jobs import EndReason, Incarnation, Job, NodeLiveness
from gpuctl.core.model import GpuProcess
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.model import (
    Allocation,
    Card,
    FleetState,
    JobRequest,
    PlacementNode,
    Settings,
)

DEFAULT_GRACE_S = 30.0
DEFAULT_MASS_FAILURE_FRACTION = 0.5
DEFAULT_RESTART_BUDGET = 3
DEFAULT_RESTART_WINDOW_S = 3600.0
DEFAULT_THRASH_WINDOW_S = 60.0
DEFAULT_THRASH_STARTS = 3


# --- liveness ------------------------------------------------------------------------------


class LivenessChange(enum.StrEnum):
    NONE = "none"  # as before (answering, or still failing within the grace, or still down)
    FAILING = "failing"  # the first failed poll: the grace starts
    RECOVERED = "recovered"  # answered again within the grace
    DOWN = "down"  # the grace passed without an answer
    BACK = "back"  # answered again after being down: its stale incarnations must be fenced


@dataclasses.dataclass(frozen=True, slots=True)
class LivenessUpdate:
    liveness: NodeLiveness
    change: LivenessChange


def update_liveness(
    prev: NodeLiveness | None, node: str, *, answered: bool, now: float, grace_s: float
) -> LivenessUpdate:
    """The node's liveness after one poll at `now`.

    A node becomes `down` when it has not answered for `grace_s` seconds, counted from its first
    failed poll, and never at that first failed poll itself (even with a grace of 0).
    """
    was_down = prev is not None and prev.down
    if answered:
        change = LivenessChange.NONE
        if was_down:
            change = LivenessChange.BACK
        elif prev is not None and prev.failing_since is not None:
            change = LivenessChange.RECOVERED
        return LivenessUpdate(NodeLiveness(node, last_ok_at=now, failing_since=None), change)
    last_ok = prev.last_ok_at if prev is not None else None
    since = prev.failing_since if prev is not None else None
    if since is None:
        since = now
        live = NodeLiveness(node, last_ok, since, down=was_down)
        return LivenessUpdate(live, LivenessChange.NONE if was_down else LivenessChange.FAILING)
    down = was_down or (now > since and now - since >= grace_s)
    change = LivenessChange.DOWN if down and not was_down else LivenessChange.NONE
    return LivenessUpdate(NodeLiveness(node, last_ok, since, down=down), change)


def suspect_own_network(
    failing: int, total: int, fraction: float = DEFAULT_MASS_FAILURE_FRACTION
) -> bool:
    """More than `fraction` of the nodes look down at once: suspect gpuctl's own network."""
    return total > 0 and failing > fraction * total


# --- restarts ------------------------------------------------------------------------------


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


class Verdict(enum.StrEnum):
    RESTART = "restart"
    HOLD = "hold"


@dataclasses.dataclass(frozen=True, slots=True)
class RestartDecision:
    verdict: Verdict
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
            Verdict.HOLD,
            f"crash loop: exited non-zero within {policy.thrash_window_s:g}s of each of its last "
            f"{policy.thrash_starts} starts (the node is not blamed)",
            failures,
            thrashing=True,
        )
    if failures > policy.budget:
        return RestartDecision(
            Verdict.HOLD,
            f"restart budget spent: {failures} failures within {_duration(policy.window_s)} "
            f"(budget {policy.budget})",
            failures,
        )
    return RestartDecision(
        Verdict.RESTART, f"restart {failures} of {policy.budget} within the window", failures
    )


def run_ends(incarnations: Iterable[Incarnation]) -> list[RunEnd]:
    """The ended incarnations of one job as `RunEnd`s, oldest first."""
    out = []
    for inc in sorted(incarnations, key=lambda i: i.n):
        if inc.end_reason is None or inc.ended_at is None:
            continue
        out.append(RunEnd(inc.started_at, inc.ended_at, inc.end_reason, inc.exit_code))
    return out


# --- queue order ---------------------------------------------------------------------------


def queue_key(job: Job) -> tuple[int, float, str]:
    return (-job.priority, job.submitted_at, job.id)


def queue_order(jobs: Iterable[Job]) -> list[Job]:
    """Priority (highest first), then submit time (oldest first), then id."""
    return sorted(jobs, key=queue_key)


# --- spot preemption -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SpotVictim:
    """A running spot incarnation that could be stopped to make room."""

    job_id: str
    allocation: Allocation  # its `job` is the job id, as in the fleet state
    checkpoint_at: float | None  # when its newest committed checkpoint was written; None: never


def victim_key(v: SpotVictim) -> tuple[bool, float, str]:
    """Most recently checkpointed first (least work lost), never-checkpointed last, then id."""
    return (v.checkpoint_at is None, -(v.checkpoint_at or 0.0), v.job_id)


def without(state: FleetState, job_ids: Iterable[str]) -> FleetState:
    """`state` with the allocations of `job_ids` released."""
    gone = set(job_ids)
    caps = {(n.name, c.index): c.capacity_mib for n in state.nodes for c in n.cards}
    released: dict[tuple[str, int], int] = {}
    for a in state.allocations:
        if a.job in gone:
            for card in a.cards:
                key = (a.node, card)
                take = caps.get(key, 0) if a.whole else a.mib_per_card
                released[key] = released.get(key, 0) + take
    if not any(a.job in gone for a in state.allocations):
        return state
    nodes = []
    for n in state.nodes:
        cards = tuple(
            c._replace(allocated_mib=max(0, c.allocated_mib - released.get((n.name, c.index), 0)))
            for c in n.cards
        )
        nodes.append(_node_without(n, cards, state.allocations, gone))
    allocations = tuple(a for a in state.allocations if a.job not in gone)
    return FleetState(nodes=tuple(nodes), allocations=allocations, version=state.version)


def _node_without(
    n: PlacementNode, cards: tuple[Card, ...], allocs: Sequence[Allocation], gone: set[str]
) -> PlacementNode:
    cpu = sum(a.cpu_milli for a in allocs if a.node == n.name and a.job in gone)
    mem = sum(a.host_mem_mib for a in allocs if a.node == n.name and a.job in gone)
    return dataclasses.replace(
        n,
        cards=cards,
        cpu_allocated_milli=max(0, n.cpu_allocated_milli - cpu),
        host_mem_allocated_mib=max(0, n.host_mem_allocated_mib - mem),
    )


def fits(state: FleetState, job: JobRequest, settings: Settings) -> bool:
    return plan(state, [job], settings).all_placed


def choose_preemption(
    state: FleetState,
    job: JobRequest,
    victims: Sequence[SpotVictim],
    settings: Settings,
) -> tuple[SpotVictim, ...] | None:
    """The spot incarnations to stop so that `job` fits, or None when stopping them all would
    not make room (or it already fits: then the answer is the empty tuple).

    Fewest moves first: a single victim (in preference order: most recently checkpointed first);
    then, per node, the shortest prefix of its victims in preference order (the node needing the
    fewest wins; ties: the better-checkpointed set, then node name); then a fleet-wide prefix
    (for a job the band, not a node, stops).
    """
    if fits(state, job, settings):
        return ()
    ordered = sorted(victims, key=victim_key)
    for v in ordered:
        if fits(without(state, [v.job_id]), job, settings):
            return (v,)
    best: tuple[tuple[int, tuple[bool, float, str], str], tuple[SpotVictim, ...]] | None = None
    by_node: dict[str, list[SpotVictim]] = {}
    for v in ordered:
        by_node.setdefault(v.allocation.node, []).append(v)
    for node in sorted(by_node):
        mine = by_node[node]
        for k in range(2, len(mine) + 1):
            chosen = tuple(mine[:k])
            if fits(without(state, [v.job_id for v in chosen]), job, settings):
                key = (k, victim_key(chosen[-1]), node)
                if best is None or key < best[0]:
                    best = (key, chosen)
                break
    if best is not None:
        return best[1]
    for k in range(2, len(ordered) + 1):
        chosen = tuple(ordered[:k])
        if fits(without(state, [v.job_id for v in chosen]), job, settings):
            return chosen
    return None


# --- slices --------------------------------------------------------------------------------


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


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}min"
    return f"{seconds:g}s"
