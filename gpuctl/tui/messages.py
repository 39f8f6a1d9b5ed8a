"""Messages from screens up to the app (attributes flow down: the app hands screens its data)."""

from __future__ import annotations

from textual.message import Message


class OpenNode(Message):
    """Drill down into one node."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


class OpenJob(Message):
    """Drill down into one job."""

    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id = job_id


class ActionRequested(Message):
    """The operator asked for cordon / uncordon / drain / consolidate (target: a node or None),
    or to cancel / kill a job (target: the job's id)."""

    def __init__(self, action: str, target: str | None) -> None:
        super().__init__()
        self.action = action
        self.target = target


class ToggleCheckpoints(Message):
    """Hide checkpoint events from the events list, or show every event again."""


class NextHistoryWindow(Message):
    """Show the sparklines over the next history window (1h, 6h, 24h, round again)."""
