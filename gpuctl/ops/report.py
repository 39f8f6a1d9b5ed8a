"""The fleet report: the five numbers now and over a window, the worst nodes, stranded capacity
and the notable events, as one document (JSON) or Markdown for people.

Every figure comes from the services that define it: `fleetstatus.numbers` for the numbers now
(what `gpuctl status` shows), `ops.jobs.fleet_numbers` over the report's window, the health core
for verdicts, placement's view (`fleetstatus.fleet_state`) for capacity, `fleetstatus.node_states`
for each node's state (as `gpuctl status` shows it). The one figure of its own
is the average allocation over the window: the GPU memory each incarnation held, weighted by the
time it held it inside the window, relative to today's capacity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpuctl.adapters.clock import local_stamp
from gpuctl.adapters.protocols import Store
from gpuctl.core.band import TARGET_BAND, BandName
from gpuctl.core.fleet.nodestate import NodeStatus
from gpuctl.core.fleet.numbers import FleetNumbers
from gpuctl.core.health import HealthRules, NodeVerdict, evaluate_fleet
from gpuctl.core.jobs.figures import job_figures
from gpuctl.core.jobs.model import Event
from gpuctl.core.model import FleetSnapshot, Inventory, NodeSnapshot, Reach
from gpuctl.core.placement.model import FleetState
from gpuctl.core.timefmt import duration
from gpuctl.errors import UsageError
from gpuctl.ops import fleetstatus

DEFAULT_WINDOW = "24h"
MAX_WINDOW_S = 366 * 86400.0
NOTABLE_KINDS = (
    "failover",
    "preempt",
    "drain",
    "over_slice",
    "hold",
    "node_down",
    "suspect_network",
)
WORST_LIMIT = 10
EVENTS_LIMIT = 50
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_window(text: str) -> float:
    """`24h`, `90m`, `7d`, `1h30m` or plain seconds -> seconds (more than 0, at most a year)."""
    t = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", t):
        seconds = float(t)
    elif t and re.fullmatch(f"(?:{_PART.pattern})+", t):
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(t))
    else:
        raise UsageError(
            f"--window: {text!r} is not a duration", hint="e.g. 24h, 90m, 7d, 1h30m or seconds"
        )
    if not 0 < seconds <= MAX_WINDOW_S:
        raise UsageError(f"--window must be more than 0 and at most 366d, got {text!r}")
    return seconds


def build_report(
    snapshot: FleetSnapshot,
    store: Store | None,
    *,
    inventory: Inventory,
    rules: HealthRules,
    history: Mapping[str, Sequence[NodeSnapshot]],
    now: float,
    window_s: float,
    store_error: str | None = None,
) -> dict[str, Any]:
    """The report as plain data (the `-o json` document)."""
    from gpuctl.ops import jobs as jobspecs

    state = fleetstatus.fleet_state(snapshot, store)
    now_numbers = fleetstatus.numbers(snapshot, store, now, state=state)
    if store is not None:
        windowed = jobspecs.fleet_numbers(store, now, window_s=window_s).to_dict()
    else:
        windowed = job_figures((), (), {}, now, window_s=window_s).to_dict()
    avg_mib = None if store is None else _allocated_avg_mib(store, now, window_s)
    capacity = now_numbers.capacity_mib
    windowed["allocated_avg_mib"] = avg_mib
    windowed["utilization_avg_pct"] = (
        None if avg_mib is None or not capacity else round(100.0 * avg_mib / capacity, 2)
    )
    expected = {s.name: s.expected_gpus for s in inventory.nodes}
    verdicts = evaluate_fleet(snapshot, history, expected_gpus=expected, rules=rules)
    events = [] if store is None else store.events(since=now - window_s, kinds=NOTABLE_KINDS)
    return {
        "generated_at": now,
        "window": duration(window_s),
        "window_s": window_s,
        "fleet": {
            "nodes": len(snapshot.nodes),
            "nodes_up": sum(1 for n in snapshot.nodes if n.reach is Reach.OK),
            "gpus": sum(len(n.gpus) for n in snapshot.nodes),
            "version": snapshot.version,
        },
        "numbers": {"now": now_numbers.to_dict(), "window": windowed},
        "worst_nodes": _worst(
            snapshot, state, verdicts, events, fleetstatus.node_states(snapshot, store)
        ),
        "stranded": _stranded(state, now_numbers),
        "events": {
            "counts": {k: sum(1 for e in events if e.kind == k) for k in NOTABLE_KINDS},
            "notable": [
                {
                    "at": e.at,
                    "kind": e.kind,
                    "node": e.node,
                    "job_id": e.job_id,
                    "outcome": e.outcome,
                    "message": e.message,
                }
                for e in events[-EVENTS_LIMIT:]
            ],
        },
        "store_error": store_error,
    }


def _allocated_avg_mib(store: Store, now: float, window_s: float) -> float:
    """GPU memory held by incarnations, averaged over the window (MiB)."""
    start = now - window_s
    held = 0.0
    for inc in store.incarnations():
        end = now if inc.state.holds_cards else (inc.ended_at or now)
        overlap = min(end, now) - max(inc.started_at, start)
        if overlap > 0:
            held += inc.mib_per_card * len(inc.cards) * overlap
    return round(held / window_s, 1)


def _worst(
    snapshot: FleetSnapshot,
    state: FleetState,
    verdicts: Sequence[NodeVerdict],
    events: Sequence[Event],
    states: Mapping[str, NodeStatus],
) -> list[dict[str, Any]]:
    """Nodes that are unhealthy, unreachable or unschedulable, worst first (severity, then
    reachability, then schedulability, then notable events in the window, then name)."""
    placed = {n.name: n for n in state.nodes}
    judged = {v.name: v for v in verdicts}
    ranked: list[tuple[tuple[int, bool, bool, int, str], dict[str, Any]]] = []
    for node in snapshot.nodes:
        verdict = judged[node.name]
        place = placed.get(node.name)
        schedulable = place is not None and place.schedulable
        up = node.reach is Reach.OK
        if up and schedulable and verdict.severity.rank == 0:
            continue
        noted = sum(1 for e in events if e.node == node.name)
        row = {
            "name": node.name,
            "reach": node.reach.value,
            "state": states[node.name].state.value,
            "schedulable": schedulable,
            "reason": None if place is None else place.reason,
            "verdict": verdict.verdict.value,
            "severity": verdict.severity.value,
            "action": verdict.action.value,
            "reasons": [r.text for r in verdict.reasons],
            "notable_events": noted,
        }
        ranked.append(((-verdict.severity.rank, up, schedulable, -noted, node.name), row))
    ranked.sort(key=lambda item: item[0])
    return [row for _, row in ranked[:WORST_LIMIT]]


def _stranded(state: FleetState, now_numbers: FleetNumbers) -> dict[str, Any]:
    unschedulable = [
        {"node": n.name, "reason": n.reason, "capacity_mib": sum(c.capacity_mib for c in n.cards)}
        for n in state.nodes
        if not n.schedulable
    ]
    unhealthy = [
        {"node": n.name, "gpu": c.index, "capacity_mib": c.capacity_mib}
        for n in state.nodes
        if n.schedulable
        for c in n.cards
        if not c.healthy
    ]
    return {
        "fragmentation_pct": now_numbers.fragmentation_pct,
        "stranded_gib": now_numbers.stranded_gib,
        "free_mib": sum(c.free_mib for n in state.nodes if n.schedulable for c in n.cards),
        "ghost_mib": sum(c.ghost_mib for n in state.nodes for c in n.cards),
        "unschedulable_mib": sum(u["capacity_mib"] for u in unschedulable),
        "unschedulable": unschedulable,
        "unhealthy_cards": unhealthy,
    }


# --- Markdown ------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _text(value: object) -> str:
    """Untrusted text (node output, event messages) on one line, safe in a table cell."""
    one_line = re.sub(r"[\t\n\r]+", " ", str(value))
    return _CONTROL.sub("", one_line).replace("|", "\\|").strip()


def _pct(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.0f}%"


def _gib(mib: float | None) -> str:
    return "N/A" if mib is None else f"{mib / 1024:.1f} GiB"


def markdown(doc: Mapping[str, Any]) -> str:
    """The report for people: a title, a table of the numbers, lists."""
    fleet, w = doc["fleet"], doc["window"]
    lines = [
        "# gpuctl fleet report",
        "",
        f"Generated {local_stamp(doc['generated_at'])} · window {w} · {fleet['nodes']} node(s), "
        f"{fleet['nodes_up']} up · {fleet['gpus']} GPU(s)",
        "",
        "## Numbers",
        "",
        f"| Number | Now | Over {w} |",
        "| --- | --- | --- |",
        *(f"| {a} | {b} | {c} |" for a, b, c in _number_rows(doc["numbers"])),
        "",
        "## Worst nodes",
        "",
    ]
    worst = doc["worst_nodes"]
    if not worst:
        lines.append("Every node answered, is healthy and takes work.")
    for n in worst:
        parts = [n["verdict"]]
        if n["action"] != "none":
            parts.append(f"action {n['action']}")
        parts.append("answers" if n["reach"] == "ok" else f"does not answer ({n['reach']})")
        if not n["schedulable"]:
            parts.append(f"takes no work ({n['reason']})")
        parts += n["reasons"]
        lines.append(f"- **{_text(n['name'])}**: " + "; ".join(_text(p) for p in parts))
    lines += ["", "## Stranded capacity", "", *_stranded_lines(doc["stranded"]), ""]
    lines += [f"## Notable events ({w})", ""]
    counts = doc["events"]["counts"]
    lines.append(" · ".join(f"{k} {v}" for k, v in counts.items()))
    lines.append("")
    for e in doc["events"]["notable"]:
        where = " ".join(_text(x) for x in (e["node"], e["job_id"]) if x)
        lines.append(f"- {local_stamp(e['at'])} **{e['kind']}** {where}: {_text(e['message'])}")
    if doc.get("store_error"):
        lines += ["", f"Note: the state store could not be read: {_text(doc['store_error'])}"]
    return "\n".join(lines).rstrip() + "\n"


def _number_rows(numbers: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    n, w = numbers["now"], numbers["window"]
    band = f" ({TARGET_BAND.words(BandName(n['band']))})" if n["band"] else ""
    stranded = "" if n["stranded_gib"] is None else f", {n['stranded_gib']:.1f} GiB stranded"

    def failover(x: Mapping[str, Any]) -> str:
        done = f" ({x['failovers_succeeded']} of {x['failovers_attempted']})"
        drained = x.get("drain_moves", 0)
        return _pct(x["failover_success_pct"]) + done + f"; {drained} drain move(s) apart"

    def preempt(x: Mapping[str, Any]) -> str:
        rate = x["preemptions_per_hour"]
        spot = (
            "" if x["spot_preempted_pct"] is None else f", {x['spot_preempted_pct']:.0f}% of spot"
        )
        return ("N/A" if rate is None else f"{rate:.2f}/h") + spot

    return [
        ("Utilization (allocated)", _pct(n["utilization_pct"]) + band,
         _pct(w["utilization_avg_pct"]) + " average"),
        ("Fragmentation", _pct(n["fragmentation_pct"]) + stranded, "—"),
        ("Observed SM utilization", _pct(n["observed_util_pct"]), "—"),
        ("Queue wait p50 / p95", f"{n['queue_waiting']} waiting (oldest "
         f"{duration(n['queue_oldest_wait_s'])})",
         f"{duration(w['queue_wait_p50_s'])} / {duration(w['queue_wait_p95_s'])} "
         f"({w['queue_started']} started)"),
        ("Checkpoint age max / p95", f"{duration(n['checkpoint_age_max_s'])} / "
         f"{duration(n['checkpoint_age_p95_s'])} ({n['checkpoint_running_jobs']} running)", "—"),
        ("Failover success", "—", failover(w)),
        ("Preemption rate", "—", preempt(w)),
    ]  # fmt: skip


def _stranded_lines(s: Mapping[str, Any]) -> list[str]:
    stranded = "N/A" if s["stranded_gib"] is None else f"{s['stranded_gib']:.1f} GiB"
    lines = [
        f"- Fragmentation {_pct(s['fragmentation_pct'])}, stranded {stranded}",
        f"- Free on schedulable nodes: {_gib(s['free_mib'])}",
        f"- Ghost memory (in use by processes gpuctl does not know): {_gib(s['ghost_mib'])}",
        f"- On nodes that take no work: {_gib(s['unschedulable_mib'])}",
    ]
    lines += [
        f"  - {_text(u['node'])}: {_gib(u['capacity_mib'])} ({_text(u['reason'])})"
        for u in s["unschedulable"]
    ]
    lines += [
        f"- Unhealthy card {_text(c['node'])} GPU {c['gpu']}: {_gib(c['capacity_mib'])}"
        for c in s["unhealthy_cards"]
    ]
    return lines
