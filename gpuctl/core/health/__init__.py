"""Node and GPU health, pure: the rules as data (`rules.yaml`, read by
`gpuctl.config.health_rules` into `model.HealthRules`), the verdict per GPU and node from a
snapshot and its recent history (`evaluate`, `evaluate_fleet`, remembered between polls by
`VerdictMemo`), what the control loop does about a verdict pass after pass (`autodrain`: cordon,
drain, lift its own cordons) and the hints `gpuctl status` shows from the last poll alone
(`poll_hints`).

This front re-exports the vocabulary (`model`) and the evaluation; its pieces are private: the
evaluation (`_evaluate`) and what each rule looks at (`_reasons`).
"""

from __future__ import annotations

from gpuctl.core.health._evaluate import VerdictMemo, evaluate, evaluate_fleet, worst
from gpuctl.core.health._reasons import look_back_sample
from gpuctl.core.health.model import (
    RULE_IDS,
    XID_UNKNOWN,
    Action,
    GpuVerdict,
    HealthRules,
    NodeVerdict,
    Reason,
    Rule,
    Severity,
    TemperatureThresholds,
    Verdict,
    XidClass,
)

__all__ = [
    "RULE_IDS",
    "XID_UNKNOWN",
    "Action",
    "GpuVerdict",
    "HealthRules",
    "NodeVerdict",
    "Reason",
    "Rule",
    "Severity",
    "TemperatureThresholds",
    "Verdict",
    "VerdictMemo",
    "XidClass",
    "evaluate",
    "evaluate_fleet",
    "look_back_sample",
    "worst",
]
