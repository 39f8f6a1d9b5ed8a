"""`gpuctl db check|path|migrate`: is the state store sound, where is it, and moving it from
SQLite to PostgreSQL."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpuctl.cli import context
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.errors import exit_for_db_check

if TYPE_CHECKING:
    from gpuctl.ops.fleetcheck import FleetCheck

app = typer.Typer(
    help="gpuctl's state store: check it, find it, move it to PostgreSQL.", no_args_is_help=True
)


def _state_dir(ctx: typer.Context) -> Path:
    from gpuctl.config import paths

    app_ctx = context.get(ctx)
    return app_ctx.state_dir or paths.state_dir(app_ctx.env)


@app.command("check")
def check(
    ctx: typer.Context,
    fleet: bool = typer.Option(
        False,
        "--fleet",
        help="Also read every node of the inventory: a job live twice, a stray run, a card "
        "holding more than it has. Exit 1 on any such problem, 3 when a node could not be read.",
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Integrity, schema version and the job invariants. Exit 0 when healthy, 6 otherwise.

    With --fleet, the job processes that really run on the nodes are compared with the store."""
    from gpuctl.config.hostlist import fold
    from gpuctl.ops.invariants import check_database

    report = check_database(_state_dir(ctx), context.get(ctx).resolve_state_url())
    found = _check_fleet(ctx) if fleet and report.healthy else None
    if output in (Output.JSON, Output.YAML):
        document = report.to_dict()
        if found is not None:
            document["fleet"] = found.to_dict()
        emit_document(document, output)
    else:
        lines = [("state dir", report.state_dir), ("database", report.database)]
        if not report.exists:
            lines.append(("status", "no database yet (the first submit creates it)"))
        if report.schema_version is not None:
            known = report.known_schema_version
            lines.append(("schema", f"v{report.schema_version} (this gpuctl knows v{known})"))
            lines.append(("id", str(report.database_id)))
            counts = f"{report.jobs} jobs, {report.incarnations} incarnations, {report.events}"
            lines.append(("rows", f"{counts} events"))
            if report.history_samples is not None:
                lines.append(("history", f"{report.history_samples} samples"))
        lines += [("problem", p) for p in report.problems]
        lines.append(("healthy", "yes" if report.healthy else "NO"))
        if found is not None:
            live = ", ".join(f"{j}#{n} on {fold(ns)}" for (j, n), ns in found.live.items())
            lines.append(("fleet", f"{found.nodes} node(s) read; live: {live or 'no job'}"))
            lines += [("fleet err", p) for p in found.problems]
            lines += [("unread", u) for u in found.unreadable]
        sys.stdout.write("".join(f"{k:<10} {safe(v)}\n" for k, v in lines))
    if not report.healthy:
        from gpuctl.adapters.store.failures import disk_full

        if disk_full(Path(report.state_dir)):  # SQLite's errors then mean no room, not damage
            sys.stderr.write(
                f"hint: the disk that holds {report.state_dir} is full (a full disk damages "
                "nothing): free space there, then run gpuctl db check again\n"
            )
        else:
            sys.stderr.write(
                f"hint: gpuctl refuses to change state it cannot trust; restore {report.database} "
                "from a backup, or move it (and store.id beside it) aside to start empty\n"
            )
    elif found is not None and found.problems:
        sys.stderr.write(f"the fleet does not match the store: {len(found.problems)} problem(s)\n")
    elif found is not None and found.unreadable:
        sys.stderr.write(
            f"{len(found.unreadable)} node(s) could not be read: the check is partial\n"
        )
    problems, unread = (len(found.problems), len(found.unreadable)) if found else (0, 0)
    code = exit_for_db_check(store_ok=report.healthy, fleet_problems=problems, unread_nodes=unread)
    raise typer.Exit(int(code))


def _check_fleet(ctx: typer.Context) -> FleetCheck:
    """Poll the inventory's nodes and list their job processes, over one transport."""
    from gpuctl.adapters.node import SshJobRunner
    from gpuctl.cli import fleet
    from gpuctl.ops.fleetcheck import check_fleet
    from gpuctl.ops.gather import Gatherer, default_transport

    app_ctx = context.get(ctx)
    inventory = fleet.load_inventory(ctx)
    transport = app_ctx.transport_factory() if app_ctx.transport_factory else default_transport()
    with Gatherer(transport) as gatherer, fleet.open_state(ctx, write=False) as store:
        snapshot = gatherer.gather(inventory)
        return check_fleet(store, inventory, SshJobRunner(transport), snapshot)


@app.command("path")
def path(ctx: typer.Context) -> None:
    """Print the database's path (it may not exist yet), or its URL (never a password) when the
    state is in PostgreSQL (--state-url / GPUCTL_STATE_URL)."""
    from gpuctl.adapters.store import db_path

    url = context.get(ctx).resolve_state_url()
    if url is not None:
        from gpuctl.adapters.store.postgres.url import redact

        sys.stdout.write(f"{redact(url)}\n")
        return
    sys.stdout.write(f"{db_path(_state_dir(ctx))}\n")


@app.command("migrate")
def migrate(
    ctx: typer.Context,
    to: str = typer.Option(
        ...,
        "--to",
        help="The PostgreSQL database to copy into, e.g. postgresql://gpuctl@db/gpuctl "
        "(no password: ~/.pgpass). It must hold no gpuctl rows yet.",
        show_default=False,
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Say what would be copied (rows per table); change nothing."
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Copy the SQLite store of the state folder into PostgreSQL, in one transaction.

    The SQLite store is brought to this gpuctl's schema first (a backup is kept beside it) and
    left as it was otherwise. Then run gpuctl with --state-url (or GPUCTL_STATE_URL) set to the
    same URL."""
    from gpuctl.adapters.store import db_path, open_store
    from gpuctl.adapters.store.postgres import copy
    from gpuctl.adapters.store.postgres.url import check, redact
    from gpuctl.errors import UsageError

    url = check(to, where="--to")
    state_dir = _state_dir(ctx)
    if not db_path(state_dir).exists():
        raise UsageError(
            f"{db_path(state_dir)}: no SQLite store here: nothing to copy",
            hint="give the state folder that holds it with --state-dir",
        )
    with open_store(state_dir, write=not dry_run) as source:
        if dry_run:
            done = copy.plan(source)
        else:
            done = copy.copy(source, url, _progress if sys.stderr.isatty() else None)
    if output in (Output.JSON, Output.YAML):
        emit_document({**done.to_dict(), "to": redact(url), "dry_run": dry_run}, output)
    else:
        verb = "would copy" if dry_run else "copied"
        sys.stdout.write("".join(f"{t:<16} {n}\n" for t, n in done.tables))
        sys.stderr.write(
            f"{verb} {done.rows} row(s) of schema v{done.schema_version} from {source.path} "
            f"to {safe(redact(url))}\n"
        )


def _progress(table: str, done: int, total: int) -> None:
    sys.stderr.write(f"\rcopying {table}: {done}/{total}" + ("\n" if done >= total else ""))
