"""Playbooks, pure: the validated playbook as values (`model`), what it does before it runs
(targets, batches, units, the dry run's words, the jobs a cancel step picks: private `_plan`,
re-exported here), a run's results and journal (`run`) and the small language of its conditions
(`expr`). No I/O, no clock.
"""

from __future__ import annotations

from gpuctl.core.playbook._plan import (
    batch_size,
    batches,
    choose_cancellations,
    command_text,
    describe,
    explain_condition,
    resolve_targets,
    sudo_argv,
    units,
)
from gpuctl.core.playbook.model import (
    NODE_KINDS,
    STEP_KINDS,
    CancelCandidate,
    Playbook,
    Selector,
    Settings,
    Step,
    TargetFacts,
    TimeWindow,
    Unit,
    unit_key,
)

__all__ = [
    "NODE_KINDS",
    "STEP_KINDS",
    "CancelCandidate",
    "Playbook",
    "Selector",
    "Settings",
    "Step",
    "TargetFacts",
    "TimeWindow",
    "Unit",
    "batch_size",
    "batches",
    "choose_cancellations",
    "command_text",
    "describe",
    "explain_condition",
    "resolve_targets",
    "sudo_argv",
    "unit_key",
    "units",
]
