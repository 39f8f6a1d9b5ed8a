"""`gpuctl place`: where jobs would go, on the live fleet or a saved snapshot. Changes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from gpuctl.cli import context, fleet, plan_view
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.core.model import FleetSnapshot
from gpuctl.core.placement.model import JobRequest, Settings
from gpuctl.core.placement.policies import DEFAULT_POLICY, POLICIES
from gpuctl.errors import UsageError, exit_for_plan


def place(
    ctx: typer.Context,
    jobs: list[Path] = typer.Argument(..., metavar="JOB.yaml", help="Job spec files."),
    policy: str | None = typer.Option(
        None,
        "--policy",
        help=f"Placement policy: {', '.join(sorted(POLICIES))}.",
        show_default=DEFAULT_POLICY,
    ),
    explain: bool = typer.Option(False, "--explain", help="Say why each job went where it did."),
    snapshot: Path | None = typer.Option(
        None, "--snapshot", help="Place on a saved `gpuctl status -o json` instead of polling."
    ),
    band_max: float | None = typer.Option(
        None, "--band-max", help="Standard-tier admission limit as a fraction (default 0.8)."
    ),
    headroom: float | None = typer.Option(
        None,
        "--headroom",
        help="Failover headroom kept free of standard work, 0.10-0.20 (default 0.15).",
    ),
    whole_card_over: float | None = typer.Option(
        None,
        "--whole-card-over",
        help="A 1-GPU job asking more than this fraction of a card gets a whole card (0.5).",
    ),
    emit: str | None = typer.Option(
        None,
        "--emit",
        metavar="sbatch",
        help="sbatch: print the #SBATCH options that put each job where gpuctl places it, "
        "on the inventory's Slurm nodes, whole cards (docs/slurm.md).",
        show_default=False,
    ),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Show where JOB.yaml... would be placed: node, cards, score and runner-up, or why not.
    Plans as the control loop would: cordoned nodes and the cards gpuctl granted are read from
    the state store (read-only; none when there is no store).

    With --emit sbatch, each job's sbatch options instead, to head a batch script
    (gpuctl place train.yaml --emit sbatch > head.sh); Slurm picks the card indexes itself.

    Exit 0 when every job fits, 3 when some do not, 2 for bad job files or options, 6 when the
    state store refuses.
    """
    from gpuctl.config.jobspec_files import load_job_specs
    from gpuctl.core.placement.plan import plan_to_dict
    from gpuctl.ops import place as service

    settings = _settings(policy, band_max, headroom, whole_card_over)
    if emit is not None and emit != "sbatch":
        raise UsageError(f"--emit: unknown format {emit!r}", hint="known: sbatch")
    requests = load_job_specs(jobs)
    observed = service.load_snapshot(snapshot) if snapshot else _gather(ctx)
    if emit is not None:
        _emit_sbatch(ctx, requests, settings, observed, output)
    with fleet.open_state(ctx, write=False) as store:
        result = service.place(requests, settings, observed, store)
    if output in (Output.JSON, Output.YAML):
        emit_document(plan_to_dict(result), output)
    else:
        wide = output is Output.WIDE
        width = plan_view.width_of(sys.stdout)
        text = plan_view.placement_text(
            result, explain=explain, wide=wide, width=width, color=width is not None
        )
        sys.stdout.write(text)
    raise typer.Exit(int(exit_for_plan(complete=result.all_placed)))


def _emit_sbatch(
    ctx: typer.Context,
    requests: tuple[JobRequest, ...],
    settings: Settings,
    observed: FleetSnapshot,
    output: Output,
) -> None:
    """Each placed job's `#SBATCH` lines (or, -o json, its options), each unplaced job's why."""
    from gpuctl.ops.place import place_for_slurm

    with fleet.open_state(ctx, write=False) as store:
        result, emitted = place_for_slurm(requests, settings, observed, store)
    if output in (Output.JSON, Output.YAML):
        unplaced = [{"job": u.job, "reason": u.reason} for u in result.unplaced]
        emit_document({"jobs": [e.to_dict() for e in emitted], "unplaced": unplaced}, output)
    else:
        blocks = ["\n".join(e.script_lines()) for e in emitted]
        blocks += [f"# {u.job}: not placed: {u.reason}" for u in result.unplaced]
        sys.stdout.write(safe("\n\n".join(blocks)) + "\n")
    raise typer.Exit(int(exit_for_plan(complete=result.all_placed)))


def _settings(
    policy: str | None,
    band_max: float | None,
    headroom: float | None,
    whole_card_over: float | None,
) -> Settings:
    name = policy or DEFAULT_POLICY
    if name not in POLICIES:
        raise UsageError(
            f"--policy: unknown policy {name!r}", hint=f"known: {', '.join(sorted(POLICIES))}"
        )
    if band_max is not None and not 0 < band_max <= 1:
        raise UsageError("--band-max must be a fraction in (0, 1]", hint="0.8 means 80%")
    if headroom is not None and not 0.10 <= headroom <= 0.20:
        raise UsageError("--headroom must be a fraction from 0.10 to 0.20", hint="0.15 means 15%")
    if whole_card_over is not None and not 0 < whole_card_over <= 1:
        raise UsageError("--whole-card-over must be a fraction of a card in (0, 1]")
    defaults = Settings()
    return Settings(
        policy=name,
        band_max=defaults.band_max if band_max is None else band_max,
        headroom=defaults.headroom if headroom is None else headroom,
        whole_card_over=defaults.whole_card_over if whole_card_over is None else whole_card_over,
    )


def _gather(ctx: typer.Context) -> FleetSnapshot:
    from gpuctl.ops.place import gather_snapshot

    app = context.get(ctx)
    inventory = fleet.load_inventory(ctx)  # with a Slurm cluster's nodes
    return gather_snapshot(inventory, transport_factory=app.transport_factory)


def register(app: typer.Typer) -> None:
    app.command("place")(place)
