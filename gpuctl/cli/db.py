"""`gpuctl db check|path`: is the state store sound, and where is it."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpuctl.cli import context
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.errors import ExitCode

app = typer.Typer(help="gpuctl's state store: check it, find it.", no_args_is_help=True)


def _state_dir(ctx: typer.Context) -> Path:
    from gpuctl.config import paths

    app_ctx = context.get(ctx)
    return app_ctx.state_dir or paths.state_dir(app_ctx.env)


@app.command("check")
def check(ctx: typer.Context, output: Output = OUTPUT_OPTION) -> None:
    """Integrity, schema version and the job invariants. Exit 0 when healthy, 6 otherwise."""
    from gpuctl.ops.invariants import check_database

    report = check_database(_state_dir(ctx))
    if output in (Output.JSON, Output.YAML):
        emit_document(report.to_dict(), output)
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
        lines += [("problem", p) for p in report.problems]
        lines.append(("healthy", "yes" if report.healthy else "NO"))
        sys.stdout.write("".join(f"{k:<10} {safe(v)}\n" for k, v in lines))
    if not report.healthy:
        from gpuctl.adapters.store.failures import disk_full

        if disk_full(Path(report.state_dir)):  # SQLite's errors then mean no room, not damage
            sys.stderr.write(
                f"hint: the disk that holds {report.state_dir} is full (a full disk damages "
                "nothing): free space there, then run gpuctl db check again\n"
            )
            raise typer.Exit(int(ExitCode.STATE))
        sys.stderr.write(
            f"hint: gpuctl refuses to change state it cannot trust; restore {report.database} "
            "from a backup, or move it (and store.id beside it) aside to start empty\n"
        )
        raise typer.Exit(int(ExitCode.STATE))


@app.command("path")
def path(ctx: typer.Context) -> None:
    """Print the database's path (it may not exist yet)."""
    from gpuctl.adapters.store import db_path

    sys.stdout.write(f"{db_path(_state_dir(ctx))}\n")
