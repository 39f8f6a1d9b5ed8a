"""A node's liveness, pass after pass (pure: times are arguments).

- a node is `down` only after a grace period without answers, never at the first failed poll
  (sshd unreachable does not mean its jobs are dead);
- mass failure: when more than a share of the fleet looks down at once, gpuctl suspects its own
  network and does not requeue anything.
"""

from __future__ import annotations

import dataclasses
import enum

from gpuctl.core.jobs.model import NodeLiveness

DEFAULT_GRACE_S = 30.0
DEFAULT_MASS_FAILURE_FRACTION = 0.5


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
