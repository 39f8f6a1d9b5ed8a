"""`gpuctl cordon`, `gpuctl uncordon`, `gpuctl drain`: thin shells over the plan-then-apply actions
of `gpuctl.ops.actions` (the dashboard's keys call the same).

Each shows what it is about to do and asks (`gpuctl.cli.confirm`; `--yes` for scripts). The
operator recorded with every cordon and drain is $USER. Exit status: 0 done (drain: every job on
the node moved, or none was there); 3 a drain left jobs on the node (no room, timed out, rolled
back: each says why; the node stays cordoned); 1 the question was answered no (nothing changed),
or an unexpected error; 2 bad input (unknown node, bad options), or no answer to the question
(no terminal and no --yes: nothing changed); 6 the state store refuses, or another gpuctl held
the loop lock too long.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from gpuctl.cli import context
from gpuctl.cli.confirm import ask
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.errors import UsageError, exit_for_apply

if TYPE_CHECKING:
    from gpuctl.core.model import Inventory
    from gpuctl.ops.moves.nodeops import DrainPlan, DrainResult


def cordon(
    ctx: typer.Context,
    node: str = typer.Argument(..., metavar="NODE", help="An inventory node."),
    reason: str = typer.Option(..., "--reason", help="Why (recorded with the cordon)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
) -> None:
    """Place no new work on NODE; the jobs running there stay. Exit 0 when cordoned."""
    inventory = _known(ctx, node)
    with context.root(ctx).actions(inventory, moves=False) as actions:
        plan = actions.plan_cordon(node, reason)
        if not yes:
            ask(f"cordon {node} (no new work lands there; running jobs stay)?")
        done = actions.carry_out(plan)
    sys.stdout.write(safe(done.message) + "\n")


def uncordon(
    ctx: typer.Context,
    node: str = typer.Argument(..., metavar="NODE", help="An inventory node."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
) -> None:
    """Let NODE take new work again (whoever cordoned it). Exit 0 when it is not cordoned."""
    inventory = _known(ctx, node)
    with context.root(ctx).actions(inventory, moves=False) as actions:
        plan = actions.plan_uncordon(node)
        there = plan.value
        if there is None:
            sys.stderr.write(safe(plan.text) + "\n")
            return
        if not yes:
            ask(
                f"uncordon {node} (cordoned {_ago(there.at, actions.clock.now())} by "
                f"{there.operator}, source {there.source}: {there.reason})?"
            )
        done = actions.carry_out(plan)
    sys.stdout.write(safe(done.message) + "\n")


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
    if (grace is not None and grace < 0) or (checkpoint_wait is not None and checkpoint_wait < 0):
        raise UsageError("--grace and --checkpoint-wait are never negative")
    if timeout <= 0 or parallel < 1:
        raise UsageError("--timeout must be positive and --parallel 1 or more")
    inventory = _known(ctx, node)
    document = output in (Output.JSON, Output.YAML)
    with context.root(ctx).actions(inventory) as actions:
        plan = actions.plan_drain(
            node,
            reason,
            grace_s=grace,
            checkpoint_wait_s=checkpoint_wait,
            timeout_s=timeout,
            parallel=parallel,
        )
        drain_plan: DrainPlan = plan.value.plan
        if dry_run:
            if document:
                emit_document({"dry_run": True, "plan": drain_plan.to_dict()}, output)
            else:
                sys.stdout.write(safe(plan.text) + "\n")
            sys.stderr.write("dry run: nothing changed\n")
            return
        # the plan before the question: on stdout as a table, on stderr when stdout is a document
        (sys.stderr if document else sys.stdout).write(safe(plan.text) + "\n")
        if not yes:
            ask(f"cordon {node} and move {len(drain_plan.movable)} job(s) off it?")
        done = actions.carry_out(plan, _progress)
    result: DrainResult = done.value
    if document:
        emit_document(result.to_dict(), output)
    else:
        sys.stdout.write(render_result(result, done.message))
    raise typer.Exit(int(exit_for_apply(complete=done.complete)))


# --- building blocks -----------------------------------------------------------------------


def _known(ctx: typer.Context, node: str) -> Inventory:
    """The inventory, which must name `node` (else a usage error naming it)."""
    from gpuctl.cli import fleet

    inventory = fleet.load_inventory(ctx)
    fleet.select(inventory, [node])
    return inventory


def _ago(at: float, now: float) -> str:
    s = max(0.0, now - at)
    return (
        f"{s:.0f}s ago"
        if s < 120
        else f"{s / 60:.0f}min ago"
        if s < 7200
        else f"{s / 3600:.0f}h ago"
    )


def _progress(line: str) -> None:
    """Each job's outcome as it comes, on stderr."""
    sys.stderr.write(safe(line) + "\n")
    sys.stderr.flush()


# --- rendering -----------------------------------------------------------------------------


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join(
        safe("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()) + "\n"
        for r in rows
    )


def render_result(result: DrainResult, said: str) -> str:
    """Each job's outcome, then what the drain did (`said`)."""
    rows = [["JOB", "OUTCOME", "WHAT"]]
    rows += [[r.job_id, r.outcome, r.message] for r in result.results]
    return (_table(rows) if result.results else "") + safe(said) + "\n"


def register(app: typer.Typer) -> None:
    app.command("cordon")(cordon)
    app.command("uncordon")(uncordon)
    app.command("drain")(drain)
