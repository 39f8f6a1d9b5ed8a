"""The fleet table (one row per node) and the events/alerts list."""

from __future__ import annotations

from gpuctl.tui.rows import EVENT_COLUMNS, FLEET_COLUMNS
from gpuctl.tui.widgets.table import KeyedTable


class FleetTable(KeyedTable):
    """Per node: state, GPUs, memory allocated vs observed (sum and a bar), one glyph per GPU
    (its memory use, coloured by health, ghost memory and allocation), util, temp, health."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(FLEET_COLUMNS, **kwargs)


class EventsList(KeyedTable):
    """Alerts (now) above the store's recent events (newest first)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(EVENT_COLUMNS, **kwargs)
