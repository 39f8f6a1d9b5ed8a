"""The rule pieces of the health verdict: each turns what one rule looks at (XIDs, a GPU's ECC
errors, retired pages, remapped rows, its temperature with the sustained-heat look back over
earlier samples, thermal slowdown) into `Reason`s. `gpuctl.core.health` puts them together into
GPU and node verdicts.

Pure: no I/O, no clock. XID stamps are compared only with the node's own uptime, sample times
(`taken_at`, gpuctl's clock) only with each other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from gpuctl.core.health.model import (
    ECC_UNCORRECTED,
    RETIRED_PAGES_EXHAUSTED,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    TEMP_SPIKE,
    TEMP_SUSTAINED,
    THERMAL_SLOWDOWN,
    HealthRules,
    Reason,
    Rule,
    TemperatureThresholds,
)
from gpuctl.core.model import GpuSnapshot, NodeSnapshot, Observation, Reach, XidEvent, pci_key


def make_reason(rule: Rule, gpu: int | None, **fields: Any) -> Reason:
    """`rule`'s reason, its text filled in from `fields`; `gpu` None for the node's own."""
    return Reason(
        rule=rule.id, text=rule.text(**fields), severity=rule.severity, action=rule.action, gpu=gpu
    )


def shorten(text: str, limit: int = 200) -> str:
    """`text` on one line, cut to `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_UPTIME = re.compile(r"\s*([0-9]{1,12}(?:\.[0-9]{1,9})?)\s*")


def xid_uptime_s(event: XidEvent) -> float | None:
    """The kernel log's stamp of an XID (seconds since boot), or None when it is not one."""
    match = _UPTIME.fullmatch(event.at or "")
    return float(match.group(1)) if match else None


def xid_reasons(
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
        message = shorten(last.message.strip().rstrip("."), 120) or "no message"
        pci = last.pci_bus_id or "unknown PCI address"
        out.append(
            make_reason(
                rules.xid_rule(xid), gpu, xid=xid, count=len(events), message=message, pci=pci
            )
        )
    return out, ignored


def gpu_reasons(
    gpu: GpuSnapshot, node: NodeSnapshot, earlier: Sequence[NodeSnapshot], rules: HealthRules
) -> list[Reason]:
    out: list[Reason] = []
    i = gpu.index
    uncorrected = gpu.ecc_volatile_uncorrected
    if uncorrected is not None and uncorrected > rules.ecc_volatile_uncorrected_max:
        out.append(
            make_reason(
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
                make_reason(
                    rules.rule(RETIRED_PAGES_EXHAUSTED),
                    i,
                    count=retired,
                    limit=rules.retired_pages_limit,
                    **pages,
                )
            )
        else:
            out.append(make_reason(rules.rule(RETIRED_PAGES_PENDING), i, **pages))
    if gpu.remapped_rows_failure or gpu.remapped_rows_pending:
        rows = {
            "correctable": _num(gpu.remapped_rows_correctable),
            "uncorrectable": _num(gpu.remapped_rows_uncorrectable),
        }
        if gpu.remapped_rows_failure:
            out.append(make_reason(rules.rule(ROW_REMAP_FAILURE), i, **rows))
        else:
            out.append(make_reason(rules.rule(ROW_REMAP_PENDING), i, **rows))
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
                make_reason(
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
            out.append(make_reason(rule, gpu.index, temp_c=gpu.temp_c, limit_c=t.limit_c))
    kinds = [
        k
        for k, on in (("hardware", gpu.thermal_slowdown_hw), ("software", gpu.thermal_slowdown_sw))
        if on
    ]
    if kinds:
        out.append(make_reason(rules.rule(THERMAL_SLOWDOWN), gpu.index, kind=" and ".join(kinds)))
    return out


def earlier_snapshots(
    node: NodeSnapshot, history: Sequence[NodeSnapshot]
) -> tuple[NodeSnapshot, ...]:
    """This node's earlier snapshots, newest first (by gpuctl's clock, never the node's)."""
    now = node.taken_at
    if now is None:
        return ()
    kept = [
        h for h in history if h.name == node.name and h.taken_at is not None and h.taken_at < now
    ]
    return tuple(sorted(kept, key=lambda h: -(h.taken_at or 0.0)))


def look_back_sample(node: NodeSnapshot, hot_from_c: int | None = None) -> NodeSnapshot:
    """What the look-back rule (sustained heat, `_hot_streak`) reads of an earlier sample, and
    nothing more: the node's name, reach, state and time, whether its GPUs were readable, and
    each GPU's index, UUID and temperature. With `hot_from_c`, only the GPUs at or above it: a
    GPU left out ends a hot streak there, as a cool one does, so a node with no hot GPU keeps
    none (the dashboard's memory, polled every second, stays small)."""
    obs = node.observation
    gpus: tuple[GpuSnapshot, ...] = ()
    if obs is not None and obs.nvml_ok:
        gpus = tuple(
            GpuSnapshot(index=g.index, uuid=g.uuid, temp_c=g.temp_c)
            for g in obs.gpus
            if hot_from_c is None or (g.temp_c is not None and g.temp_c >= hot_from_c)
        )
    return NodeSnapshot(
        name=node.name,
        reach=node.reach,
        state=node.state,
        observation=None if obs is None else Observation(gpus=gpus, nvml_ok=obs.nvml_ok),
        taken_at=node.taken_at,
    )


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
