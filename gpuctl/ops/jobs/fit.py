"""Could the fleet ever take a job? `gpuctl submit` asks before it queues: a job no node of the
inventory could take, even empty (too many cards, a card too large, a model no node has), is
refused rather than left to wait forever. The rule is the core's (`placement.constraints.
never_fits`); this module applies it to a poll and words the answer."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuctl.config.jobspec_files import LoadedSpec
from gpuctl.core.fleet.view import fleet_state_from_snapshot
from gpuctl.core.model import FleetSnapshot, Reach
from gpuctl.core.placement.constraints import never_fits
from gpuctl.errors import JobSpecError

QUEUE_ANYWAY = "--queue-anyway"


@dataclasses.dataclass(frozen=True, slots=True)
class FitCheck:
    refused: JobSpecError | None = None  # the first job no node could ever take
    note: str | None = None  # what the check could not tell (nodes that did not answer)


def check_fit(specs: Sequence[LoadedSpec], snapshot: FleetSnapshot) -> FitCheck:
    """Each job against the nodes that answered the poll, as they were seen (what runs there,
    cordons and card health aside). A job that fits none of them while some node did not answer
    is not refused: that node may take it."""
    answered = {n.name for n in snapshot.nodes if n.reach is Reach.OK}
    state = fleet_state_from_snapshot(snapshot, versioned=False)
    nodes = [n for n in state.nodes if n.name in answered]
    silent = len(snapshot.nodes) - len(answered)
    if not nodes:
        return FitCheck(
            note="no node answered the poll: whether the jobs could ever fit was not checked"
        )
    for loaded in specs:
        why = never_fits(loaded.spec.request, nodes)
        if why is None:
            continue
        if silent:
            return FitCheck(
                note=f"{loaded.source}: {why.field}: {why.message}; {silent} node(s) did not "
                "answer the poll and may take it: queued"
            )
        return FitCheck(
            refused=JobSpecError(
                f"{why.message}: no node of the inventory could ever take "
                f"{loaded.spec.name!r}; nothing was queued",
                path=loaded.source,
                field=why.field,
                hint=f"fix the spec, or pass {QUEUE_ANYWAY} to queue it for nodes yet to come",
            )
        )
    return FitCheck()
