"""`gpuctl controller run|status`: the control loop as an elected service, and who leads it.

A thin shell over `gpuctl.ops.controller`: `run` builds the control loop as `reconcile` does and
hands it to a `Controller` until SIGTERM or Ctrl-C; `status` reads the lease and the members.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import typer

from gpuctl.cli import context
from gpuctl.cli.render import OUTPUT_OPTION, Output, emit_document, safe
from gpuctl.core import timefmt
from gpuctl.core.lease import LEASE_S, RENEW_S
from gpuctl.errors import ExitCode, UsageError

app = typer.Typer(
    help="The control loop as a service: one controller leads (a lease in the store), "
    "others stand by and take over when it dies.",
    no_args_is_help=True,
)


def _say(line: str) -> None:
    sys.stderr.write(safe(line) + "\n")
    sys.stderr.flush()


@app.command("run")
def run(
    ctx: typer.Context,
    lease: float = typer.Option(
        LEASE_S,
        "--lease",
        help="Seconds a lease lasts unless renewed: how soon a standby "
        "takes over when the leader dies.",
    ),
    renew: float = typer.Option(RENEW_S, "--renew", help="Seconds between renewals."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between passes."),
    grace: float | None = typer.Option(
        None, "--grace", help="Seconds without an answer before a node is down (default 30)."
    ),
    pollers: int | None = context.POLLERS_OPTION,
) -> None:
    """Lead the control loop while holding the store's lease, or stand by until it expires.

    Every write of the leader carries the lease's fencing token: a leader that lost the lease
    (paused past it, say) has its next write refused and steps down to standby. SIGTERM or
    Ctrl-C gives the lease back. Exit 6 when the store cannot be opened."""
    import dataclasses

    from gpuctl.cli import fleet
    from gpuctl.cli.reconcile import _stream
    from gpuctl.ops import controller_pause
    from gpuctl.ops.controller import Controller, ControllerSettings, holder_name
    from gpuctl.ops.history import Recorder
    from gpuctl.ops.loop import ReconcileSettings

    settings = ControllerSettings(lease_s=lease, renew_s=renew, interval_s=interval).check()
    if grace is not None and grace < 0:
        raise UsageError("--grace must not be negative")
    loop_settings = ReconcileSettings()
    if grace is not None:
        loop_settings = dataclasses.replace(loop_settings, grace_s=grace)
    context.use_pollers(ctx, pollers)
    parts = fleet.open_loop(ctx, write=True, settings=loop_settings, on_action=_stream())
    try:
        loop = parts.loop
        env = context.get(ctx).env
        pause = env.get(controller_pause.ENV)
        if pause:  # a test's hook: stop at a named point of a pass (see the module)
            resume = env.get(controller_pause.RESUME_ENV)
            loop.store, loop.runner = controller_pause.wrap(loop.store, loop.runner, pause, resume)
        loop.record_history = Recorder().record_quietly  # the history's default retention
        holder = holder_name()
        _say(f"controller {holder} starting (lease {lease:g}s, renewed every {renew:g}s)")
        stop = threading.Event()
        _on_signals(stop)
        Controller(loop, holder=holder, settings=settings, say=_say).run(stop)
    finally:
        parts.close()


def _on_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        _say("stopping after this step (again to stop at once)")
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


@app.command("status")
def status(ctx: typer.Context, output: Output = OUTPUT_OPTION) -> None:
    """Who leads (holder, token, lease expiry), who stands by, and when the last pass ended.

    Exit 0 when a controller holds a live lease, 1 when none does."""
    from gpuctl.ops.controller import status as read_status

    root = context.root(ctx)
    store = root.open_store(root.state_dir, write=False)
    try:
        found = read_status(store)
    finally:
        store.close()
    doc = found.to_dict()
    if output in (Output.JSON, Output.YAML):
        emit_document(doc, output)
    else:
        now = found.lease.now if found.lease is not None else None
        rows = [
            ("leader", str(doc["leader"] or "none")),
            ("token", str(doc["token"] if doc["token"] is not None else "-")),
            ("expires", _when(found.lease.expires_at if found.lease else None, now)),
            ("last pass", _when(found.lease.last_pass_at if found.lease else None, now)),
            ("standbys", ", ".join(str(s) for s in doc["standbys"]) or "none"),  # type: ignore[attr-defined]
        ]
        sys.stdout.write("".join(f"{k:<10} {safe(v)}\n" for k, v in rows))
    if not found.live:
        if output not in (Output.JSON, Output.YAML):
            _say("no controller holds a live lease")
        raise typer.Exit(int(ExitCode.ERROR))


def _when(at: float | None, now: float | None) -> str:
    if at is None or now is None:
        return "-"
    offset = _local_offset(at)
    return f"{timefmt.stamp(at, offset)} ({timefmt.ago(at, now)})"


def _local_offset(at: float) -> int:
    from gpuctl.adapters.clock import local_offset_s

    return local_offset_s(at)
