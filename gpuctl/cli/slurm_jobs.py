"""The Slurm branch of `gpuctl submit --backend slurm`, `jobs list|show`, `logs` and `cancel`:
thin shells over `gpuctl.ops.slurm_jobs` for the jobs Slurm runs (docs/slurm.md)."""

from __future__ import annotations

import codecs
import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import typer

from gpuctl.cli import context
from gpuctl.cli.fleet import open_state
from gpuctl.cli.render import Output, emit_document, safe

if TYPE_CHECKING:
    from gpuctl.adapters.protocols import Store
    from gpuctl.adapters.slurm import SlurmCommands
    from gpuctl.core.jobs.model import Job

BACKENDS = ("gpuctl", "slurm")


@contextlib.contextmanager
def slurm_commands(ctx: typer.Context) -> Iterator[SlurmCommands]:
    """The inventory's Slurm commands (locally, or on its login node), closed after."""
    from gpuctl.config.inventory import load_inventory
    from gpuctl.ops import slurm_jobs

    app_ctx = context.get(ctx)
    inventory = load_inventory(app_ctx.resolve_inventory_path())
    commands, opened = slurm_jobs.commands_for(inventory.slurm, context.root(ctx).transport)
    try:
        yield commands
    finally:
        if opened is not None:
            opened.close()


def submit(ctx: typer.Context, specs: Sequence[Any], output: Output) -> None:
    """Place on Slurm's nodes, `sbatch`, record; print what was submitted."""
    from gpuctl.cli import fleet
    from gpuctl.ops import jobs as service
    from gpuctl.ops import slurm_jobs
    from gpuctl.ops.place import gather_snapshot

    app_ctx = context.get(ctx)
    inventory = fleet.load_inventory(ctx)
    if inventory.slurm is None:
        slurm_jobs.commands_for(None, None)  # raises: no Slurm cluster
    snapshot = gather_snapshot(inventory, transport_factory=app_ctx.transport_factory)
    with slurm_commands(ctx) as commands, open_state(ctx, write=True) as store:
        added = slurm_jobs.submit(
            store,
            specs,
            commands,
            snapshot,
            actor=service.operator(app_ctx.env),
            clock=app_ctx.clock,
            env=app_ctx.env,
        )
    if output in (Output.JSON, Output.YAML):
        emit_document([_submitted(j) for j in added], output)
        return
    for job in added:
        backend = job.spec.backend
        assert backend is not None
        sys.stdout.write(
            f"submitted {job.id} to Slurm as job {backend.id} (output {backend.output})\n"
        )


def _submitted(job: Job) -> dict[str, Any]:
    backend = job.spec.backend
    assert backend is not None
    return {
        "id": job.id,
        "name": job.name,
        "backend": "slurm",
        "slurm_job_id": backend.id,
        "output": backend.output,
        "state": job.state.value,
    }


def logs(ctx: typer.Context, job: Job, follow: bool) -> None:
    from gpuctl.ops import slurm_jobs

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    with slurm_commands(ctx) as commands, open_state(ctx, write=False) as store:
        for chunk in slurm_jobs.read_logs(store, commands, job.id, follow=follow):
            sys.stdout.write(safe(decoder.decode(chunk.data)))
            sys.stdout.flush()


def cancel(ctx: typer.Context, store: Store, job: Job, output: Output) -> None:
    """`scancel` the job and record it cancelled (`store`: open for writing)."""
    from gpuctl.ops import jobs as service
    from gpuctl.ops import slurm_jobs

    app_ctx = context.get(ctx)
    with slurm_commands(ctx) as commands:
        done = slurm_jobs.cancel(
            store, commands, job, actor=service.operator(app_ctx.env), clock=app_ctx.clock
        )
        view = next(v for v in service.list_jobs(store, include_done=True) if v.job.id == done.id)
    if output in (Output.JSON, Output.YAML):
        emit_document(service.job_summary(view, time.time()), output)
        return
    sid = job.spec.backend.id if job.spec.backend is not None else "?"
    sys.stdout.write(f"{done.id} {done.state} (scancel {sid})\n")
