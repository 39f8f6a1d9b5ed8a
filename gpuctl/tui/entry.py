"""The one way into the dashboard from the CLI: `gpuctl dash` builds the dashboard's services
(`gpuctl.ops.compose`) and hands them here, to run the Textual app, or, without a terminal, to
print one refresh as text (textual is then never imported).
"""

from __future__ import annotations

from gpuctl.ops.dashboard import DEFAULT_WINDOW, DashData, DashHistory, Services, collect


def run(
    services: Services, *, refresh_s: float, readonly: bool, history: str = DEFAULT_WINDOW
) -> None:
    """The dashboard in the terminal until the operator quits; the services are closed after.
    `history`: the sparklines' window (1h, 6h, 24h)."""
    from gpuctl.tui.app import DashApp

    DashApp(services, refresh_s=refresh_s, readonly=readonly, history=history).run()


def once(services: Services, history: str = DEFAULT_WINDOW) -> tuple[str, DashData]:
    """One refresh, and it as text: the numbers, then the fleet table (each node's utilization
    over the last `history` of the store's history, when it has some) and the alerts (`gpuctl
    dash --once`). The services are closed after."""
    from gpuctl.tui.rows import once_text

    try:
        data = collect(services, history=DashHistory(history))
    finally:
        services.close()
    return once_text(data), data
