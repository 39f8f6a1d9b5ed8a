"""Health verdicts: from a node snapshot and its recent history to a verdict per GPU and node.

Pure: no I/O, no clock. The rules are data (`gpuctl/core/health/rules.yaml`, read by
`gpuctl.config.health_rules`); `gpuctl.core.health._reasons` only knows what each rule looks at,
and this module puts its reasons together into GPU and node verdicts (and remembers them between
polls: `VerdictMemo`).

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
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuctl.core.health._reasons import (
    earlier_snapshots,
    gpu_reasons,
    make_reason,
    shorten,
    xid_reasons,
)
from gpuctl.core.health.model import (
    GPU_MISSING,
    UNREACHABLE,
    UNREADABLE,
    Action,
    GpuVerdict,
    HealthRules,
    NodeVerdict,
    Reason,
    Severity,
    strongest_action,
    worst_severity,
)
from gpuctl.core.model import FleetSnapshot, GpuSnapshot, NodeSnapshot, Reach


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
        reasons.append(make_reason(rule, None, reach=node.reach.value, error=shorten(error)))
        return _node_verdict(node, reasons, (), ignored=0)

    gpus = obs.gpus if obs.nvml_ok else ()
    if not obs.nvml_ok:
        error = node.error or (obs.notes[0] if obs.notes else "GPU state could not be read")
        reasons.append(make_reason(rules.rule(UNREADABLE), None, error=shorten(error)))
    elif expected_gpus is not None and len(gpus) < expected_gpus:
        missing = expected_gpus - len(gpus)
        reasons.append(
            make_reason(
                rules.rule(GPU_MISSING),
                None,
                expected=expected_gpus,
                found=len(gpus),
                missing=missing,
            )
        )

    from_xids, ignored = xid_reasons(obs.xids, gpus, rules, last_reset_uptime_s)
    reasons.extend(from_xids)
    earlier: tuple[NodeSnapshot, ...] | None = None  # read only for a hot GPU
    for gpu in gpus:
        if gpu.temp_c is not None and gpu.temp_c >= rules.temperature.limit_c and earlier is None:
            earlier = earlier_snapshots(node, history)
        reasons.extend(gpu_reasons(gpu, node, earlier or (), rules))

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


# --- putting a node's verdict together -----------------------------------------------------------


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
