"""Fixtures the CLI tests share."""

from __future__ import annotations

import time
from collections.abc import Iterator
from zoneinfo import ZoneInfo

import pytest


@pytest.fixture
def in_india(monkeypatch: pytest.MonkeyPatch) -> Iterator[ZoneInfo]:
    """Local time is India's: +05:30 all year, an offset no machine runs the tests in by chance."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield ZoneInfo("Asia/Kolkata")
    monkeypatch.undo()
    time.tzset()
