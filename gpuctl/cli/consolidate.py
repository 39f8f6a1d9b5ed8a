"""`gpuctl consolidate`: migrations that free whole cards and nodes; `--apply` runs them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import typer

from gpuctl.cli import context
from gpuctl.cli.confirm import ask
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.errors import UsageError, exit_for_apply, exit_for_plan

if TYPE_CHECKING:
    from gpuctl.core.consolidation import ConsolidationPlan
    from gpuctl.core.placement.model import JobRequest
    from gpuctl.ops.moves.consolidate import ApplyResult, Window


def consolidate(
    ctx: typer.Context,
    max_moves: int = typer.Option(10, "--max-moves", help="Most migrations in the plan."),
    window: str | None = typer.Option(
        None, "--window", help="Apply only inside HH:MM-HH:MM local time (may wrap midnight)."
    ),
    for_job: Path | None = typer.Option(
        None, "--for", metavar="JOB.yaml", help="Make room for this job with the fewest moves."
    ),
    apply: bool = typer.Option(False, "--apply", help="Carry the plan out (asks first)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan; change nothing."),
    parallel: int = typer.Option(1, "--parallel", help="Migrations at once, when independent."),
    snapshot: Path | None = typer.Option(
        None, "--snapshot", help="Plan on a saved `gpuctl status -o json` (not with --apply)."
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Plan migrations (checkpoint, stop, restart elsewhere) that free whole cards and nodes:
    which jobs move from which cards to which, what it frees and what it costs. Nothing moves
    without --apply; --apply runs the plan only if the fleet is still the one it was made for.

    Exit 0: planned, or applied in full. 1: refused (stale plan, outside --window).
    2: bad options. 3: --for cannot be made to fit, or --apply left moves undone.
    6: the store refuses.
    """
    from gpuctl.ops.moves.consolidate import Window

    if max_moves < 0 or parallel < 1:
        raise UsageError("--max-moves must be 0 or more and --parallel 1 or more")
    win = Window.parse(window) if window is not None else None
    target = _target(for_job) if for_job is not None else None
    if apply and not dry_run and snapshot is not None:
        raise UsageError("--apply works on the live fleet, not on a --snapshot")
    if apply and not dry_run:
        _apply(ctx, max_moves, target, win, yes, parallel, output)
        return
    plan = _plan_only(ctx, snapshot, max_moves, target)
    _show(plan, output)
    if apply:  # --apply --dry-run
        sys.stderr.write("dry run: nothing changed\n")
        if win is not None and not win.contains(context.root(ctx).minute_of_day()):
            sys.stderr.write(f"note: outside the window {win.text}, --apply would refuse\n")
    _exit_for(plan)


def _target(path: Path) -> JobRequest:
    from gpuctl.config.jobspec_files import load_job_specs

    requests = load_job_specs([path])
    if len(requests) != 1:
        raise UsageError(f"{path}: --for takes one job, the file has {len(requests)}")
    return requests[0]


def _plan_only(
    ctx: typer.Context, snapshot: Path | None, max_moves: int, target: JobRequest | None
) -> ConsolidationPlan:
    """The plan alone, on a saved snapshot or a gather with a progress bar (no inventory is
    needed for a saved snapshot)."""
    from gpuctl.cli import fleet
    from gpuctl.ops.moves import consolidate as service
    from gpuctl.ops.place import load_snapshot

    snap = (
        load_snapshot(snapshot) if snapshot else fleet.gather(ctx, fleet.load_inventory(ctx).nodes)
    )
    root = context.root(ctx)
    with root.store(write=False) as store:
        now = root.clock.now()
        inputs = service.gather_inputs(snap, store, now)
        return service.plan(inputs, now=now, max_moves=max_moves, target=target)


def _apply(
    ctx: typer.Context,
    max_moves: int,
    target: JobRequest | None,
    win: Window | None,
    yes: bool,
    parallel: int,
    output: Output,
) -> None:
    """Plan on a fresh gather, show the plan, ask, then carry it out through the actions
    service (`gpuctl.ops.actions`, as the dashboard's `x`)."""
    from gpuctl.cli import fleet
    from gpuctl.ops.moves import consolidate as service

    document = output in (Output.JSON, Output.YAML)
    with context.root(ctx).actions(fleet.load_inventory(ctx)) as actions:
        planned = actions.plan_consolidation(
            max_moves=max_moves, target=target, window=win, parallel=parallel
        )
        plan: ConsolidationPlan = planned.value.plan
        # the plan before the question: stdout as a table, stderr when stdout is a document
        _show(plan, Output.TABLE, stream=sys.stderr if document else sys.stdout)
        if plan.empty:
            if document:
                emit_document(service.ApplyResult(plan, ()).to_dict(), output)
            _exit_for(plan)
        service.check_window(win, actions.minute_of_day())
        if not yes:
            ask(f"move {len(plan.moves)} job(s) as planned?")
        done = actions.carry_out(planned, _progress)
    result: ApplyResult = done.value
    if document:
        emit_document(result.to_dict(), output)
    else:
        sys.stdout.write(safe(render_result(result)))
    raise typer.Exit(int(exit_for_apply(complete=done.complete)))


def _show(plan: ConsolidationPlan, output: Output, stream: TextIO | None = None) -> None:
    from gpuctl.cli import plan_view
    from gpuctl.core.consolidation import plan_to_dict

    if output in (Output.JSON, Output.YAML):
        emit_document(plan_to_dict(plan), output)
        return
    out = sys.stdout if stream is None else stream
    width = plan_view.width_of(out)
    out.write(plan_view.consolidation_text(plan, width, color=width is not None))


def _exit_for(plan: ConsolidationPlan) -> None:
    raise typer.Exit(int(exit_for_plan(complete=plan.target is None or plan.target.fits)))


def _progress(line: str) -> None:
    """Each move's outcome as it comes, on stderr."""
    sys.stderr.write(safe(line) + "\n")
    sys.stderr.flush()


def render_result(result: ApplyResult) -> str:
    lines = [f"{r.job}: {r.outcome}: {r.message}" for r in result.results]
    done = sum(1 for r in result.results if r.outcome in ("moved", "elsewhere"))
    lines.append(f"{done} of {len(result.plan.moves)} move(s) done")
    return "\n".join(lines) + "\n"


def register(app: typer.Typer) -> None:
    app.command("consolidate")(consolidate)
