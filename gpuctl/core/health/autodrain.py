"""What the control loop does about node health, pass after pass: cordon, drain, lift its own
cordons. Pure: no I/O, no clock (times are arguments).

- **Cordon at first sight.** A node whose verdict asks for `cordon` or `drain` is cordoned (source
  `health`) at the pass that sees it: no new work lands there; running jobs are untouched.
- **Unknown health cordons only.** A node whose GPUs cannot be read is cordoned, never drained,
  whatever the rules say: its jobs may be perfectly fine.
- **Hysteresis.** A node is drained (its jobs moved off) only once its verdict has asked for a
  drain at `drain_after_passes` consecutive passes.
- **Rate limit.** At most `max_drains_per_hour` nodes start draining within an hour, and none
  while more than `mass_fraction` of the fleet looks unhealthy at once (a driver rollout or a
  probe bug, not a dozen failing GPUs): `suspect`. Only drains that move jobs count: draining a
  node that holds none moves nothing (it is a cordon), so it neither waits for nor spends the
  hour's budget.
- **Cool-down.** gpuctl lifts a cordon only when its source is `health` (never a person's) and
  the node has had no reason to be cordoned for `cool_down_s`.
- **Flapping.** A node that stopped answering and came back `flap_outages` times within
  `flap_window_s` (its sshd keeps dropping) is cordoned (source `health`), never drained: its
  running jobs are fine. The cool-down lifts that cordon once it has answered every poll for
  `cool_down_s` and no longer counts as flapping.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from gpuctl.core.health.model import Action, NodeVerdict, Severity
from gpuctl.core.jobs.model import Cordon
from gpuctl.core.timefmt import duration

HEALTH_SOURCE = "health"
DEFAULT_DRAIN_AFTER_PASSES = 2
DEFAULT_MAX_DRAINS_PER_HOUR = 2
DEFAULT_COOL_DOWN_S = 600.0
DEFAULT_MASS_FRACTION = 0.5
DEFAULT_FLAP_OUTAGES = 3
DEFAULT_FLAP_WINDOW_S = 600.0


@dataclasses.dataclass(frozen=True, slots=True)
class AutoDrainPolicy:
    enabled: bool = True
    drain_after_passes: int = DEFAULT_DRAIN_AFTER_PASSES
    max_drains_per_hour: int = DEFAULT_MAX_DRAINS_PER_HOUR
    cool_down_s: float = DEFAULT_COOL_DOWN_S
    mass_fraction: float = DEFAULT_MASS_FRACTION
    migration_timeout_s: float = 600.0  # per job: reserve -> stop requested, else rolled back
    flap_outages: int = DEFAULT_FLAP_OUTAGES  # outages (failed, then answered again) ...
    flap_window_s: float = DEFAULT_FLAP_WINDOW_S  # ... within this window: cordoned (0: never)

    def __post_init__(self) -> None:
        if self.flap_outages < 0 or self.flap_window_s <= 0:
            raise ValueError("flap_outages is 0 (never) or more; flap_window_s is positive")
        if self.drain_after_passes < 1 or self.max_drains_per_hour < 0:
            raise ValueError("drain_after_passes is 1 or more; max_drains_per_hour 0 or more")
        if self.cool_down_s < 0 or self.migration_timeout_s <= 0:
            raise ValueError("cool_down_s is never negative; migration_timeout_s is positive")
        if not 0 < self.mass_fraction <= 1:
            raise ValueError("mass_fraction must be in (0, 1]")


@dataclasses.dataclass(frozen=True, slots=True)
class NodeHealth:
    """One node's health as the loop tracks it across passes (kept in the store)."""

    node: str
    action: Action  # what the last pass's verdict asked for (unknown health: at most cordon)
    streak: int  # consecutive passes that asked for `action` (counted up to a cap)
    since: float  # when that streak began
    healthy_since: float | None  # since when no reason to be cordoned; None: not now
    reason: str = ""  # the strongest reason when the streak began
    drain_started_at: float | None = None  # gpuctl began draining it (this unhealthy spell)
    updated_at: float = 0.0

    @property
    def healthy(self) -> bool:
        return self.healthy_since is not None


def effective_action(verdict: NodeVerdict, reachable: bool) -> Action:
    """The verdict's action as the loop applies it: a node that did not answer is left to the
    liveness rules (none); unknown health cordons at most."""
    if not reachable:
        return Action.NONE
    if verdict.severity is Severity.UNKNOWN and verdict.action.rank > Action.CORDON.rank:
        return Action.CORDON
    return verdict.action


def track(
    prev: NodeHealth | None, verdict: NodeVerdict, *, reachable: bool, now: float, cap: int
) -> NodeHealth:
    """The node's health after one more pass. The streak stops counting at `cap` (so a node
    that stays unhealthy is not rewritten every pass)."""
    action = effective_action(verdict, reachable)
    healthy = (
        reachable
        and action.rank < Action.CORDON.rank
        and verdict.severity is not (Severity.UNKNOWN)
    )
    reason = verdict.reasons[0].text if verdict.reasons else ""
    if prev is not None and prev.action is action:
        streak, since, reason = min(cap, prev.streak + 1), prev.since, prev.reason or reason
    else:
        streak, since = 1, now
    healthy_since = None
    if healthy:
        healthy_since = prev.healthy_since if prev is not None and prev.healthy else now
    drain_started = None
    if not healthy and prev is not None:
        drain_started = prev.drain_started_at
    return NodeHealth(
        node=verdict.name,
        action=action,
        streak=streak,
        since=since,
        healthy_since=healthy_since,
        reason=reason if action.rank >= Action.ALERT.rank else "",
        drain_started_at=drain_started,
        updated_at=now,
    )


def flapping(outages: Mapping[str, int], policy: AutoDrainPolicy) -> dict[str, str]:
    """Nodes to cordon for flapping, with the reason. `outages`: per node, how many times it
    stopped answering and answered again within the last `policy.flap_window_s`."""
    if policy.flap_outages == 0:
        return {}
    window = duration(policy.flap_window_s)
    return {
        node: f"flapping: stopped answering and came back {n} times within {window} "
        f"(limit {policy.flap_outages})"
        for node, n in sorted(outages.items())
        if n >= policy.flap_outages
    }


def changed(before: NodeHealth | None, after: NodeHealth) -> bool:
    """Worth writing: anything but the time of the pass."""
    if before is None:
        return True
    return dataclasses.replace(before, updated_at=0.0) != dataclasses.replace(after, updated_at=0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class NodeStep:
    node: str
    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class HealthPlan:
    """What one pass does: cordon (source health), drain (start or go on moving jobs off),
    uncordon (gpuctl's own cordon, cooled down), and drains held back with the reason."""

    cordon: tuple[NodeStep, ...] = ()
    drain: tuple[NodeStep, ...] = ()
    start_drain: tuple[str, ...] = ()  # those of `drain` that begin now
    free_drain: tuple[str, ...] = ()  # those of `start_drain` that hold no job: not counted
    uncordon: tuple[NodeStep, ...] = ()
    held: tuple[NodeStep, ...] = ()
    quarantine: tuple[NodeStep, ...] = ()  # flapping nodes cordoned (their jobs stay)
    suspect: bool = False
    unhealthy: int = 0
    total: int = 0


def decide(
    health: Mapping[str, NodeHealth],
    cordons: Mapping[str, Cordon],
    *,
    drains_last_hour: int,
    policy: AutoDrainPolicy,
    now: float,
    nodes: Sequence[str] | None = None,
    loaded: Collection[str] | None = None,
    flaps: Mapping[str, str] | None = None,
) -> HealthPlan:
    """The pass's health steps, nodes by name. `drains_last_hour`: how many nodes gpuctl began
    draining for health in the last hour that had jobs to move; `nodes`: the fleet (default: the
    nodes in `health`); `loaded`: the nodes holding jobs a drain would move (default: all; a
    drain of any other node starts without the rate limit and does not count against it);
    `flaps`: the nodes `flapping` found, with the reason: cordoned, and their cordon kept."""
    names = sorted(nodes if nodes is not None else health)
    unhealthy = [n for n in names if n in health and health[n].action.rank >= Action.CORDON.rank]
    suspect = len(names) > 1 and len(unhealthy) > policy.mass_fraction * len(names)
    cordon: list[NodeStep] = []
    drain: list[NodeStep] = []
    start: list[str] = []
    free: list[str] = []
    uncordon: list[NodeStep] = []
    held: list[NodeStep] = []
    quarantine: list[NodeStep] = []
    flaps = flaps or {}
    budget = policy.max_drains_per_hour - drains_last_hour
    for name in names:
        h = health.get(name)
        if h is None:
            continue
        cordoned = cordons.get(name)
        if h.action.rank >= Action.CORDON.rank and cordoned is None:
            cordon.append(NodeStep(name, h.reason or f"health: {h.action.value}"))
        elif name in flaps and cordoned is None:
            quarantine.append(NodeStep(name, flaps[name]))
        if h.action is Action.DRAIN:
            why = h.reason or "health: drain"
            if h.drain_started_at is not None:
                drain.append(NodeStep(name, why))
            elif h.streak < policy.drain_after_passes:
                held.append(
                    NodeStep(
                        name,
                        f"drain asked at {h.streak} of {policy.drain_after_passes} consecutive "
                        "passes (hysteresis)",
                    )
                )
            elif suspect:
                held.append(
                    NodeStep(
                        name,
                        f"{len(unhealthy)} of {len(names)} nodes look unhealthy at once: no "
                        "drain until most look healthy again",
                    )
                )
            elif loaded is not None and name not in loaded:
                drain.append(NodeStep(name, why))
                start.append(name)
                free.append(name)
            elif budget <= 0:
                held.append(
                    NodeStep(
                        name,
                        f"rate limit: at most {policy.max_drains_per_hour} node(s) drained "
                        "per hour",
                    )
                )
            else:
                budget -= 1
                drain.append(NodeStep(name, why))
                start.append(name)
        if (
            cordoned is not None
            and cordoned.source == HEALTH_SOURCE
            and h.healthy_since is not None
            and now - h.healthy_since >= policy.cool_down_s
            and name not in flaps
        ):
            uncordon.append(
                NodeStep(name, f"healthy for {duration(now - h.healthy_since)} (cool-down)")
            )
    return HealthPlan(
        cordon=tuple(cordon),
        drain=tuple(drain),
        start_drain=tuple(start),
        free_drain=tuple(free),
        uncordon=tuple(uncordon),
        held=tuple(held),
        quarantine=tuple(quarantine),
        suspect=suspect,
        unhealthy=len(unhealthy),
        total=len(names),
    )
