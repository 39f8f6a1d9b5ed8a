"""`gpuctl submit`, `gpuctl jobs list|show`, `gpuctl logs`, `gpuctl cancel`: thin shells over
`gpuctl.ops.jobs`. Mutating commands open the store for writing (a store that cannot be trusted
refuses: exit 6, hint `gpuctl db check`)."""

from __future__ import annotations

import codecs
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpuctl.adapters.clock import local_stamp
from gpuctl.cli import context
from gpuctl.cli.confirm import ask
from gpuctl.cli.fleet import open_state
from gpuctl.cli.fleet_view import print_table
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.cli.table_fit import FREE, KEY, Col, FitTable
from gpuctl.core.timefmt import ago, duration

if TYPE_CHECKING:
    from gpuctl.core.model import Inventory
    from gpuctl.ops.jobs import JobDetail, JobView

app = typer.Typer(help="Submitted jobs: list them, show one.", no_args_is_help=True)


def submit(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(..., metavar="JOB.yaml", help="Job spec files."),
    replace: bool = typer.Option(
        False, "--replace", help="Cancel an active job of the same name first."
    ),
    queue_anyway: bool = typer.Option(
        False,
        "--queue-anyway",
        help="Queue a job even if no node of the inventory could ever take it (no poll).",
    ),
    backend: str = typer.Option(
        "gpuctl",
        "--backend",
        metavar="gpuctl|slurm",
        help="Who runs the jobs: gpuctl's control loop, or slurm: sbatch on the node gpuctl "
        "places it on, tracked by gpuctl (docs/slurm.md).",
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Queue the jobs in JOB.yaml...; `gpuctl reconcile` places and launches them.

    Every file is checked first (exit 2 on a bad spec or a missing secret); nothing is queued
    unless all of them are good. With an inventory (-i / GPUCTL_INVENTORY) the fleet is polled
    and a job no node could ever take, even empty, is refused (exit 2) unless --queue-anyway.
    With --backend slurm each job goes to Slurm at once (sbatch, with `place --emit sbatch`'s
    options), e.g. gpuctl submit --backend slurm train.yaml
    """
    from gpuctl.cli import slurm_jobs
    from gpuctl.config.jobspec_files import load_specs
    from gpuctl.errors import UsageError
    from gpuctl.ops import jobs as service

    if backend not in slurm_jobs.BACKENDS:
        raise UsageError(f"--backend: unknown backend {backend!r}", hint="known: gpuctl, slurm")
    specs = load_specs(files, require_command=True)
    if backend == "slurm":
        slurm_jobs.submit(ctx, specs, output)
        return
    app_ctx = context.get(ctx)
    unchecked = None if queue_anyway else _check_fit(ctx, specs)
    with open_state(ctx, write=True) as store:
        actor = service.operator(app_ctx.env)
        clock = app_ctx.clock
        added = service.submit(
            store, specs, actor=actor, clock=clock, env=app_ctx.env, replace=replace
        )
        ids = {j.id for j in added}
        views = [v for v in service.list_jobs(store, include_done=True) if v.job.id in ids]
    if unchecked is not None:
        sys.stderr.write(safe(unchecked) + "\n")
    if output in (Output.JSON, Output.YAML):
        emit_document([service.job_summary(v, time.time()) for v in views], output)
        return
    for job in added:
        sys.stdout.write(f"submitted {job.id} ({job.tier}, priority {job.priority})\n")


def _check_fit(ctx: typer.Context, specs: Any) -> str | None:
    """Refuse a job no node could ever take; what the check could not tell, for stderr."""
    from gpuctl.ops.jobs.fit import check_fit
    from gpuctl.ops.place import gather_snapshot

    app_ctx = context.get(ctx)
    if not _has_inventory(app_ctx):
        return "no inventory given: whether the jobs could ever fit was not checked"
    inventory = _inventory(ctx)
    checked = check_fit(
        specs, gather_snapshot(inventory, transport_factory=app_ctx.transport_factory)
    )
    if checked.refused is not None:
        raise checked.refused
    return checked.note


def _inventory(ctx: typer.Context) -> Inventory:
    """The inventory, with its Slurm cluster's nodes (`cli.fleet.load_inventory`)."""
    from gpuctl.cli import fleet

    return fleet.load_inventory(ctx)


@app.command("list")
def list_cmd(
    ctx: typer.Context,
    all_jobs: bool = typer.Option(False, "--all", "-a", help="Finished jobs too."),
    mine: bool = typer.Option(
        False, "--mine", help="Only the jobs you submitted (your user name, as the events say)."
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Jobs that are queued, running or held (with --all: every job), oldest first, with who
    submitted each (OWNER).

    Example: gpuctl jobs list --mine -o json"""
    from gpuctl.ops import jobs as service

    owner = context.root(ctx).operator if mine else None
    with open_state(ctx, write=False) as store:
        views = service.list_jobs(store, include_done=all_jobs, owner=owner)
        whys = _waiting(ctx, store, views) if output not in (Output.JSON, Output.YAML) else {}
    now = time.time()
    if output in (Output.JSON, Output.YAML):
        emit_document([service.job_summary(v, now) for v in views], output)
        return
    listed = render_list(views, now, wide=output is Output.WIDE, whys=whys)
    if isinstance(listed, str):
        sys.stdout.write(listed)
    else:
        print_table(listed)


@app.command("show")
def show_cmd(
    ctx: typer.Context,
    job: str = typer.Argument(..., metavar="JOB", help="Job id, or name (the newest of it)."),
    output: Output = OUTPUT_OPTION,
) -> None:
    """One job: state, node and cards, incarnation, newest checkpoint, history, recent events."""
    from gpuctl.ops import jobs as service

    with open_state(ctx, write=False) as store:
        detail = service.show_job(store, job)
        text = output not in (Output.JSON, Output.YAML)
        whys = _waiting(ctx, store, [detail.view]) if text else {}
    now = time.time()
    if output in (Output.JSON, Output.YAML):
        emit_document(service.job_document(detail, now), output)
        return
    sys.stdout.write(safe(render_detail(detail, now, why=whys.get(detail.view.job.id))))


def _waiting(ctx: typer.Context, store: Any, views: list[JobView]) -> dict[str, str]:
    """Why each queued job waits, as the dashboard's queue says it (the placement plan on a poll
    of the inventory, with what the store holds); nothing without an inventory or a queued job."""
    from gpuctl.core.jobs.model import JobState
    from gpuctl.core.placement.model import Settings
    from gpuctl.ops import fleetstatus
    from gpuctl.ops.dashboard import waiting_reasons
    from gpuctl.ops.jobs import list_jobs
    from gpuctl.ops.place import gather_snapshot

    app_ctx = context.get(ctx)
    if not _has_inventory(app_ctx) or all(v.job.state is not JobState.QUEUED for v in views):
        return {}
    every = list_jobs(store)  # what the queue is ordered among
    snapshot = gather_snapshot(_inventory(ctx), transport_factory=app_ctx.transport_factory)
    state = fleetstatus.fleet_state(snapshot, store, versioned=False)
    whys = waiting_reasons(state, every, Settings())
    # a job Slurm runs waits for Slurm: its stored reason is Slurm's, as the loop last read it
    return {
        v.job.id: whys[v.job.id] for v in views if v.job.id in whys and v.job.spec.backend is None
    }


def _has_inventory(app_ctx: context.AppContext) -> bool:
    return app_ctx.inventory_path is not None or bool(app_ctx.env.get("GPUCTL_INVENTORY"))


def logs(
    ctx: typer.Context,
    job: str = typer.Argument(..., metavar="JOB", help="Job id, or name (the newest of it)."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep reading, across restarts, until the job ends."
    ),
    incarnation: int | None = typer.Option(
        None, "--incarnation", min=1, help="An earlier incarnation's log (default: the current)."
    ),
) -> None:
    """The job's output (stdout and stderr) from its node. Notes go to stderr. A job Slurm
    runs: its output file, read where the Slurm commands run (a shared file system)."""
    from gpuctl.cli import slurm_jobs
    from gpuctl.ops import jobs as service

    with open_state(ctx, write=False) as store:
        found = service.find_job(store, job)
    if found.spec.backend is not None:
        slurm_jobs.logs(ctx, found, follow)
        return
    app_ctx = context.get(ctx)
    inventory = _inventory(ctx)
    runner, transport = _runner(app_ctx)
    decoders: dict[int, Any] = {}
    try:
        with open_state(ctx, write=False) as store:
            chunks = service.read_logs(
                store, runner, inventory, job, follow=follow, incarnation=incarnation
            )
            for chunk in chunks:
                if chunk.note is not None:
                    sys.stdout.flush()
                    sys.stderr.write(f"[gpuctl] {safe(chunk.note)}\n")
                    sys.stderr.flush()
                    continue
                decoder = decoders.setdefault(
                    chunk.incarnation, codecs.getincrementaldecoder("utf-8")("replace")
                )
                sys.stdout.write(safe(decoder.decode(chunk.data)))
                sys.stdout.flush()
    finally:
        transport.close()


def _runner(app_ctx: context.AppContext) -> tuple[Any, Any]:
    from gpuctl.adapters.node import SshJobRunner
    from gpuctl.ops.gather import default_transport

    factory = app_ctx.transport_factory
    transport = factory() if factory is not None else default_transport()
    return SshJobRunner(transport), transport


def cancel(
    ctx: typer.Context,
    job: str = typer.Argument(..., metavar="JOB", help="Job id, or name (the newest of it)."),
    force: bool = typer.Option(False, "--force", help="KILL at once, without the grace."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Cancel a job: a waiting job at once; a running one is stopped by the control loop
    (SIGTERM, then KILL after the job's grace_s; --force: KILL at once). A job Slurm runs:
    scancel."""
    from gpuctl.cli import slurm_jobs
    from gpuctl.ops import jobs as service

    app_ctx = context.get(ctx)
    with open_state(ctx, write=True) as store:
        found = service.find_job(store, job)
        if not yes:
            ask(f"cancel {found.id} ({found.state})?")
        if found.spec.backend is not None:
            slurm_jobs.cancel(ctx, store, found, output)
            return
        done = service.cancel(
            store, found.id, actor=service.operator(app_ctx.env), clock=app_ctx.clock, force=force
        )
        view = next(v for v in service.list_jobs(store, include_done=True) if v.job.id == done.id)
    if output in (Output.JSON, Output.YAML):
        emit_document(service.job_summary(view, time.time()), output)
        return
    if done.state.terminal:
        sys.stdout.write(f"{done.id} {done.state}\n")
    else:
        how = "KILL at once" if force else "SIGTERM, then KILL after the grace"
        sys.stdout.write(f"{done.id}: cancel requested; the control loop stops it ({how})\n")


# --- rendering --------------------------------------------------------------------------------


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )


# IDs and node names whole; REASON folds in what is left; when too narrow TIER goes first, then
# INC, PRI, CARDS, AGE, OWNER, CHECKPOINT, and NAME (the ID holds it) last
LIST_COLUMNS = (
    Col("ID", KEY),
    Col("NAME", KEY, drop=1),
    Col("OWNER", drop=3),
    Col("STATE"),
    Col("TIER", drop=8),
    Col("PRI", drop=6),
    Col("NODE", KEY),
    Col("CARDS", drop=5),
    Col("INC", drop=7),
    Col("CHECKPOINT", drop=2),
    Col("AGE", drop=4),
)


def render_list(
    views: list[JobView],
    now: float,
    *,
    wide: bool = False,
    whys: Mapping[str, str] | None = None,
) -> FitTable | str:
    """`whys`: why each queued job waits (`_waiting`); else the job's stored reason."""
    from gpuctl.ops.jobs import placed

    if not views:
        return "no jobs\n"
    extra = [Col("WAITED", drop=10), Col("RESTARTS", drop=9)] if wide else []
    extra.append(Col("REASON", FREE))
    if wide:
        extra.append(Col("COMMAND", FREE, drop=11))
    table = FitTable([*LIST_COLUMNS, *extra])
    for v in views:
        job, inc, ckpt = v.job, placed(v), v.checkpoint
        cancelling = job.cancel_requested and not job.state.terminal
        state = job.state.value + (" (cancelling)" if cancelling else "")
        step = "-" if ckpt is None else f"{ckpt.step} ({ago(ckpt.committed_at, now)})"
        row = [job.id, job.name, job.owner or "-", state, job.tier, str(job.priority)]
        row += ["-" if inc is None else inc.node, _cards(inc), str(job.incarnation), step]
        row.append(duration(now - job.submitted_at))
        reason = (whys or {}).get(job.id) or job.reason or "-"
        if wide:
            row += [duration(_waited(job)), str(job.restarts), reason]
            row.append(" ".join(job.spec.command))
        else:
            row.append(reason)
        table.add_row(*(safe(cell) for cell in row))
    return table


def _waited(job: Any) -> float | None:
    return None if job.first_started_at is None else job.first_started_at - job.submitted_at


def _waited_text(job: Any, now: float) -> str:
    waited = _waited(job)
    if waited is None and not job.state.terminal:
        return f"waiting {duration(now - job.submitted_at)}, not started yet"
    return f"waited {duration(waited)}"


def _cards(inc: Any) -> str:
    return "-" if inc is None else ",".join(str(c) for c in inc.cards) or "-"


def render_detail(detail: JobDetail, now: float, *, why: str | None = None) -> str:
    from gpuctl.ops.jobs import placed

    view = detail.view
    job, inc, ckpt = view.job, placed(view), view.checkpoint
    where = "-"
    if inc is not None:
        where = f"{inc.node}  cards {_cards(inc)}  ({inc.mib_per_card / 1024:.1f} GiB per card)"
    cancelling = job.cancel_requested and not job.state.terminal
    lines = [
        ("job", f"{job.id} ({job.name})"),
        ("owner", job.owner or "-"),
        ("state", job.state.value + ("  (cancel requested)" if cancelling else "")),
        ("reason", why or job.reason or "-"),
        ("tier", f"{job.tier}, priority {job.priority}"),
        ("node", where),
        ("incarnation", f"{job.incarnation}  (restarts {job.restarts})"),
        (
            "checkpoint",
            "none committed yet"
            if ckpt is None
            else f"step {ckpt.step}, {ago(ckpt.committed_at, now)} "
            f"(incarnation {ckpt.incarnation}, {ckpt.path})",
        ),
        ("submitted", f"{local_stamp(job.submitted_at)}  ({_waited_text(job, now)})"),
        ("command", " ".join(job.spec.command)),
    ]
    out = "".join(f"{k:<12} {v}\n" for k, v in lines)
    if detail.incarnations:
        rows = [["N", "NODE", "CARDS", "STATE", "STARTED", "ENDED", "EXIT", "WHY", "RESUMED"]]
        for i in detail.incarnations:
            rows.append(
                [
                    str(i.n),
                    i.node,
                    _cards(i),
                    i.state.value,
                    local_stamp(i.started_at),
                    local_stamp(i.ended_at),
                    "-" if i.exit_code is None else str(i.exit_code),
                    "-" if i.end_reason is None else i.end_reason.value,
                    "fresh" if i.resume_step is None else f"step {i.resume_step}",
                ]
            )
        out += "\nincarnations:\n" + _indent(_table(rows))
    if detail.events:
        rows = [["AT", "ACTOR", "KIND", "MESSAGE"]]
        rows += [[local_stamp(e.at), e.actor, e.kind, e.message] for e in detail.events]
        out += "\nevents:\n" + _indent(_table(rows))
    return out


def _indent(text: str) -> str:
    return "".join(f"  {line}\n" for line in text.splitlines())


def register(root: typer.Typer) -> None:
    root.command("submit")(submit)
    root.add_typer(app, name="jobs")
    root.command("logs")(logs)
    root.command("cancel")(cancel)
