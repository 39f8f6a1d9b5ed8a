"""`gpuctl cordon`, `gpuctl uncordon`, `gpuctl drain`: thin shells over `gpuctl.ops.nodeops`.

Each shows what it is about to do and asks (on stderr; `--yes` for scripts). The operator recorded
with every cordon and drain is $USER. Exit status: 0 done (drain: every job on the node moved, or
none was there); 3 a drain left jobs on the node (no room, timed out, rolled back: each says why;
the node stays cordoned); 1 the question was answered no (nothing changed), or an unexpected
error; 2 bad input (unknown node, bad options); 6 the state store refuses, or another gpuctl held
the loop lock too long.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import typer

from gpuctl.cli import context
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.errors import ExitCode, UsageError, exit_for_apply

if TYPE_CHECKING:
    from gpuctl.adapters.protocols import Clock, Store
    from gpuctl.core.model import FleetSnapshot
    from gpuctl.ops.migrate import MigrationResult
    from gpuctl.ops.nodeops import DrainPlan, DrainResult
    from gpuctl.ops.reconcile import Reconciler


def cordon(
    ctx: typer.Context,
    node: str = typer.Argument(..., metavar="NODE", help="An inventory node."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded with the cordon)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
) -> None:
    """Place no new work on NODE; the jobs running there stay. Exit 0 when cordoned."""
    from gpuctl.ops import nodeops

    _known(ctx, node)
    if not yes:
        _ask(f"cordon {node} (no new work lands there; running jobs stay)?")
    with _store(ctx) as store:
        done = nodeops.cordon(store, node, reason=reason, operator=_operator(ctx), clock=_clock())
    sys.stdout.write(safe(f"{node} cordoned by {done.operator}: {done.reason}") + "\n")


def uncordon(
    ctx: typer.Context,
    node: str = typer.Argument(..., metavar="NODE", help="An inventory node."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
) -> None:
    """Let NODE take new work again (whoever cordoned it). Exit 0 when it is not cordoned."""
    from gpuctl.ops import nodeops

    _known(ctx, node)
    with _store(ctx) as store:
        there = {c.node: c for c in store.cordons()}.get(node)
        if there is None:
            sys.stderr.write(f"{node} is not cordoned; nothing to do\n")
            return
        if not yes:
            _ask(
                f"uncordon {node} (cordoned {_ago(there.at)} by {there.operator}, source "
                f"{there.source}: {there.reason})?"
            )
        nodeops.uncordon(store, node, operator=_operator(ctx), clock=_clock())
    sys.stdout.write(safe(f"{node} uncordoned (was: {there.reason}, by {there.operator})") + "\n")


def drain(
    ctx: typer.Context,
    node: str = typer.Argument(..., metavar="NODE", help="An inventory node."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded with the cordon)."),
    grace: float | None = typer.Option(
        None, "--grace", help="Seconds from SIGTERM to SIGKILL (default: each job's grace_s)."
    ),
    checkpoint_wait: float | None = typer.Option(
        None,
        "--checkpoint-wait",
        help="Seconds to wait for the checkpoint asked with SIGUSR1 (default: the grace).",
    ),
    timeout: float = typer.Option(
        600.0, "--timeout", help="Seconds until every job was asked to stop; the rest stay."
    ),
    parallel: int = typer.Option(2, "--parallel", help="Jobs moved at once."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan; change nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Cordon NODE, then move each job off it: checkpoint (SIGUSR1) -> stop (SIGTERM, the grace,
    SIGKILL) -> start on a target reserved first, from the newest committed checkpoint.

    Exit 0 when every job moved; 3 when some stay on the node (each with the reason).
    """
    from gpuctl.ops import nodeops

    if (grace is not None and grace < 0) or (checkpoint_wait is not None and checkpoint_wait < 0):
        raise UsageError("--grace and --checkpoint-wait are never negative")
    if timeout <= 0 or parallel < 1:
        raise UsageError("--timeout must be positive and --parallel 1 or more")
    _known(ctx, node)
    loop, snapshot, close = build_loop(ctx, write=not dry_run)
    try:
        plan = nodeops.plan_drain(nodeops.tick(loop, snapshot), node, reason=reason)
        document = output in (Output.JSON, Output.YAML)
        if dry_run:
            if document:
                emit_document({"dry_run": True, "plan": plan.to_dict()}, output)
            else:
                sys.stdout.write(render_plan(plan))
            sys.stderr.write("dry run: nothing changed\n")
            return
        # the plan before the question: on stdout as a table, on stderr when stdout is a document
        (sys.stderr if document else sys.stdout).write(render_plan(plan))
        if not yes:
            _ask(f"cordon {node} and move {len(plan.movable)} job(s) off it?")
        result = nodeops.drain(
            loop,
            plan,
            operator=_operator(ctx),
            grace_s=grace,
            checkpoint_wait_s=checkpoint_wait,
            timeout_s=timeout,
            parallel=parallel,
            snapshot=snapshot,
            on_result=_progress,
        )
    finally:
        close()
    if document:
        emit_document(result.to_dict(), output)
    else:
        sys.stdout.write(render_result(result))
    raise typer.Exit(int(exit_for_apply(complete=result.complete)))


# --- building blocks (tests replace `build_loop`) ------------------------------------------


def build_loop(
    ctx: typer.Context, *, write: bool
) -> tuple[Reconciler, FleetSnapshot, Callable[[], None]]:
    """The store, the gatherer and the job runner over one SSH transport, as `gpuctl reconcile`
    has them; one gather of the fleet; and what closes them."""
    from gpuctl.cli import fleet

    parts = fleet.open_loop(ctx, write=write)
    try:
        snapshot = parts.gatherer.gather(parts.inventory)
    except BaseException:
        parts.close()
        raise
    return parts.loop, snapshot, parts.close


def _store(ctx: typer.Context) -> AbstractContextManager[Store]:
    from gpuctl.cli.fleet import open_state

    return open_state(ctx, write=True)


def _known(ctx: typer.Context, node: str) -> None:
    from gpuctl.cli import fleet

    fleet.select(fleet.load_inventory(ctx), [node])


def _operator(ctx: typer.Context) -> str:
    from gpuctl.ops.jobs import operator

    return operator(context.get(ctx).env)


def _clock() -> Clock:
    from gpuctl.adapters.clock import SystemClock

    return SystemClock()


def _ask(question: str) -> None:
    """On stderr; anything but y/yes (or the end of input) is no: exit 1, nothing changed."""
    sys.stderr.write(f"{safe(question)} [y/N]: ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):
        sys.stderr.write("\n")
    if answer.strip().lower() not in ("y", "yes"):
        sys.stderr.write("nothing changed\n")
        raise typer.Exit(int(ExitCode.ERROR))


def _ago(at: float) -> str:
    s = max(0.0, time.time() - at)
    return (
        f"{s:.0f}s ago"
        if s < 120
        else f"{s / 60:.0f}min ago"
        if s < 7200
        else f"{s / 3600:.0f}h ago"
    )


def _progress(result: MigrationResult) -> None:
    sys.stderr.write(safe(f"{result.job_id}: {result.outcome}: {result.message}") + "\n")
    sys.stderr.flush()


# --- rendering -----------------------------------------------------------------------------


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join(
        safe("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()) + "\n"
        for r in rows
    )


def render_plan(plan: DrainPlan) -> str:
    cordon = (
        "not cordoned yet"
        if plan.cordon is None
        else f"cordoned by {plan.cordon.operator} ({plan.cordon.source}): {plan.cordon.reason}"
    )
    head = f"drain {plan.node}: {plan.reason} ({cordon})\n"
    if not plan.moves:
        return safe(head) + "no jobs on the node\n"
    rows = [["JOB", "INC", "CARDS", "TO", "CARDS", "CHECKPOINT"]]
    for m in plan.moves:
        ckpt = "none"
        if m.checkpoint_step is not None:
            age = "" if m.checkpoint_age_s is None else f", {m.checkpoint_age_s:.0f}s old"
            ckpt = f"step {m.checkpoint_step}{age}"
        to = m.to_node or f"stays: {m.why_not}"
        cards = ",".join(str(c) for c in m.to_cards) or "-"
        rows.append(
            [m.job_id, str(m.incarnation), ",".join(str(c) for c in m.cards), to, cards, ckpt]
        )
    return safe(head) + _table(rows)


def render_result(result: DrainResult) -> str:
    rows = [["JOB", "OUTCOME", "WHAT"]]
    rows += [[r.job_id, r.outcome, r.message] for r in result.results]
    moved = sum(1 for r in result.results if r.moved)
    tail = f"{result.plan.node}: {moved} of {len(result.results)} job(s) moved; cordoned\n"
    return (_table(rows) if result.results else "") + safe(tail)


def register(app: typer.Typer) -> None:
    app.command("cordon")(cordon)
    app.command("uncordon")(uncordon)
    app.command("drain")(drain)
