"""A node's state in the design's vocabulary, from what it answered and what the state store
holds: one function for `gpuctl status`, `nodes list|show`, their `-o json`, the dashboard, the
report, metrics and playbook selectors.

- `down`: it did not answer this poll (the reason names how: refused, timeout, ...);
- `draining`: cordoned, and its jobs are being moved off (a drain is its newest cordon or drain
  event and it still holds jobs, or one of its jobs is moving now);
- `cordoned`: no new work lands there (by a person or by health);
- `unknown`: it answered, but its GPUs could not be read;
- `ready`: none of these.

A cordon outranks `unknown`: the control loop cordons a node whose health it cannot read, and
the cordon carries the reason, who and when (the node's health verdict says `unknown` beside
it). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

from gpuctl.core.jobs.model import Cordon, Event
from gpuctl.core.model import NodeSnapshot, NodeState, Reach

NODE_STATES = tuple(s.value for s in NodeState)  # ready, cordoned, draining, down, unknown
CORDON_EVENT_KINDS = ("cordon", "uncordon", "drain")  # the events that start or end a cordon


@dataclasses.dataclass(frozen=True, slots=True)
class NodeStatus:
    """A node's state with why, by whom (an operator, or `source` health) and since when (the
    cordon's time; None for states the poll alone tells)."""

    state: NodeState
    reason: str | None = None
    by: str | None = None
    source: str | None = None  # "operator" or "health" (a cordon); None otherwise
    since: float | None = None
    cordon: Cordon | None = None  # the store's cordon, also under a node that is down

    @property
    def cordoned(self) -> bool:
        """No new work lands there by a cordon (cordoned or draining)."""
        return self.state in (NodeState.CORDONED, NodeState.DRAINING)

    def to_dict(self) -> dict[str, object]:
        """The JSON fields beside a node's `state` (`gpuctl status`/`nodes` `-o json`)."""
        return {
            "state": self.state.value,
            "state_reason": self.reason,
            "state_by": self.by,
            "state_source": self.source,
            "state_since": self.since,
        }


def node_status(
    node: NodeSnapshot | None, cordon: Cordon | None = None, draining: bool = False
) -> NodeStatus:
    """The state of one node: its answer (`None`: not polled, as down), the store's `cordon` on
    it, and whether its jobs are being moved off (`draining_nodes`)."""
    if node is None or node.reach is not Reach.OK:
        reason = "not polled" if node is None else node.error or f"no answer ({node.reach.value})"
        return NodeStatus(NodeState.DOWN, reason, cordon=cordon)
    if cordon is not None:
        state = NodeState.DRAINING if draining else NodeState.CORDONED
        return NodeStatus(state, cordon.reason, cordon.operator, cordon.source, cordon.at, cordon)
    if node.state is NodeState.UNKNOWN:
        return NodeStatus(NodeState.UNKNOWN, _unreadable(node))
    if node.state is not NodeState.READY:  # as a saved snapshot says (`status -o json` of then)
        return NodeStatus(node.state, node.error)
    return NodeStatus(NodeState.READY)


def _unreadable(node: NodeSnapshot) -> str:
    notes = node.observation.notes if node.observation is not None else ()
    return node.error or (notes[0] if notes else "the GPU query failed")


def draining_nodes(
    cordons: Iterable[str],
    node_events: Iterable[Event],
    holding: Mapping[str, Collection[str]],
    moving: Collection[str] = (),
) -> frozenset[str]:
    """The cordoned nodes whose jobs are being moved off: the newest of their cordon, uncordon
    and drain events (`node_events`, newest first) is a drain and they still hold jobs
    (`holding`: node -> ids of the jobs holding cards there), or a job they hold is moving now
    (`moving`: ids of jobs with a reservation elsewhere)."""
    newest: dict[str, str] = {}
    for e in node_events:
        if e.node is not None and e.node not in newest and e.kind in CORDON_EVENT_KINDS:
            newest[e.node] = e.kind
    out = set()
    for n in cordons:
        held = holding.get(n, ())
        if (newest.get(n) == "drain" and held) or any(j in moving for j in held):
            out.add(n)
    return frozenset(out)


def node_statuses(
    nodes: Iterable[NodeSnapshot],
    cordons: Mapping[str, Cordon],
    node_events: Iterable[Event] = (),
    holding: Mapping[str, Collection[str]] | None = None,
    moving: Collection[str] = (),
) -> dict[str, NodeStatus]:
    """`node_status` of each node by name, from the store's records (see `draining_nodes`)."""
    draining = draining_nodes(cordons, node_events, holding or {}, moving)
    return {n.name: node_status(n, cordons.get(n.name), n.name in draining) for n in nodes}
