"""`gpuctl cordon`, `gpuctl uncordon`, `gpuctl drain`: thin shells over the plan-then-apply actions
of `gpuctl.ops.actions` (the dashboard's keys call the same).

Each takes several nodes (names, hostlist ranges, `-l` label selectors: `cli.fleet.select`),
shows one plan for all of them and asks once (`gpuctl.cli.confirm`; `--yes` for scripts). The
operator recorded with every cordon and drain is $USER. Exit status: 0 done (drain: every job on
the nodes moved, or none was there); 3 a drain left jobs on a node (no room, timed out, rolled
back: each says why; the node stays cordoned), or a node could not be cordoned or uncordoned;
1 the question was answered no (nothing changed), or an unexpected error; 2 bad input (unknown
node, a selector matching none, bad options), or no answer to the question (no terminal and no
--yes: nothing changed); 6 the state store refuses, or another gpuctl held
the loop lock too long.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from gpuctl.cli import context
from gpuctl.cli.confirm import ask
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.config.hostlist import fold
from gpuctl.core.timefmt import ago
from gpuctl.errors import UsageError, exit_for_apply

if TYPE_CHECKING:
    from gpuctl.core.model import Inventory
    from gpuctl.ops.action_plans import Applied
    from gpuctl.ops.actions import NodeBatch, NodeOutcome
    from gpuctl.ops.moves.nodeops import DrainPlan, DrainResult


NODES_ARG = typer.Argument(
    None,
    metavar="[NODE]...",
    help="Inventory nodes: names and hostlist ranges (gpu[01-04,07], rack[1-2]-gpu[01-04]).",
    show_default=False,
)
SELECTOR = typer.Option(
    None,
    "--selector",
    "-l",
    help="Only nodes whose inventory labels match: pool=train,zone!=b (key, !key too).",
    metavar="SELECTOR",
    show_default=False,
)


def cordon(
    ctx: typer.Context,
    nodes: list[str] | None = NODES_ARG,
    reason: str = typer.Option(..., "--reason", help="Why (recorded with the cordon)."),
    selector: str | None = SELECTOR,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Place no new work on the nodes; the jobs running there stay. Exit 0 when each is
    cordoned, 3 when some could not be."""
    inventory, names = _chosen(ctx, nodes, selector)
    with context.root(ctx).actions(inventory, moves=False) as actions:
        plan = actions.plan_nodes("cordon", names, reason)
        if not yes:
            many = "" if len(names) == 1 else f"{len(names)} nodes; "
            ask(f"cordon {plan.target} ({many}no new work lands there; running jobs stay)?")
        done = actions.carry_out(plan)
    _said(done, output)


def uncordon(
    ctx: typer.Context,
    nodes: list[str] | None = NODES_ARG,
    selector: str | None = SELECTOR,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Let the nodes take new work again (whoever cordoned them). Exit 0 when none is cordoned
    any more, 3 when some could not be uncordoned."""
    inventory, names = _chosen(ctx, nodes, selector)
    with context.root(ctx).actions(inventory, moves=False) as actions:
        plan = actions.plan_nodes("uncordon", names)
        batch: NodeBatch = plan.value
        if not plan.applicable:
            sys.stderr.write(safe(plan.text) + "\n")
            if output in (Output.JSON, Output.YAML):
                emit_document({"action": "uncordon", "complete": True, "nodes": []}, output)
            return
        if not yes:
            if len(names) == 1:
                there = batch.cordons[0]
                ask(
                    f"uncordon {names[0]} (cordoned {ago(there.at, actions.clock.now())} by "
                    f"{there.operator}, source {there.source}: {there.reason})?"
                )
            else:
                sys.stderr.write(safe(plan.text) + "\n")
                ask(f"uncordon {fold(batch.nodes)} ({len(batch.nodes)} cordon(s) lifted)?")
        done = actions.carry_out(plan)
    _said(done, output, each=True)


def drain(
    ctx: typer.Context,
    nodes: list[str] | None = NODES_ARG,
    reason: str = typer.Option(..., "--reason", help="Why (recorded with the cordon)."),
    selector: str | None = SELECTOR,
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
    """Cordon the nodes, then move each job off them: checkpoint (SIGUSR1) -> stop (SIGTERM, the
    grace, SIGKILL) -> start on a target reserved first, from the newest committed checkpoint.
    Several nodes: one plan for all (no job moves onto another node being drained), one
    question, then node by node.

    Exit 0 when every job moved; 3 when some stay (each with the reason, per node).
    """
    if (grace is not None and grace < 0) or (checkpoint_wait is not None and checkpoint_wait < 0):
        raise UsageError("--grace and --checkpoint-wait are never negative")
    if timeout <= 0 or parallel < 1:
        raise UsageError("--timeout must be positive and --parallel 1 or more")
    inventory, names = _chosen(ctx, nodes, selector)
    document = output in (Output.JSON, Output.YAML)
    with context.root(ctx).actions(inventory) as actions:
        plan = actions.plan_nodes(
            "drain",
            names,
            reason,
            grace_s=grace,
            checkpoint_wait_s=checkpoint_wait,
            timeout_s=timeout,
            parallel=parallel,
        )
        plans: list[DrainPlan] = [o.plan for o in plan.value.drains]
        if dry_run:
            if document:
                doc: dict[str, Any] = {"dry_run": True, "plans": [p.to_dict() for p in plans]}
                if len(plans) == 1:
                    doc["plan"] = plans[0].to_dict()
                emit_document(doc, output)
            else:
                sys.stdout.write(safe(plan.text) + "\n")
            sys.stderr.write("dry run: nothing changed\n")
            return
        # the plan before the question: on stdout as a table, on stderr when stdout is a document
        (sys.stderr if document else sys.stdout).write(safe(plan.text) + "\n")
        if not yes:
            movable = sum(len(p.movable) for p in plans)
            them = "it" if len(names) == 1 else f"them ({len(names)} nodes)"
            ask(f"cordon {plan.target} and move {movable} job(s) off {them}?")
        done = actions.carry_out(plan, _progress)
    outcomes: tuple[NodeOutcome, ...] = done.value
    if document:
        emit_document(drain_document(outcomes, done.complete), output)
    else:
        sys.stdout.write(render_outcomes(outcomes, done.message))
    raise typer.Exit(int(exit_for_apply(complete=done.complete)))


# --- building blocks -----------------------------------------------------------------------


def _chosen(
    ctx: typer.Context, nodes: list[str] | None, selector: str | None
) -> tuple[Inventory, list[str]]:
    """The inventory and the nodes the arguments pick (names, ranges, a label selector); a
    usage error when there are none, or when nothing names a node at all."""
    from gpuctl.cli import fleet

    if not nodes and selector is None:
        raise UsageError(
            "name the nodes: NODE..., a range such as gpu[01-04], or -l key=value",
            hint="see `gpuctl inventory list`",
        )
    inventory = fleet.load_inventory(ctx)
    return inventory, [n.name for n in fleet.select(inventory, nodes or [], selector)]


def _said(done: Applied, output: Output, *, each: bool = False) -> None:
    """Cordon's and uncordon's result: one line (each node's with `each`), or every node's
    outcome as a document; exit 3 when a node failed."""
    outcomes: tuple[NodeOutcome, ...] = done.value
    if output in (Output.JSON, Output.YAML):
        emit_document({"complete": done.complete, "nodes": [o.to_dict() for o in outcomes]}, output)
    elif each and len(outcomes) > 1:
        sys.stdout.write("".join(safe(o.message) + "\n" for o in outcomes if o.ok))
    elif done.message:
        sys.stdout.write(safe(done.message) + "\n")
    for o in outcomes:
        if not o.ok:
            sys.stderr.write(f"{safe(o.node)}: {o.outcome}: {safe(o.message)}\n")
    if not done.complete:
        raise typer.Exit(int(exit_for_apply(complete=False)))


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


def render_outcomes(outcomes: tuple[NodeOutcome, ...], said: str) -> str:
    """Each job's outcome (with its node when there are several), the nodes that failed, then
    what the drain did (`said`)."""
    many = len(outcomes) > 1
    rows = [["NODE", "JOB", "OUTCOME", "WHAT"] if many else ["JOB", "OUTCOME", "WHAT"]]
    failed = []
    for o in outcomes:
        if o.drain is None:
            failed.append(f"{o.node}: failed: {o.message}")
            continue
        for r in o.drain.results:
            rows.append(
                [o.node, r.job_id, r.outcome, r.message]
                if many
                else [r.job_id, r.outcome, r.message]
            )
    table = _table(rows) if len(rows) > 1 else ""
    return table + "".join(safe(f) + "\n" for f in failed) + safe(said) + "\n"


def drain_document(outcomes: tuple[NodeOutcome, ...], complete: bool) -> dict[str, Any]:
    """Every node's outcome (`nodes`), and the totals; with one node its drain's fields at the
    top too (`node`, `cordon`, `results`, `plan`), as before several nodes could be drained."""
    drains = [o.drain for o in outcomes if o.drain is not None]
    doc: dict[str, Any] = {
        "node": fold(o.node for o in outcomes),
        "complete": complete,
        "moved": sum(1 for d in drains for r in d.results if r.moved),
        "jobs": sum(len(d.plan.moves) for d in drains),
        "results": [r.to_dict() for d in drains for r in d.results],
        "nodes": [o.to_dict() for o in outcomes],
    }
    if len(outcomes) == 1 and drains:
        doc.update({"cordon": drains[0].to_dict()["cordon"], "plan": drains[0].plan.to_dict()})
    return doc


def register(app: typer.Typer) -> None:
    app.command("cordon")(cordon)
    app.command("uncordon")(uncordon)
    app.command("drain")(drain)
