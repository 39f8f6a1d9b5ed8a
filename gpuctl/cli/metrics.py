"""`gpuctl metrics serve|dump`: the fleet in the Prometheus exposition format.

A thin shell over `gpuctl.ops.metrics`: it builds the refresher (one gatherer for the server's
life, the store opened read-only at each refresh), serves the latest values on an HTTP endpoint
and stops cleanly on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from gpuctl.cli import context, fleet
from gpuctl.cli.render import safe
from gpuctl.errors import ExitCode, UsageError, exit_for_poll

if TYPE_CHECKING:
    from gpuctl.ops.metrics import Reading, Refresher

app = typer.Typer(
    help="Prometheus metrics: the five numbers, nodes, GPUs and event counters.",
    no_args_is_help=True,
)

FROM_STORE = typer.Option(
    False, "--from-store", help="Poll nothing: job figures, counters and liveness from the store."
)
RULES = typer.Option(None, "--rules", help="A health rules file overriding the built-in rules.")
LIVE = typer.Option(
    False,
    "--live",
    help="Poll every node at each refresh, even while a control loop publishes the fleet into "
    "the store (read instead by default, the refresh line saying how old it is).",
)


@app.command("serve")
def serve(
    ctx: typer.Context,
    port: int = typer.Option(9400, "--port", min=0, max=65535, help="TCP port (0: any free)."),
    address: str = typer.Option("127.0.0.1", "--address", help="Address to listen on."),
    interval: float = typer.Option(15.0, "--interval", help="Seconds between refreshes (>= 1)."),
    from_store: bool = FROM_STORE,
    rules: Path | None = RULES,
    history_retention: str | None = typer.Option(
        None,
        "--history-retention",
        help="How long the fleet's history its polls record (once a minute, unless a control "
        "loop did) is kept: 30d, 12h (default: the inventory's, else 30d).",
        show_default=False,
    ),
    live: bool = LIVE,
    pollers: int | None = context.POLLERS_OPTION,
) -> None:
    """Serve /metrics until Ctrl-C or SIGTERM; one line per refresh on stderr. Scrapes read the
    latest values and never trigger a poll. Its polls record the fleet's history into the store
    (not --from-store). Exit 0 on a clean stop."""
    from gpuctl.ops.history import retention
    from gpuctl.ops.metrics import FleetCollector, MetricsServer

    if not interval >= 1.0:
        raise UsageError(f"--interval must be at least 1 second, got {interval:g}")
    retention(history_retention)  # a bad value is refused before the fleet is reached
    context.use_pollers(ctx, pollers)
    collector = FleetCollector()
    with _refresher(ctx, from_store, rules, live) as refresher:
        if not from_store:
            _record_history(ctx, refresher, history_retention)
        server = MetricsServer(collector, address, port)
        try:
            sys.stderr.write(f"serving metrics on {server.url} (refresh every {interval:g}s)\n")
            if address not in ("127.0.0.1", "::1", "localhost"):
                sys.stderr.write("warning: the endpoint has no authentication; firewall it\n")
            stop = threading.Event()
            worker = threading.Thread(
                target=refresher.run,
                args=(collector, interval, stop, _logger(refresher)),
                name="gpuctl-metrics-refresh",
                daemon=True,
            )
            with _stop_on_signals(stop):
                worker.start()
                while not stop.wait(0.5):
                    pass
            worker.join(timeout=30.0)  # a poll in flight ends within its nodes' deadlines
        finally:
            server.close()
    sys.stderr.write("metrics: stopped\n")
    raise typer.Exit(int(ExitCode.OK))


@app.command("dump")
def dump(
    ctx: typer.Context,
    from_store: bool = FROM_STORE,
    rules: Path | None = RULES,
    live: bool = LIVE,
) -> None:
    """Refresh once and print the exposition on stdout (for scripts and tests).

    Exit 0 when every node answered (or --from-store), 3 when some did not, 4 when none did."""
    from gpuctl.ops.metrics import exposition

    with _refresher(ctx, from_store, rules, live) as refresher:
        reading = refresher.refresh()
        log = _logger(refresher)
    sys.stdout.write(exposition(reading).decode("utf-8"))
    sys.stdout.flush()
    log(reading, None)
    if reading.source == "store":  # no poll: what the store says of the nodes is no answer
        raise typer.Exit(int(ExitCode.OK))
    answers = ("unreachable" if n.up is False else "ok" for n in reading.nodes)
    raise typer.Exit(int(exit_for_poll(answers)))


@contextmanager
def _refresher(
    ctx: typer.Context, from_store: bool, rules_file: Path | None, live: bool = False
) -> Iterator[Refresher]:
    from gpuctl.config.health_rules import load_rules

    rules = load_rules(rules_file)
    inventory = None if from_store else fleet.load_inventory(ctx)
    with context.root(ctx).refresher(rules, inventory, live=live) as refresher:
        yield refresher


def _logger(refresher: Refresher) -> Callable[[Reading | None, str | None], None]:
    """`_log_refresh`, saying when a refresh read the controller's snapshot instead of polling."""

    def log(reading: Reading | None, error: str | None) -> None:
        _log_refresh(reading, error, refresher.seen_line())

    return log


def _record_history(ctx: typer.Context, refresher: Refresher, flag: str | None) -> None:
    from gpuctl.ops.history import Recorder, retention

    root = context.root(ctx)
    inventory = refresher.inventory
    keep = retention(flag, inventory.history_retention_s if inventory is not None else None)
    refresher.record_history(Recorder(keep), lambda: root.store(write=True))


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and the first Ctrl-C set `stop`; a second Ctrl-C stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread; the caller sets `stop` itself
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and stop.is_set():
            raise KeyboardInterrupt
        sys.stderr.write(f"metrics: {signal.Signals(signum).name}: stopping\n")
        stop.set()

    previous: dict[signal.Signals, Callable[[int, FrameType | None], object] | int | None] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _log_refresh(reading: Reading | None, error: str | None, seen: str | None = None) -> None:
    """One line per refresh on stderr; `seen`: the refresh read the controller's snapshot."""
    if reading is None:
        line = f"refresh failed: {error}; serving the previous values"
    elif reading.source == "store":
        counters = reading.counters or {}
        counts = ", ".join(f"{k} {v}" for k, v in counters.items()) or "no store"
        line = f"refresh (store): {len(reading.nodes)} node(s) known; events: {counts}"
    else:
        up = sum(1 for n in reading.nodes if n.up)
        util = None if reading.numbers is None else reading.numbers.utilization_pct
        util_text = "N/A" if util is None else f"{util:g}%"
        line = (
            f"refresh: {up}/{len(reading.nodes)} node(s) up, {len(reading.gpus)} GPU(s), "
            f"utilization {util_text}, {reading.duration_s:.2f}s"
        )
    if reading is not None and seen is not None:
        line += f" ({seen})"
    if reading is not None and reading.store_error:
        line += f"; store unreadable: {reading.store_error}"
    sys.stderr.write(safe(line) + "\n")
    sys.stderr.flush()
