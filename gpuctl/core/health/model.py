"""The health vocabulary: severities, verdicts, actions, rules and the verdict values.

Pure and frozen. `gpuctl.core.health` evaluates; `gpuctl.config.health_rules` builds `HealthRules`
from the rules file (`gpuctl/core/health/rules.yaml`).
"""

from __future__ import annotations

import dataclasses
import enum
import string
from collections.abc import Iterable
from typing import Any


class Severity(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    CRITICAL = "critical"
    UNKNOWN = "unknown"

    @property
    def rank(self) -> int:
        """Worse is higher: ok < warn < unknown < critical."""
        return _SEVERITY_RANK[self]

    @property
    def nagios(self) -> int:
        """The Nagios plugin exit status: 0 ok, 1 warning, 2 critical, 3 unknown."""
        return _NAGIOS[self]

    @property
    def verdict(self) -> Verdict:
        return _VERDICT[self]


class Verdict(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


class Action(enum.StrEnum):
    """What the control loop does about a node. Each includes the ones before it: a cordon also
    alerts; `none` only records the reason."""

    NONE = "none"
    ALERT = "alert"
    CORDON = "cordon"
    DRAIN = "drain"

    @property
    def rank(self) -> int:
        return _ACTION_RANK[self]


_SEVERITY_RANK = {Severity.OK: 0, Severity.WARN: 1, Severity.UNKNOWN: 2, Severity.CRITICAL: 3}
_NAGIOS = {Severity.OK: 0, Severity.WARN: 1, Severity.CRITICAL: 2, Severity.UNKNOWN: 3}
_VERDICT = {
    Severity.OK: Verdict.HEALTHY,
    Severity.WARN: Verdict.DEGRADED,
    Severity.CRITICAL: Verdict.UNHEALTHY,
    Severity.UNKNOWN: Verdict.UNKNOWN,
}
_ACTION_RANK = {Action.NONE: 0, Action.ALERT: 1, Action.CORDON: 2, Action.DRAIN: 3}


def worst_severity(severities: Iterable[Severity]) -> Severity:
    return max(severities, key=_SEVERITY_RANK.__getitem__, default=Severity.OK)


def strongest_action(actions: Iterable[Action]) -> Action:
    return max(actions, key=_ACTION_RANK.__getitem__, default=Action.NONE)


# --- the rules -----------------------------------------------------------------------------------

XID_UNKNOWN = "xid_unknown"
ECC_UNCORRECTED = "ecc_uncorrected"
RETIRED_PAGES_PENDING = "retired_pages_pending"
RETIRED_PAGES_EXHAUSTED = "retired_pages_exhausted"
ROW_REMAP_PENDING = "row_remap_pending"
ROW_REMAP_FAILURE = "row_remap_failure"
TEMP_SPIKE = "temp_spike"
TEMP_SUSTAINED = "temp_sustained"
THERMAL_SLOWDOWN = "thermal_slowdown"
GPU_MISSING = "gpu_missing"
UNREADABLE = "unreadable"
UNREACHABLE = "unreachable"
XID_CLASS_PREFIX = "xid_"  # an XID class named `hardware` is the rule `xid_hardware`

_XID_FIELDS: dict[str, Any] = {
    "xid": 79,
    "count": 2,
    "message": "GPU has fallen off the bus",
    "pci": "0000:18:00",
}
# The placeholders each rule's reason template may use, with sample values to check templates.
PLACEHOLDERS: dict[str, dict[str, Any]] = {
    XID_UNKNOWN: _XID_FIELDS,
    ECC_UNCORRECTED: {"count": 4, "max": 0},
    RETIRED_PAGES_PENDING: {"sbe": 1, "dbe": 2},
    RETIRED_PAGES_EXHAUSTED: {"count": 60, "limit": 60, "sbe": 10, "dbe": 50},
    ROW_REMAP_PENDING: {"correctable": 1, "uncorrectable": 2},
    ROW_REMAP_FAILURE: {"correctable": 1, "uncorrectable": 2},
    TEMP_SPIKE: {"temp_c": 95, "limit_c": 85},
    TEMP_SUSTAINED: {"temp_c": 95, "limit_c": 85, "samples": 3, "span_s": 60},
    THERMAL_SLOWDOWN: {"kind": "hardware"},
    GPU_MISSING: {"expected": 8, "found": 7, "missing": 1},
    UNREADABLE: {"error": "nvidia-smi GPU query timed out on the node"},
    UNREACHABLE: {"reach": "timeout", "error": "connect timed out after 5s"},
}
RULE_IDS: tuple[str, ...] = tuple(PLACEHOLDERS)


def template_problem(rule_id: str, template: str) -> str | None:
    """Why `template` cannot be a reason of `rule_id` (an unknown or odd placeholder), or None."""
    fields = PLACEHOLDERS[XID_UNKNOWN] if rule_id.startswith(XID_CLASS_PREFIX) else None
    fields = fields if fields is not None else PLACEHOLDERS.get(rule_id, {})
    offered = ", ".join("{" + f + "}" for f in fields) or "none"
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"is not a valid template ({exc}); write {{{{ and }}}} for literal braces"
    for _, name, _, _ in parts:
        if name is not None and name not in fields:
            shown = "{" + name + "}" if name else "{}"
            return f"uses {shown}, which this rule does not offer (it offers {offered})"
    try:
        template.format(**fields)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return f"cannot be formatted ({exc})"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    id: str
    action: Action
    severity: Severity
    reason: str  # a str.format template over PLACEHOLDERS[id]

    def text(self, **fields: Any) -> str:
        return self.reason.format(**fields)


@dataclasses.dataclass(frozen=True, slots=True)
class XidClass:
    name: str
    xids: frozenset[int]
    rule: Rule  # its id is "xid_<name>"


@dataclasses.dataclass(frozen=True, slots=True)
class TemperatureThresholds:
    limit_c: int  # a GPU at or above this is hot
    sustained_samples: int  # this many consecutive hot samples ...
    sustained_window_s: float  # ... spanning at least this long are sustained heat
    max_gap_s: float  # samples further apart than this are not consecutive


@dataclasses.dataclass(frozen=True, slots=True)
class HealthRules:
    temperature: TemperatureThresholds
    ecc_volatile_uncorrected_max: int  # more volatile uncorrectable ECC errors than this: the rule
    retired_pages_limit: int  # this many retired pages (single + double bit): exhausted
    xid_classes: tuple[XidClass, ...]
    rules: tuple[Rule, ...]  # one per RULE_IDS
    source: str = "built-in"  # the file(s) they came from, for output

    def __post_init__(self) -> None:
        missing = [r for r in RULE_IDS if r not in {rule.id for rule in self.rules}]
        if missing:
            raise ValueError(f"health rules lack {', '.join(missing)}")

    def rule(self, rule_id: str) -> Rule:
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        for cls in self.xid_classes:
            if cls.rule.id == rule_id:
                return cls.rule
        raise KeyError(rule_id)

    def xid_rule(self, xid: int) -> Rule:
        """The rule of the class holding `xid`; `xid_unknown` when no class holds it."""
        for cls in self.xid_classes:
            if xid in cls.xids:
                return cls.rule
        return self.rule(XID_UNKNOWN)


# --- verdicts ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Reason:
    rule: str
    text: str
    severity: Severity
    action: Action
    gpu: int | None = None  # the GPU index; None: the node as a whole


@dataclasses.dataclass(frozen=True, slots=True)
class GpuVerdict:
    index: int
    uuid: str | None
    verdict: Verdict
    severity: Severity
    action: Action
    reasons: tuple[Reason, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeVerdict:
    name: str
    verdict: Verdict
    severity: Severity
    action: Action
    reasons: tuple[Reason, ...]  # every reason, the node's own and each GPU's, worst first per GPU
    gpus: tuple[GpuVerdict, ...]
    taken_at: float | None = None  # of the snapshot judged (gpuctl's clock)
    xids_ignored: int = 0  # XIDs logged before the last verified reset

    @property
    def alert(self) -> bool:
        """A person should hear of it (alert, cordon and drain all alert)."""
        return self.action.rank >= Action.ALERT.rank
