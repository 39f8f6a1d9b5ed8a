"""The health rules file: the built-in table (`gpuctl/core/health/rules.yaml`), optionally
overridden by an operator's file, validated, converted to `gpuctl.core.health.HealthRules`.

An override file has the built-in file's layout and holds only what it changes: mappings are
merged key by key, lists replace. The merged rules are validated as a whole; every problem is one
`ConfigError` naming the override file, the line, the field and (for a mistyped key) the closest
valid key.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

from gpuctl.config.document import Document, KeyLines, error_at
from gpuctl.config.loader import load_document, parse_yaml
from gpuctl.config.loader import validate_data as _validate
from gpuctl.core.health.model import (
    RULE_IDS,
    XID_CLASS_PREFIX,
    XID_UNKNOWN,
    Action,
    HealthRules,
    Rule,
    Severity,
    TemperatureThresholds,
    XidClass,
    template_problem,
)
from gpuctl.errors import ConfigError

KIND = "health rules"
BUILT_IN = "gpuctl/core/health/rules.yaml"  # how the built-in file is named in messages
CLASS_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RuleModel(_Strict):
    action: Literal["none", "alert", "cordon", "drain"]
    severity: Literal["ok", "warn", "critical", "unknown"]
    reason: Annotated[str, Field(min_length=1, max_length=300)]


class XidClassModel(RuleModel):
    xids: list[Annotated[StrictInt, Field(ge=1, le=9999)]]


class TemperatureModel(_Strict):
    limit_c: Annotated[StrictInt, Field(ge=0, le=150)]
    sustained_samples: Annotated[StrictInt, Field(ge=1, le=1000)]
    sustained_window_s: Annotated[StrictFloat, Field(ge=0, le=86400)]
    max_gap_s: Annotated[StrictFloat, Field(gt=0, le=86400)]


class ThresholdsModel(_Strict):
    temperature: TemperatureModel
    ecc_volatile_uncorrected_max: Annotated[StrictInt, Field(ge=0)]
    retired_pages_limit: Annotated[StrictInt, Field(ge=1)]


class RulesModel(_Strict):
    xid_unknown: RuleModel
    ecc_uncorrected: RuleModel
    retired_pages_pending: RuleModel
    retired_pages_exhausted: RuleModel
    row_remap_pending: RuleModel
    row_remap_failure: RuleModel
    temp_spike: RuleModel
    temp_sustained: RuleModel
    thermal_slowdown: RuleModel
    gpu_missing: RuleModel
    unreadable: RuleModel
    unreachable: RuleModel


class HealthRulesModel(_Strict):
    version: Literal[1]
    thresholds: ThresholdsModel
    xid_classes: dict[Annotated[str, Field(pattern=CLASS_NAME_PATTERN)], XidClassModel]
    rules: RulesModel


def built_in_text() -> str:
    return importlib.resources.files("gpuctl.core.health").joinpath("rules.yaml").read_text("utf-8")


def load_rules(override: Path | None = None) -> HealthRules:
    """The built-in rules, with `override` (an operator's file) merged over them when given."""
    base = parse_yaml(built_in_text(), path=BUILT_IN, kind=KIND)
    if override is None:
        return _convert(base.data, base, source="built-in")
    doc: Document = load_document(override, kind=KIND)
    merged = merge(base.data, doc.data)
    return _convert(merged, doc, source=f"built-in + {override}")


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: mappings merged key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _convert(data: dict[str, Any], doc: Document, *, source: str) -> HealthRules:
    """Validate `data`; errors point into `doc` (the override file when there is one)."""
    model = _validate(data, HealthRulesModel, path=doc.path, lines=doc.lines)
    _check(model, doc.path, doc.lines)
    t = model.thresholds.temperature
    rules = tuple(_rule(name, getattr(model.rules, name)) for name in RULE_IDS)
    classes = tuple(
        XidClass(
            name=name,
            xids=frozenset(spec.xids),
            rule=_rule(XID_CLASS_PREFIX + name, spec),
        )
        for name, spec in sorted(model.xid_classes.items())
    )
    return HealthRules(
        temperature=TemperatureThresholds(
            limit_c=t.limit_c,
            sustained_samples=t.sustained_samples,
            sustained_window_s=float(t.sustained_window_s),
            max_gap_s=float(t.max_gap_s),
        ),
        ecc_volatile_uncorrected_max=model.thresholds.ecc_volatile_uncorrected_max,
        retired_pages_limit=model.thresholds.retired_pages_limit,
        xid_classes=classes,
        rules=rules,
        source=source,
    )


def _rule(rule_id: str, spec: RuleModel) -> Rule:
    return Rule(
        id=rule_id, action=Action(spec.action), severity=Severity(spec.severity), reason=spec.reason
    )


def _check(model: HealthRulesModel, path: Path, lines: KeyLines) -> None:
    """What pydantic cannot see: XIDs in two classes, class names, reason placeholders."""

    def fail(loc: tuple[str | int, ...], message: str, hint: str | None = None) -> ConfigError:
        return error_at(ConfigError, path=path, lines=lines, loc=loc, message=message, hint=hint)

    owner: dict[int, tuple[str, int]] = {}
    for name, spec in model.xid_classes.items():
        if XID_CLASS_PREFIX + name == XID_UNKNOWN:
            raise fail(
                ("xid_classes", name),
                f"the class name {name!r} is reserved",
                hint="XIDs in no class already take the rule rules.xid_unknown",
            )
        for i, xid in enumerate(spec.xids):
            first = owner.setdefault(xid, (name, i))
            if first[0] == name:
                continue
            # Point at the entry this file wrote (the other may be the built-in one).
            here: tuple[str | int, ...] = ("xid_classes", name, "xids", i)
            other = first[0]
            if lines.exact(here) is None and lines.exact(("xid_classes", other, "xids")):
                here, other = ("xid_classes", other, "xids", first[1]), name
            raise fail(
                here,
                f"XID {xid} is also in the class {other!r}",
                hint=f"an XID belongs to one class: remove it from xid_classes.{other}.xids",
            )
        problem = template_problem(XID_CLASS_PREFIX + name, spec.reason)
        if problem:
            raise fail(("xid_classes", name, "reason"), f"the reason {problem}")
    for rule_id in RULE_IDS:
        problem = template_problem(rule_id, getattr(model.rules, rule_id).reason)
        if problem:
            raise fail(("rules", rule_id, "reason"), f"the reason {problem}")
