"""Plain-text rendering of a plan: a table, and with `explain` the why of every decision. Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuctl.core.placement.plan import Placed, Plan, Rejection
from gpuctl.core.units import format_mib

MAX_NODES_SHOWN = 5

NodeFold = Callable[[Sequence[str]], str]  # node names -> one hostlist (`gpu[01-04,07]`)


def render_placement(
    plan: Plan, *, explain: bool, wide: bool = False, fold: NodeFold | None = None
) -> str:
    """The plan as a table (and, with `explain`, why each job went where it did)."""
    lines = [placement_header(plan)]
    lines += _table(*placement_rows(plan, wide=wide))
    lines += placement_footer(plan, explain=explain, fold=fold)
    return "\n".join(lines) + "\n"


def placement_rows(plan: Plan, *, wide: bool = False) -> tuple[list[str], list[list[str]]]:
    """The table's head and rows: a job each."""
    head = ["JOB", "TIER", "PRIORITY", "NODE", "CARDS", "MEM/CARD", "SCORE", "RUNNER-UP"]
    if wide:
        head += ["SHAPE", "CARD UUIDS"]
    rows: list[list[str]] = []
    for o in plan.jobs:
        if isinstance(o, Placed):
            a = o.allocation
            row = [
                o.job,
                o.tier.value,
                str(o.priority),
                o.node,
                ",".join(map(str, a.cards)) or "-",
                "whole" if a.whole else (format_mib(a.mib_per_card) if a.cards else "-"),
                _score(o.score),
                "-" if o.runner_up is None else f"{o.runner_up.node} ({_score(o.runner_up.score)})",
            ]
            if wide:
                row += [o.shape, ",".join(u or "N/A" for u in o.card_uuids) or "-"]
        else:
            row = [o.job, o.tier.value, str(o.priority), "(unplaced)", "-", "-", "-", "-"]
            if wide:
                row += [o.shape, "-"]
        rows.append(row)
    return head, rows


def placement_footer(plan: Plan, *, explain: bool, fold: NodeFold | None = None) -> list[str]:
    """Under the table: how many were placed, why each other was not, and with `explain` the
    why of every decision; `fold` writes each list of nodes (else: the first few, with commas)."""
    lines = [f"{len(plan.placed)} of {len(plan.jobs)} job(s) placed"]
    for u in plan.unplaced:
        lines.append(f"  {u.job}: {u.reason}")
    if explain:
        lines.append("")
        lines += _explain(plan, fold)
    return lines


def placement_header(plan: Plan) -> str:
    s = plan.settings
    return (
        f"fleet version {plan.version or '(none)'} · policy {s.policy} · utilization "
        f"{_pct(plan.utilization_before)} -> {_pct(plan.utilization_after)} "
        f"(standard up to {_pct(s.standard_limit)}, spot up to {_pct(s.spot_limit)})"
    )


def _explain(plan: Plan, fold: NodeFold | None) -> list[str]:
    s = plan.settings
    out = [
        f"policy {s.policy}; nodes: {plan.nodes_total} ({plan.nodes_schedulable} schedulable); "
        "jobs go by priority (highest first), standard before spot, then name; "
        "equal scores go to the node named first",
        f"shape policy: a 1-GPU job asking more than {s.whole_card_over:g} of a card, and every "
        "multi-GPU job, takes whole cards",
        f"band: standard-tier work is admitted while allocated/total GPU memory stays at or below "
        f"{_pct(s.standard_limit)} (band upper edge {_pct(s.band_max)}, failover headroom "
        f"{_pct(s.headroom)}); spot-tier work "
        + (
            f"may use the headroom, up to {_pct(s.spot_limit)}"
            if s.spot_uses_headroom
            else "may not use the headroom"
        ),
    ]
    for o in plan.jobs:
        out.append("")
        if isinstance(o, Placed):
            cards = ",".join(map(str, o.cards)) or "none"
            out.append(f"{o.job} -> {o.node} cards {cards}")
            out.append(f"  shape: {o.shape}")
            runner = (
                "no runner-up"
                if o.runner_up is None
                else f"runner-up {o.runner_up.node} at {_score(o.runner_up.score)}"
            )
            out.append(
                f"  score {_score(o.score)} ({s.policy}); {runner}; "
                f"{o.feasible_nodes} of {plan.nodes_total} node(s) could take it"
            )
            if o.rejections:
                out.append("  not eligible:")
                out += _rejection_lines(o.rejections, fold)
        else:
            out.append(f"{o.job}: not placed ({o.shape})")
            out.append(f"  {o.reason}")
            out += _rejection_lines(o.rejections, fold)
    return out


def _rejection_lines(rs: Sequence[Rejection], fold: NodeFold | None) -> list[str]:
    out = []
    for r in rs:
        shown = fold(r.nodes) if fold else ", ".join(r.nodes[:MAX_NODES_SHOWN])
        more = (
            f", +{r.count - MAX_NODES_SHOWN} more" if not fold and r.count > MAX_NODES_SHOWN else ""
        )
        noun = "node" if r.count == 1 else "nodes"
        out.append(f"    {r.count} {noun} [{r.constraint}] {r.summary}: {shown}{more}")
    return out


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    ]


def _score(x: float) -> str:
    return f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "N/A" if x is None else f"{100 * x:.1f}%"
