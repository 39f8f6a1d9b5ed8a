"""Health verdicts: from a node snapshot and its recent history to a verdict per GPU and node.

Pure: no I/O, no clock. The rules are data (`gpuctl/core/health_rules.yaml`, read by
`gpuctl.config.health_rules`); this module only knows what each rule looks at.

Severity, verdict and Nagios exit code go together:

    severity   verdict     Nagios
    ok         healthy     0
    warn       degraded    1
    critical   unhealthy   2
    unknown    unknown     3

A node's severity is the worst of its reasons, in the order ok < warn < unknown < critical (the
order of the actions they lead to: an unknown node is cordoned, a critical one drained); its action
is the strongest of its reasons' actions, in the order none < alert < cordon < drain. Time is only
ever compared within one clock: XID stamps against the node's own uptime at the last verified
reset, sample times (`taken_at`, gpuctl's clock) against each other. The node's wall clock is never
read, so a node whose clock is off cannot create or hide a verdict.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuctl.core.health_model import (
    ECC_UNCORRECTED,
    GPU_MISSING,
    RETIRED_PAGES_EXHAUSTED,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    RULE_IDS,
    TEMP_SPIKE,
    TEMP_SUSTAINED,
    THERMAL_SLOWDOWN,
    UNREACHABLE,
    UNREADABLE,
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
    strongest_action,
    worst_severity,
)
from gpuctl.core.model import FleetSnapshot, GpuSnapshot, NodeSnapshot, Reach, XidEvent

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
    "XidClass",
    "evaluate",
    "evaluate_fleet",
    "pci_key",
    "worst",
    "xid_uptime_s",
]


def evaluate(
    node: NodeSnapshot,
    history: Sequence[NodeSnapshot],
    *,
    expected_gpus: int | None,
    rules: HealthRules,
    last_reset_uptime_s: float | None = None,
) -> NodeVerdict:
    """Judge one node from its latest snapshot and earlier ones (any order; other nodes' and
    later snapshots are ignored). `last_reset_uptime_s` is the node's kernel uptime at its last
    verified GPU reset in the current boot: XIDs stamped at or before it are ignored."""
    reasons: list[Reason] = []
    obs = node.observation
    if node.reach is not Reach.OK or obs is None:
        rule = rules.rule(UNREACHABLE)
        error = node.error or f"the node did not answer ({node.reach.value})"
        reasons.append(_reason(rule, None, reach=node.reach.value, error=_short(error)))
        return _node_verdict(node, reasons, (), ignored=0)

    gpus = obs.gpus if obs.nvml_ok else ()
    if not obs.nvml_ok:
        error = node.error or (obs.notes[0] if obs.notes else "GPU state could not be read")
        reasons.append(_reason(rules.rule(UNREADABLE), None, error=_short(error)))
    elif expected_gpus is not None and len(gpus) < expected_gpus:
        missing = expected_gpus - len(gpus)
        reasons.append(
            _reason(
                rules.rule(GPU_MISSING),
                None,
                expected=expected_gpus,
                found=len(gpus),
                missing=missing,
            )
        )

    xid_reasons, ignored = _xid_reasons(obs.xids, gpus, rules, last_reset_uptime_s)
    reasons.extend(xid_reasons)
    earlier: tuple[NodeSnapshot, ...] | None = None  # read only for a hot GPU
    for gpu in gpus:
        if gpu.temp_c is not None and gpu.temp_c >= rules.temperature.limit_c and earlier is None:
            earlier = _earlier(node, history)
        reasons.extend(_gpu_reasons(gpu, node, earlier or (), rules))

    by_gpu: dict[int | None, list[Reason]] = {}
    for r in reasons:
        by_gpu.setdefault(r.gpu, []).append(r)
    per_gpu = []
    for gpu in gpus:
        found = by_gpu.get(gpu.index)
        if not found:  # the usual case: a verdict with nothing to say
            per_gpu.append(_healthy(gpu.index, gpu.uuid))
            continue
        mine = _ordered(found)
        severity = worst_severity(r.severity for r in mine)
        per_gpu.append(
            GpuVerdict(
                index=gpu.index,
                uuid=gpu.uuid,
                verdict=severity.verdict,
                severity=severity,
                action=strongest_action(r.action for r in mine),
                reasons=mine,
            )
        )
    return _node_verdict(node, reasons, tuple(per_gpu), ignored=ignored)


_HEALTHY: dict[tuple[int, str | None], GpuVerdict] = {}


def _healthy(index: int, uuid: str | None) -> GpuVerdict:
    """The verdict of a GPU with nothing to say: one shared value per GPU (a thousand-node
    fleet judges eight thousand of them at every poll)."""
    hit = _HEALTHY.get((index, uuid))
    if hit is None:
        if len(_HEALTHY) > 200_000:
            _HEALTHY.clear()
        hit = _HEALTHY[(index, uuid)] = GpuVerdict(
            index, uuid, Severity.OK.verdict, Severity.OK, Action.NONE, ()
        )
    return hit


def evaluate_fleet(
    fleet: FleetSnapshot | Sequence[NodeSnapshot],
    history: Mapping[str, Sequence[NodeSnapshot]],
    *,
    expected_gpus: Mapping[str, int | None],
    rules: HealthRules,
    last_reset_uptime_s: Mapping[str, float] | None = None,
    memo: VerdictMemo | None = None,
) -> tuple[NodeVerdict, ...]:
    """`evaluate` for every node, in the fleet's order. `memo`: see `VerdictMemo`."""
    nodes = fleet.nodes if isinstance(fleet, FleetSnapshot) else tuple(fleet)
    resets = last_reset_uptime_s or {}
    judge = evaluate if memo is None else memo.evaluate
    out = tuple(
        judge(
            node,
            history.get(node.name, ()),
            expected_gpus=expected_gpus.get(node.name),
            rules=rules,
            last_reset_uptime_s=resets.get(node.name),
        )
        for node in nodes
    )
    if memo is not None:
        memo.forget_all_but({n.name for n in nodes})
    return out


# What no rule reads: memory, utilization and power. Temperature is read only at or above the
# limit, and a node with such a GPU is always judged anew (its verdict depends on the samples
# before it). Every other field of a GPU, present or added later, is part of the memo's key.
_NOT_JUDGED = frozenset(
    {"mem_total_mib", "mem_used_mib", "util_pct", "temp_c", "power_w", "power_limit_w"}
)
_JUDGED = operator.attrgetter(
    *(f.name for f in dataclasses.fields(GpuSnapshot) if f.name not in _NOT_JUDGED)
)


class VerdictMemo:
    """Each node's verdict from the call before, given again (stamped with the new sample's
    time) while nothing the rules read of the node moved: a poller judging a thousand nodes every
    second re-judges only the nodes whose health fields, reachability or XIDs changed, and every
    node with a GPU at or above the temperature limit. Holds the last call's verdicts only; tests
    check it against judging anew, field by field."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[tuple[Any, ...], NodeVerdict]] = {}
        self.reused = 0  # verdicts given again since the last `forget_all_but` (tests)

    def evaluate(
        self,
        node: NodeSnapshot,
        history: Sequence[NodeSnapshot],
        *,
        expected_gpus: int | None,
        rules: HealthRules,
        last_reset_uptime_s: float | None = None,
    ) -> NodeVerdict:
        key = _judged_key(node, expected_gpus, rules, last_reset_uptime_s)
        hit = self._last.get(node.name)
        if key is not None and hit is not None and hit[0] == key:
            self.reused += 1
            v = hit[1]
            if v.taken_at == node.taken_at:
                return v
            return NodeVerdict(
                v.name,
                v.verdict,
                v.severity,
                v.action,
                v.reasons,
                v.gpus,
                node.taken_at,
                v.xids_ignored,
            )
        verdict = evaluate(
            node,
            history,
            expected_gpus=expected_gpus,
            rules=rules,
            last_reset_uptime_s=last_reset_uptime_s,
        )
        if key is None:
            self._last.pop(node.name, None)
        else:
            self._last[node.name] = (key, verdict)
        return verdict

    def forget_all_but(self, names: set[str]) -> None:
        for gone in set(self._last) - names:
            del self._last[gone]
        self.reused = 0


def _judged_key(
    node: NodeSnapshot, expected: int | None, rules: HealthRules, reset: float | None
) -> tuple[Any, ...] | None:
    """Everything `evaluate` reads of a node, or None when its verdict may depend on history."""
    obs = node.observation
    if obs is None:
        return (node.reach, node.state, node.error, rules)
    limit = rules.temperature.limit_c
    gpus = obs.gpus
    for g in gpus:
        if g.temp_c is not None and g.temp_c >= limit:
            return None
    return (
        node.reach,
        node.state,
        node.error,
        rules,
        expected,
        reset,
        obs.nvml_ok,
        obs.notes,
        obs.xids,
        tuple(map(_JUDGED, gpus)),
    )


def worst(verdicts: Iterable[NodeVerdict]) -> Severity:
    """The fleet's severity (its Nagios exit status is `.nagios`)."""
    return worst_severity(v.severity for v in verdicts)


# --- the pieces ----------------------------------------------------------------------------------


def _reason(rule: Rule, gpu: int | None, **fields: Any) -> Reason:
    return Reason(
        rule=rule.id, text=rule.text(**fields), severity=rule.severity, action=rule.action, gpu=gpu
    )


def _node_verdict(
    node: NodeSnapshot, reasons: list[Reason], gpus: tuple[GpuVerdict, ...], *, ignored: int
) -> NodeVerdict:
    severity = worst_severity(r.severity for r in reasons)
    return NodeVerdict(
        name=node.name,
        verdict=severity.verdict,
        severity=severity,
        action=strongest_action(r.action for r in reasons),
        reasons=_ordered(reasons),
        gpus=gpus,
        taken_at=node.taken_at,
        xids_ignored=ignored,
    )


def _ordered(reasons: Iterable[Reason]) -> tuple[Reason, ...]:
    """The node's own reasons first, then by GPU; worst first within each; then by rule, text."""
    return tuple(
        sorted(
            reasons,
            key=lambda r: (
                -1 if r.gpu is None else r.gpu,
                -r.severity.rank,
                -r.action.rank,
                r.rule,
                r.text,
            ),
        )
    )


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_UPTIME = re.compile(r"\s*([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*")


def xid_uptime_s(event: XidEvent) -> float | None:
    """The kernel log's stamp of an XID (seconds since boot), or None when it is not one."""
    match = _UPTIME.fullmatch(event.at or "")
    return float(match.group(1)) if match else None


def pci_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """`00000000:18:00.0` (nvidia-smi) and `0000:18:00` (kernel log) -> the same (0, 0x18, 0)."""
    if not bus_id:
        return None
    parts = bus_id.split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


def _xid_reasons(
    xids: Sequence[XidEvent],
    gpus: Sequence[GpuSnapshot],
    rules: HealthRules,
    last_reset_uptime_s: float | None,
) -> tuple[list[Reason], int]:
    if not xids:
        return [], 0
    by_pci = {pci_key(g.pci_bus_id): g.index for g in gpus if pci_key(g.pci_bus_id) is not None}
    groups: dict[tuple[int | None, int], list[XidEvent]] = {}
    ignored = 0
    for event in xids:
        stamp = xid_uptime_s(event)
        if last_reset_uptime_s is not None and stamp is not None and stamp <= last_reset_uptime_s:
            ignored += 1
            continue
        gpu = by_pci.get(pci_key(event.pci_bus_id))
        groups.setdefault((gpu, event.xid), []).append(event)
    out = []
    for (gpu, xid), events in groups.items():
        last = events[-1]
        message = _short(last.message.strip().rstrip("."), 120) or "no message"
        pci = last.pci_bus_id or "unknown PCI address"
        out.append(
            _reason(rules.xid_rule(xid), gpu, xid=xid, count=len(events), message=message, pci=pci)
        )
    return out, ignored


def _gpu_reasons(
    gpu: GpuSnapshot, node: NodeSnapshot, earlier: Sequence[NodeSnapshot], rules: HealthRules
) -> list[Reason]:
    out: list[Reason] = []
    i = gpu.index
    uncorrected = gpu.ecc_volatile_uncorrected
    if uncorrected is not None and uncorrected > rules.ecc_volatile_uncorrected_max:
        out.append(
            _reason(
                rules.rule(ECC_UNCORRECTED),
                i,
                count=uncorrected,
                max=rules.ecc_volatile_uncorrected_max,
            )
        )
    sbe, dbe = gpu.retired_pages_sbe, gpu.retired_pages_dbe
    retired = (sbe or 0) + (dbe or 0)
    exhausted = (sbe is not None or dbe is not None) and retired >= rules.retired_pages_limit
    if exhausted or gpu.retired_pages_pending:
        pages = {"sbe": _num(sbe), "dbe": _num(dbe)}
        if exhausted:
            out.append(
                _reason(
                    rules.rule(RETIRED_PAGES_EXHAUSTED),
                    i,
                    count=retired,
                    limit=rules.retired_pages_limit,
                    **pages,
                )
            )
        else:
            out.append(_reason(rules.rule(RETIRED_PAGES_PENDING), i, **pages))
    if gpu.remapped_rows_failure or gpu.remapped_rows_pending:
        rows = {
            "correctable": _num(gpu.remapped_rows_correctable),
            "uncorrectable": _num(gpu.remapped_rows_uncorrectable),
        }
        if gpu.remapped_rows_failure:
            out.append(_reason(rules.rule(ROW_REMAP_FAILURE), i, **rows))
        else:
            out.append(_reason(rules.rule(ROW_REMAP_PENDING), i, **rows))
    if (
        (gpu.temp_c is not None and gpu.temp_c >= rules.temperature.limit_c)
        or gpu.thermal_slowdown_hw
        or gpu.thermal_slowdown_sw
    ):
        out.extend(_temperature_reasons(gpu, node, earlier, rules))
    return out


def _num(value: int | None) -> int | str:
    return "N/A" if value is None else value


def _temperature_reasons(
    gpu: GpuSnapshot, node: NodeSnapshot, earlier: Sequence[NodeSnapshot], rules: HealthRules
) -> list[Reason]:
    out: list[Reason] = []
    t = rules.temperature
    if gpu.temp_c is not None and gpu.temp_c >= t.limit_c:
        samples, span_s = _hot_streak(gpu, node, earlier, t)
        if samples >= t.sustained_samples and span_s >= t.sustained_window_s:
            rule = rules.rule(TEMP_SUSTAINED)
            out.append(
                _reason(
                    rule,
                    gpu.index,
                    temp_c=gpu.temp_c,
                    limit_c=t.limit_c,
                    samples=samples,
                    span_s=math.floor(span_s),
                )
            )
        else:
            rule = rules.rule(TEMP_SPIKE)
            out.append(_reason(rule, gpu.index, temp_c=gpu.temp_c, limit_c=t.limit_c))
    kinds = [
        k
        for k, on in (("hardware", gpu.thermal_slowdown_hw), ("software", gpu.thermal_slowdown_sw))
        if on
    ]
    if kinds:
        out.append(_reason(rules.rule(THERMAL_SLOWDOWN), gpu.index, kind=" and ".join(kinds)))
    return out


def _earlier(node: NodeSnapshot, history: Sequence[NodeSnapshot]) -> tuple[NodeSnapshot, ...]:
    """This node's earlier snapshots, newest first (by gpuctl's clock, never the node's)."""
    now = node.taken_at
    if now is None:
        return ()
    kept = [
        h for h in history if h.name == node.name and h.taken_at is not None and h.taken_at < now
    ]
    return tuple(sorted(kept, key=lambda h: -(h.taken_at or 0.0)))


def _same_gpu(gpu: GpuSnapshot, other: NodeSnapshot) -> GpuSnapshot | None:
    obs = other.observation
    if other.reach is not Reach.OK or obs is None or not obs.nvml_ok:
        return None
    for candidate in obs.gpus:
        if gpu.uuid is not None and candidate.uuid is not None:
            if candidate.uuid == gpu.uuid:
                return candidate
        elif candidate.index == gpu.index:
            return candidate
    return None


def _hot_streak(
    gpu: GpuSnapshot,
    node: NodeSnapshot,
    earlier: Sequence[NodeSnapshot],
    t: TemperatureThresholds,
) -> tuple[int, float]:
    """Consecutive hot samples of `gpu` ending with `node`, and the time they span (seconds).

    A sample that is cool, unreadable, lacks the GPU, or lies more than `max_gap_s` before the
    next one ends the streak: too little evidence never drains.
    """
    samples, first, prev = 1, node.taken_at, node.taken_at
    for snap in earlier:
        if prev is None or snap.taken_at is None or prev - snap.taken_at > t.max_gap_s:
            break
        seen = _same_gpu(gpu, snap)
        if seen is None or seen.temp_c is None or seen.temp_c < t.limit_c:
            break
        samples, first, prev = samples + 1, snap.taken_at, snap.taken_at
    span = (node.taken_at - first) if node.taken_at is not None and first is not None else 0.0
    return samples, span
