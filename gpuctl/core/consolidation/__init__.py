"""Consolidation: plans of migrations that free whole cards and nodes. Pure and deterministic.

`plan_consolidation(state, facts, ...)` simulates moves on a copy of the fleet state and keeps
those that strictly reduce its cost, weighed as the default placement weighs a node: stranded
memory (free memory the target workload cannot use, measured by
`gpuctl.core.placement.fragmentation`), plus `HOST_WEIGHT` times the unfed memory (free cards
beyond what the node's free CPU and host memory feed at the workload's average, `host_stranded`)
and `DEAD_WEIGHT` times the dead holes (card memory that some but almost no card-sharing job
fits, `consolidation_dead_range`), best first, up to `max_moves`. With a `target` shape it
solves the drain-and-refill case instead: make room for the target (a whole node, N whole
cards, or a slice) with the fewest moves.

Rules every plan keeps (the property tests check them):

* no card, node (CPU, host memory) or band limit is ever exceeded. A slice moves to a card with
  that much free; a whole-card job moves only to empty cards of the same capacity, so a plan
  never changes the fleet's allocated or free memory, nor its utilization;
* node affinity, node anti-affinity and job anti-affinity hold at every destination;
* `disruptible: false` jobs, jobs moved (started) less than their minimum runtime ago, jobs
  gpuctl has no facts about, and jobs on unschedulable nodes are never moved (they are listed as
  pinned, with the reason);
* each job moves at most once per plan, and no plan has more than `max_moves` moves;
* without a target, every move strictly reduces the cost. Stranded memory may grow by a move
  that closes more dead holes (`FleetFigures.dead_mib`) or unfed memory
  (`FleetFigures.unfed_mib`) than it strands.

Jobs are preferred by the cost a move frees, discounted by the move's cost: a stale
(or missing) checkpoint and a large footprint make a move dearer (`move_penalty`). Ties go to the
job, then the node, whose name sorts first.

A plan carries `version`, a digest of everything it depends on (`consolidation_version`): nodes,
schedulability, labels, cards' capacity/allocated/ghost/health, and the allocations. Applying a
plan to a state of another version is refused.

The package's front (this module) re-exports its public names; the pieces are private: the
greedy search (`_search`), drain-and-refill (`_target`), the working state both simulate moves on
(`_work`), planning and applying (`_plan`) and the plan as a document and as text (`_doc`). The
values are in `model`, which the pieces import (never this front, so no piece imports another in
a loop).
"""

from __future__ import annotations

from gpuctl.core.consolidation._doc import (
    PLAN_FORMAT,
    PLAN_KIND,
    consolidation_footer,
    consolidation_header,
    consolidation_rows,
    plan_from_dict,
    plan_to_dict,
    render_consolidation,
)
from gpuctl.core.consolidation._plan import (
    apply_consolidation,
    consolidation_version,
    fleet_figures,
    moved_jobs,
    node_free,
    plan_consolidation,
)
from gpuctl.core.consolidation.model import (
    DEFAULT_MAX_MOVES,
    DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S,
    ConsolidationPlan,
    FleetFigures,
    JobFacts,
    Migration,
    Pinned,
    TargetOutcome,
)

__all__ = [
    "DEFAULT_MAX_MOVES",
    "DEFAULT_MIN_RUNTIME_BETWEEN_MOVES_S",
    "PLAN_FORMAT",
    "PLAN_KIND",
    "ConsolidationPlan",
    "FleetFigures",
    "JobFacts",
    "Migration",
    "Pinned",
    "TargetOutcome",
    "apply_consolidation",
    "consolidation_footer",
    "consolidation_header",
    "consolidation_rows",
    "consolidation_version",
    "fleet_figures",
    "moved_jobs",
    "node_free",
    "plan_consolidation",
    "plan_from_dict",
    "plan_to_dict",
    "render_consolidation",
]
