"""A consolidation plan as a document (`-o json|yaml`, saved and read back) and as text. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuctl.core.consolidation.model import (
    ConsolidationPlan,
    FleetFigures,
    Migration,
    Pinned,
    TargetOutcome,
)
from gpuctl.core.placement.model import Tier
from gpuctl.core.timefmt import duration
from gpuctl.core.units import format_mib
from gpuctl.errors import PlanError

PLAN_KIND = "consolidation-plan"
PLAN_FORMAT = 1
PINNED_SHOWN = 5


def _figures(f: FleetFigures) -> dict[str, Any]:
    pct = f.fragmentation_pct
    return {
        "whole_free_cards": f.whole_free_cards,
        "whole_free_nodes": f.whole_free_nodes,
        "free_mib": f.free_mib,
        "stranded_mib": round(f.stranded_mib, 3),
        "stranded_gib": round(f.stranded_gib, 3),
        "fragmentation_pct": None if pct is None else round(pct, 2),
        "capacity_mib": f.capacity_mib,
        "dead_mib": f.dead_mib,
        "unfed_mib": round(f.unfed_mib, 3),
    }


def _move(m: Migration) -> dict[str, Any]:
    return {
        "job": m.job,
        "tier": m.tier.value,
        "from": {"node": m.from_node, "cards": list(m.from_cards)},
        "to": {"node": m.to_node, "cards": list(m.to_cards)},
        "mib_per_card": m.mib_per_card,
        "whole": m.whole,
        "checkpoint_age_s": None if m.checkpoint_age_s is None else round(m.checkpoint_age_s, 1),
        "stranded_freed_mib": round(m.stranded_freed_mib, 3),
        "cpu_milli": m.cpu_milli,
        "host_mem_mib": m.host_mem_mib,
    }


def plan_to_dict(plan: ConsolidationPlan) -> dict[str, Any]:
    """The plan as one JSON-serialisable document (`plan_from_dict` reads it back)."""
    ages = [m.checkpoint_age_s for m in plan.moves]
    known = [a for a in ages if a is not None]
    t = plan.target
    return {
        "kind": PLAN_KIND,
        "format": PLAN_FORMAT,
        "version": plan.version,
        "version_after": plan.version_after,
        "snapshot_version": plan.snapshot_version,
        "max_moves": plan.max_moves,
        "reason": plan.reason,
        "moves": [_move(m) for m in plan.moves],
        "before": _figures(plan.before),
        "after": _figures(plan.after),
        "frees": {
            "whole_cards": plan.after.whole_free_cards - plan.before.whole_free_cards,
            "whole_nodes": plan.after.whole_free_nodes - plan.before.whole_free_nodes,
            "stranded_gib": round(plan.before.stranded_gib - plan.after.stranded_gib, 3),
        },
        "cost": {
            "moves": len(plan.moves),
            "max_checkpoint_age_s": round(max(known), 1) if known else None,
            "moves_without_checkpoint": sum(1 for a in ages if a is None),
        },
        "target": None
        if t is None
        else {
            "shape": t.shape,
            "fits": t.fits,
            "node": t.node,
            "cards": list(t.cards),
            "reason": t.reason,
        },
        "pinned": [{"job": p.job, "node": p.node, "reason": p.reason} for p in plan.pinned],
    }


def _figures_from(d: Mapping[str, Any]) -> FleetFigures:
    return FleetFigures(
        whole_free_cards=int(d["whole_free_cards"]),
        whole_free_nodes=int(d["whole_free_nodes"]),
        free_mib=int(d["free_mib"]),
        stranded_mib=float(d["stranded_mib"]),
        capacity_mib=int(d["capacity_mib"]),
        dead_mib=int(d.get("dead_mib", 0)),  # plans written before dead holes were measured
        unfed_mib=float(d.get("unfed_mib", 0.0)),  # ... and before unfed memory was
    )


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def plan_from_dict(data: Mapping[str, Any]) -> ConsolidationPlan:
    """Inverse of `plan_to_dict`. Raises PlanError for anything that is not such a document."""
    try:
        if data.get("kind") != PLAN_KIND or data.get("format") != PLAN_FORMAT:
            raise PlanError(f"not a gpuctl {PLAN_KIND} of format {PLAN_FORMAT}")
        t = data.get("target")
        return ConsolidationPlan(
            version=str(data["version"]),
            version_after=str(data["version_after"]),
            snapshot_version=str(data["snapshot_version"]),
            max_moves=int(data["max_moves"]),
            reason=str(data["reason"]),
            moves=tuple(
                Migration(
                    job=str(m["job"]),
                    tier=Tier(m["tier"]),
                    from_node=str(m["from"]["node"]),
                    from_cards=tuple(int(c) for c in m["from"]["cards"]),
                    to_node=str(m["to"]["node"]),
                    to_cards=tuple(int(c) for c in m["to"]["cards"]),
                    mib_per_card=int(m["mib_per_card"]),
                    whole=bool(m["whole"]),
                    checkpoint_age_s=_opt_float(m.get("checkpoint_age_s")),
                    stranded_freed_mib=float(m["stranded_freed_mib"]),
                    cpu_milli=int(m.get("cpu_milli", 0)),
                    host_mem_mib=int(m.get("host_mem_mib", 0)),
                )
                for m in data["moves"]
            ),
            before=_figures_from(data["before"]),
            after=_figures_from(data["after"]),
            pinned=tuple(
                Pinned(str(p["job"]), str(p["node"]), str(p["reason"])) for p in data["pinned"]
            ),
            target=None
            if t is None
            else TargetOutcome(
                shape=str(t["shape"]),
                fits=bool(t["fits"]),
                node=None if t["node"] is None else str(t["node"]),
                cards=tuple(int(c) for c in t["cards"]),
                reason=str(t["reason"]),
            ),
        )
    except PlanError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanError(f"not a valid consolidation plan: {type(exc).__name__}: {exc}") from None


# --- text ---------------------------------------------------------------------------------------


def age_text(seconds: float | None) -> str:
    """A checkpoint's age as `timefmt.duration` writes it; `none` before the first one."""
    return "none" if seconds is None else duration(seconds)


def _cards(node: str, cards: tuple[int, ...]) -> str:
    return f"{node} cards {','.join(map(str, cards))}" if cards else f"{node} (no card)"


def _pct(x: float | None) -> str:
    return "N/A" if x is None else f"{x:.1f}%"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    ]


def render_consolidation(plan: ConsolidationPlan) -> str:
    """The plan as an operator reads it: the moves, what they free, what they cost."""
    lines = [consolidation_header(plan)]
    if plan.moves:
        lines += _table(*consolidation_rows(plan))
        lines.append("")
    lines += consolidation_footer(plan)
    return "\n".join(lines) + "\n"


def consolidation_header(plan: ConsolidationPlan) -> str:
    return (
        f"consolidation plan · fleet version {plan.version} · {len(plan.moves)} move(s) "
        f"(max {plan.max_moves})"
    )


def consolidation_rows(plan: ConsolidationPlan) -> tuple[list[str], list[list[str]]]:
    """The moves' table: its head and a row per move."""
    rows = [
        [
            m.job,
            m.tier.value,
            _cards(m.from_node, m.from_cards),
            _cards(m.to_node, m.to_cards),
            "whole" if m.whole else format_mib(m.mib_per_card),
            age_text(m.checkpoint_age_s),
        ]
        for m in plan.moves
    ]
    return ["JOB", "TIER", "FROM", "TO", "MEM/CARD", "CHECKPOINT AGE"], rows


def consolidation_footer(plan: ConsolidationPlan) -> list[str]:
    """Under the moves: the figures before and after, the plan's reason, the jobs not moved."""
    b, a = plan.before, plan.after
    figures = [
        ["whole free cards", str(b.whole_free_cards), str(a.whole_free_cards)],
        ["whole free nodes", str(b.whole_free_nodes), str(a.whole_free_nodes)],
        ["stranded", format_mib(round(b.stranded_mib)), format_mib(round(a.stranded_mib))],
        ["fragmentation", _pct(b.fragmentation_pct), _pct(a.fragmentation_pct)],
        ["unfed by host", format_mib(round(b.unfed_mib)), format_mib(round(a.unfed_mib))],
        ["dead holes", format_mib(b.dead_mib), format_mib(a.dead_mib)],
    ]
    lines = _table(["", "BEFORE", "AFTER"], figures)
    if plan.target is not None:
        lines.append(f"target: {plan.target.reason}")
    else:
        lines.append(plan.reason)
    if plan.pinned:
        shown = "; ".join(f"{p.job}: {p.reason}" for p in plan.pinned[:PINNED_SHOWN])
        more = len(plan.pinned) - PINNED_SHOWN
        tail = f"; and {more} more (-o json lists them)" if more > 0 else ""
        lines.append(f"not moved: {shown}{tail}")
    return lines
