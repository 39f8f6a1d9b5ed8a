"""`gpuctl health`: each node's health verdict, with Nagios exit codes."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from gpuctl.cli import context, fleet
from gpuctl.cli.fleet_view import print_table
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.cli.table_fit import FREE, KEY, Col, FitTable
from gpuctl.core.health import GpuVerdict, NodeVerdict, Reason, Severity, Verdict, worst


def health(
    ctx: typer.Context,
    nodes: list[str] | None = typer.Argument(
        None, metavar="[NODE]...", help="Names and hostlist ranges, gpu[01-04] (default: all)."
    ),
    selector: str | None = typer.Option(
        None,
        "--selector",
        "-l",
        help="Only nodes whose inventory labels match: pool=train,zone!=b (key, !key too).",
        metavar="SELECTOR",
        show_default=False,
    ),
    output: Output = OUTPUT_OPTION,
    samples: int = typer.Option(
        1, "--samples", min=1, max=100, help="Polls to take; more tell a heat spike from sustained."
    ),
    interval: float | None = typer.Option(
        None,
        "--interval",
        min=0.0,
        help="Seconds between polls (default: the samples spread over the sustained-heat window).",
        show_default=False,
    ),
    rules_file: Path | None = typer.Option(
        None, "--rules", help="A rules file overriding parts of the built-in rules."
    ),
) -> None:
    """Judge each node's GPUs (XIDs, ECC, retired pages, row remapping, heat, missing GPUs).

    Exit (Nagios): 0 every node ok, 1 some degraded (warn), 2 some unhealthy (critical),
    3 some unknown (unreadable or not answering) and none critical; 2 also for bad input.
    """
    from gpuctl.config import paths
    from gpuctl.config.health_rules import load_rules
    from gpuctl.ops.gather import Gatherer, default_transport
    from gpuctl.ops.health import SampleHistory, check_health

    rules = load_rules(rules_file)
    specs = fleet.select(fleet.load_inventory(ctx), nodes or [], selector)
    app_ctx = context.get(ctx)
    history = SampleHistory.in_state_dir(paths.state_dir(app_ctx.env, app_ctx.state_dir))
    transport = app_ctx.transport_factory() if app_ctx.transport_factory else default_transport()
    with Gatherer(transport) as gatherer:
        verdicts = check_health(
            specs,
            gatherer,
            history,
            rules,
            samples=samples,
            interval_s=interval,
            on_sample=_progress,
        )
    severity = worst(verdicts)
    if output in (Output.JSON, Output.YAML):
        emit_document(health_document(verdicts, rules_source=rules.source, samples=samples), output)
    else:
        print_table(health_table(verdicts, wide=output is Output.WIDE))
    sys.stderr.write(f"health: {_counts(verdicts)}; exit {severity.nagios} ({severity.value})\n")
    raise typer.Exit(severity.nagios)


def _progress(n: int, total: int) -> None:
    if total > 1 and sys.stderr.isatty():
        sys.stderr.write(f"health: sample {n}/{total}\n")


def _counts(verdicts: Sequence[NodeVerdict]) -> str:
    """`5 node(s), 3 healthy, 2 unhealthy (gpu[03,07])`: the nodes that are not healthy named,
    as one hostlist each."""
    from gpuctl.config.hostlist import fold

    parts = [f"{len(verdicts)} node(s)"]
    for verdict in Verdict:
        names = [v.name for v in verdicts if v.verdict is verdict]
        if names:
            which = "" if verdict is Verdict.HEALTHY else f" ({fold(names)})"
            parts.append(f"{len(names)} {verdict.value}{which}")
    return ", ".join(parts)


def _reason_dict(reason: Reason) -> dict[str, Any]:
    return {
        "rule": reason.rule,
        "gpu": reason.gpu,
        "text": safe(reason.text),
        "severity": reason.severity.value,
        "action": reason.action.value,
    }


def _gpu_dict(gpu: GpuVerdict) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "verdict": gpu.verdict.value,
        "severity": gpu.severity.value,
        "action": gpu.action.value,
        "reasons": [_reason_dict(r) for r in gpu.reasons],
    }


def health_document(
    verdicts: Sequence[NodeVerdict], *, rules_source: str, samples: int
) -> dict[str, Any]:
    severity = worst(verdicts)
    return {
        "severity": severity.value,
        "exit_code": severity.nagios,
        "rules": rules_source,
        "samples": samples,
        "nodes": [
            {
                "name": v.name,
                "verdict": v.verdict.value,
                "severity": v.severity.value,
                "action": v.action.value,
                "alert": v.alert,
                "taken_at": v.taken_at,
                "xids_ignored": v.xids_ignored,
                "reasons": [_reason_dict(r) for r in v.reasons],
                "gpus": [_gpu_dict(g) for g in v.gpus],
            }
            for v in verdicts
        ],
        "summary": {
            "nodes": len(verdicts),
            **{s.verdict.value: sum(1 for v in verdicts if v.severity is s) for s in Severity},
        },
    }


HEALTH_COLUMNS = (
    Col("NODE", KEY),
    Col("VERDICT"),
    Col("SEVERITY", drop=2),
    Col("ACTION", drop=1),
    Col("GPU"),
    Col("REASON", FREE),
)


def health_table(verdicts: Sequence[NodeVerdict], *, wide: bool = False) -> FitTable:
    """One row per reason (`-` for none); the node's columns only on its first row. Names
    whole; REASON folds in what is left; RULE (wide) goes first when too narrow."""
    table = FitTable([*HEALTH_COLUMNS, Col("RULE", drop=3)] if wide else HEALTH_COLUMNS)
    for v in verdicts:
        head = [safe(v.name), v.verdict.value, v.severity.value, v.action.value]
        for i, reason in enumerate(v.reasons or (None,)):
            row = head if i == 0 else ["", "", "", ""]
            if reason is None:
                row = [*row, "-", "-"]
            else:
                gpu = "-" if reason.gpu is None else str(reason.gpu)
                row = [*row, gpu, safe(reason.text)]
            if wide:
                row.append(reason.rule if reason else "-")
            table.add_row(*row)
    return table


def register(app: typer.Typer) -> None:
    app.command("health")(health)
