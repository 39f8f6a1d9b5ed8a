"""`gpuctl reconcile [--watch]`: run the control loop, once or until Ctrl-C.

A thin shell over `gpuctl.ops.loop`: it opens the store, builds the gatherer and the job
runner over one SSH transport, runs a pass (or passes), and prints what they did. With `--watch`,
what happens is streamed on stderr; Ctrl-C lets the current step finish, releases the loop lock
and exits 0 (a second Ctrl-C stops at once).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import typer

from gpuctl.cli.context import POLLERS_OPTION, use_pollers
from gpuctl.cli.reconcile_stream import Stream
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.core.timefmt import machine_times
from gpuctl.errors import ControllerLeads, ExitCode, StateError, StoreConflict, UsageError

if TYPE_CHECKING:
    from gpuctl.ops.loop import PassReport, Reconciler


def reconcile(
    ctx: typer.Context,
    watch: bool = typer.Option(False, "--watch", help="Run pass after pass until Ctrl-C."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between passes (--watch)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Show what one pass would do; change nothing."
    ),
    wait: float = typer.Option(
        0.0, "--wait", help="Wait this long for another running loop to finish its pass."
    ),
    grace: float | None = typer.Option(
        None, "--grace", help="Seconds without an answer before a node is down (default 30)."
    ),
    history_retention: str | None = typer.Option(
        None,
        "--history-retention",
        help="With --watch, how long the fleet's history (the five numbers, each node's use, "
        "recorded once a minute) is kept: 30d, 7d, 12h (default: the inventory's defaults: "
        "history_retention:, else 30d).",
        show_default=False,
    ),
    pollers: int | None = POLLERS_OPTION,
    output: Output = OUTPUT_OPTION,
) -> None:
    """Gather, observe jobs, fail over, fence, place and launch queued jobs: one pass.

    Exit 0 when the pass ran, 6 when another loop holds the lock, a controller leads (`gpuctl
    controller run`) or the store refuses.
    """
    if interval <= 0 or wait < 0 or (grace is not None and grace < 0):
        raise UsageError("--interval must be positive; --wait and --grace never negative")
    if watch and dry_run:
        raise UsageError("--dry-run shows one pass; it cannot be combined with --watch")
    from gpuctl.ops.history import retention

    retention(history_retention)  # a bad flag is refused before the fleet is reached
    use_pollers(ctx, pollers)
    loop, close = _build(ctx, dry_run=dry_run, wait=wait, grace=grace, stream=watch)
    try:
        if watch:
            from gpuctl.ops.history import Recorder

            keep = retention(history_retention, loop.inventory.history_retention_s)
            loop.record_history = Recorder(keep).record_quietly
            _watch(loop, interval, output)
            return
        try:
            report = loop.run_once()
        except StoreConflict as exc:
            raise _busy(exc) from None
        _print(report, output)
    finally:
        close()


def _build(
    ctx: typer.Context, *, dry_run: bool, wait: float, grace: float | None, stream: bool
) -> tuple[Reconciler, Callable[[], None]]:
    import dataclasses

    from gpuctl.cli import fleet
    from gpuctl.ops.loop import ReconcileSettings

    settings = ReconcileSettings(lock_wait_s=wait, dry_run=dry_run)
    if grace is not None:
        settings = dataclasses.replace(settings, grace_s=grace)
    # One pass (from cron, say) looks back at the samples of earlier runs and of `gpuctl health`,
    # or sustained heat could never be told from a spike; --watch keeps its own in memory.
    parts = fleet.open_loop(
        ctx,
        write=not dry_run,
        settings=settings,
        on_action=_stream() if stream else None,
        history_file=not stream and not dry_run,
    )
    return parts.loop, parts.close


def _busy(exc: StoreConflict) -> StateError:
    if isinstance(exc, ControllerLeads):
        return exc
    return StateError(
        f"another control loop is running ({exc.message})",
        hint="let it work, or pass --wait SECONDS to queue behind it",
    )


def _stream() -> Stream:
    """Each action on stderr as it happens; a waiting line only when new or changed."""
    return Stream()


def _watch(loop: Reconciler, interval: float, output: Output) -> None:
    stop = threading.Event()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        sys.stderr.write("stopping after this step (Ctrl-C again to stop at once)\n")
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)

    def on_report(report: PassReport | None) -> None:
        stream = loop.on_action
        if report is not None and not report.interrupted and isinstance(stream, Stream):
            stream.end_pass()  # the pass is over: what it no longer waits for has cleared
        if report is not None and output in (Output.JSON, Output.YAML):  # None: on_skip said
            sys.stdout.write(
                json.dumps(machine_times(report.to_dict()), separators=(",", ":")) + "\n"
            )
            sys.stdout.flush()

    def on_skip(exc: StoreConflict) -> None:
        if isinstance(exc, ControllerLeads):  # who leads, until when
            sys.stderr.write(safe(exc.message) + "\n")
        else:
            sys.stderr.write("another control loop holds the lock; trying again next pass\n")

    try:
        loop.watch(interval, stop, on_report, on_skip)
    finally:
        signal.signal(signal.SIGINT, previous)
    raise typer.Exit(int(ExitCode.OK))


def _print(report: PassReport, output: Output) -> None:
    from gpuctl.config.hostlist import fold

    if output in (Output.JSON, Output.YAML):
        emit_document(report.to_dict(), output)
        return
    lines = []
    for a in report.actions:
        lines.append((a.kind, a.job_id or "-", a.node or "-", a.outcome or "-", a.message))
    if lines:
        head = ("ACTION", "JOB", "NODE", "OUTCOME", "WHAT")
        widths = [max(len(row[i]) for row in [head, *lines]) for i in range(4)]
        for row in [head, *lines]:
            cells = [row[i].ljust(widths[i]) for i in range(4)]
            sys.stdout.write(safe("  ".join([*cells, row[4]])) + "\n")
    states = ", ".join(f"{n} {s}" for s, n in sorted(report.jobs.items())) or "no jobs"
    down = [n.name for n in report.nodes if n.liveness == "down"]
    tail = f"; down: {fold(down)}" if down else ""
    suspect = "; suspecting gpuctl's own network" if report.suspect_network else ""
    what = "would be done (dry run)" if report.dry_run else "done"
    sys.stdout.write(
        safe(f"{len(report.actions)} action(s) {what}; jobs: {states}{tail}{suspect}") + "\n"
    )
    if output is Output.WIDE:
        for n in report.nodes:
            ghost = f", ghost {n.ghost_mib} MiB (pids {list(n.ghost_pids)})" if n.ghost_mib else ""
            sys.stdout.write(safe(f"  {n.name}: {n.reach}, {n.liveness}{ghost}") + "\n")


def register(app: typer.Typer) -> None:
    app.command("reconcile")(reconcile)
