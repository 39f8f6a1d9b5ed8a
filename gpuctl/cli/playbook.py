"""`gpuctl playbook check FILE` and `gpuctl playbook run FILE`: thin shells over
`gpuctl.config.playbook` and `gpuctl.ops.playbook`.

Exit status: 0 the playbook is valid / every step ran (failures within `max_fail_percentage`
included), or it is outside its window (nothing done); 1 a step failed beyond the threshold, the
window closed mid-run (resumable), or the question was answered no; 2 the playbook (or the
inventory, a job spec) is invalid; 6 the state refuses: another run holds the playbook's lock,
nothing to resume, an unreadable journal or store.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuctl.cli import context
from gpuctl.cli.confirm import answer
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.errors import UsageError, exit_for_playbook

if TYPE_CHECKING:
    from gpuctl.core.model import Inventory
    from gpuctl.core.playbook import TimeWindow
    from gpuctl.core.playbook.run import StepResult
    from gpuctl.ops.playbook import RunPlan, RunReport, Services

app = typer.Typer(help="Scripted runbooks: check and run playbooks.", no_args_is_help=True)
FILE = typer.Argument(..., metavar="FILE", help="A playbook file (YAML).")


@app.command("check")
def check(ctx: typer.Context, file: Path = FILE, output: Output = OUTPUT_OPTION) -> None:
    """Validate FILE (and, given an inventory, its targets against it). Exit 0 valid, 2 not."""
    from gpuctl.config.playbook import load_playbook
    from gpuctl.core.playbook import describe

    inventory = _inventory(ctx, required=False)
    playbook = load_playbook(file, inventory=inventory)
    if inventory is None:
        sys.stderr.write("note: no inventory given: targets not checked against one\n")
    steps = [
        {
            "step": s.index + 1,
            "kind": s.kind,
            "title": s.title,
            "action": describe(s),
            "when": None if s.when is None else s.when.text,
            "source": s.source,
        }
        for s in playbook.steps
    ]
    if output in (Output.JSON, Output.YAML):
        doc = {
            "file": str(file),
            "valid": True,
            "playbook": playbook.name,
            "targets_checked": inventory is not None,
            "steps": steps,
        }
        emit_document(doc, output)
        return
    lines = [f"{file}: ok: playbook {playbook.name}, {len(steps)} step(s)"]
    lines += [f"  {s['step']}. {s['title']}: {s['action']}" for s in steps]
    sys.stdout.write(safe("\n".join(lines)) + "\n")


@app.command("run")
def run(
    ctx: typer.Context,
    file: Path = FILE,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the full plan; touch nothing."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    resume: bool = typer.Option(
        False, "--resume", help="Resume the last run (an interrupted one resumes by itself)."
    ),
    window: str | None = typer.Option(
        None, "--window", help="Override the playbook's window: HH:MM-HH:MM, or always."
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Run FILE step by step: each step's result per node, every step an event in the store.
    Shows the plan and asks first (unless --yes). Exit 0 ok, 1 a step failed beyond
    max_fail_percentage, 2 invalid, 6 locked by another run or state refused."""
    from gpuctl.config.paths import state_dir
    from gpuctl.config.playbook import load_playbook
    from gpuctl.ops import playbook as service

    override, win = _window(window)
    playbook = load_playbook(file, inventory=_inventory(ctx, required=True))
    document = output in (Output.JSON, Output.YAML)
    services, close = build_services(ctx, write=not dry_run)
    try:
        app_ctx = context.get(ctx)
        folder = state_dir(app_ctx.env, app_ctx.state_dir)
        if dry_run:
            plan = service.plan_run(
                playbook, services, override_window=override, window=win, state_dir=folder
            )
            _show_plan(plan, output)
            sys.stderr.write("dry run: nothing changed\n")
            return
        report = service.run(
            playbook,
            services,
            state_dir=folder,
            resume=resume,
            override_window=override,
            window=win,
            confirm=None if yes else _confirm(document),
            on_step=None if document else _print_step,
            notice=_notice,
        )
    finally:
        close()
    _show_report(report, output)
    raise typer.Exit(int(exit_for_playbook(report.outcome)))


def _window(text: str | None) -> tuple[bool, TimeWindow | None]:
    """`--window` as (override the playbook's window?, the window; None: any time)."""
    from gpuctl.config.playbook import parse_window

    if text is None:
        return False, None
    try:
        return True, parse_window(text)
    except ValueError as exc:
        raise UsageError(f"--window {exc}") from None


def _inventory(ctx: typer.Context, *, required: bool) -> Inventory | None:
    """The inventory with its Slurm cluster's nodes (`cli.fleet.load_inventory`)."""
    from gpuctl.cli import fleet

    app_ctx = context.get(ctx)
    if not required and app_ctx.inventory_path is None and not app_ctx.env.get("GPUCTL_INVENTORY"):
        return None
    return fleet.load_inventory(ctx)


def build_services(ctx: typer.Context, *, write: bool) -> tuple[Services, Callable[[], None]]:
    """The store (read-only for a dry run: nothing is created), the gatherer, the job runner and
    the transport, as `gpuctl reconcile` has them (`gpuctl.ops.compose.Root.playbook`); and
    what closes them."""
    from gpuctl.cli import fleet

    return context.root(ctx).playbook(fleet.load_inventory(ctx), write=write)


def _confirm(document: bool) -> Callable[[RunPlan], bool]:
    def ask(plan: RunPlan) -> bool:
        (sys.stderr if document else sys.stdout).write(render_plan(plan))
        sys.stdout.flush()
        if answer(f"run playbook {plan.playbook} as planned?"):
            return True
        sys.stderr.write("nothing changed\n")
        return False

    return ask


def _show_plan(plan: RunPlan, output: Output) -> None:
    if output in (Output.JSON, Output.YAML):
        emit_document({"dry_run": True, "plan": plan.to_dict()}, output)
    else:
        sys.stdout.write(render_plan(plan))


def _show_report(report: RunReport, output: Output) -> None:
    if output in (Output.JSON, Output.YAML):
        emit_document(report.to_dict(), output)
        return
    resumed = " (resumed)" if report.resumed else ""
    line = f"playbook {report.playbook}{resumed}: {report.outcome}: {report.message}"
    sys.stdout.write(safe(line) + "\n")


def _notice(text: str) -> None:
    sys.stderr.write(safe(text) + "\n")


def _print_step(result: StepResult) -> None:
    sys.stdout.write(render_step(result))
    sys.stdout.flush()


def render_step(r: StepResult) -> str:
    lines = [f"[{r.key}] {r.title}: {r.outcome}: {r.message}"]
    width = max((len(n.node) for n in r.nodes), default=0)
    lines += [f"    {n.node.ljust(width)}  {n.outcome:<8} {n.message}" for n in r.nodes]
    return safe("\n".join(lines)) + "\n"


def render_plan(plan: RunPlan) -> str:
    from gpuctl.config.hostlist import fold

    head = f"playbook {plan.playbook} ({plan.source})"
    if plan.description:
        head += f": {plan.description.strip().splitlines()[0]}"
    sizes = "/".join(str(len(b)) for b in plan.batches)
    window = "any time" if plan.window is None else plan.window
    where = "inside" if plan.inside_window else "OUTSIDE: the run would do nothing"
    lines = [head]
    if plan.resumes is not None:
        lines.append(f"resumes the interrupted run {plan.resumes}: the steps it did are skipped")
    lines += [
        f"targets: {fold(plan.targets) or 'none'} (batches of {sizes})",
        f"window: {window} ({where}) · max_fail_percentage {plan.max_fail_percentage:g}%",
    ]
    for s in plan.steps:
        done = f" [done earlier: {s.done}, skipped]" if s.done else ""
        lines.append(f"[{s.key}] {s.title}: {s.action}{done}")
        if s.when is not None:
            lines.append(f"    when (now): {s.when}")
        lines += [f"    - {d}" for d in s.detail]
    lines.append("(each step is planned on the fleet as it is now; earlier steps may change it)")
    return safe("\n".join(lines)) + "\n"


__all__ = ["app", "build_services", "render_plan", "render_step"]
