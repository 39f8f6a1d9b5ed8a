"""Waiting in tests: poll a condition until a deadline (a deadline, never a sleep as an
assertion)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout_s: float = 20.0, every_s: float = 0.05) -> T:
    """Call `probe` every `every_s` until it returns something truthy or `timeout_s` passes;
    its last value either way (the caller asserts on it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)
