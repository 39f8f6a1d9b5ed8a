"""Garbage collection between refreshes, never in the middle of one.

A refresh of a thousand-node fleet builds a few hundred thousand objects that live until the next
refresh replaces them. With CPython's automatic collector on, they are promoted to the oldest
generation and trigger a full collection every few refreshes, in the middle of a poll or a
repaint: a pause of 50-200 ms that lands on the refresh. Reference counting frees almost all of
those objects anyway; the cyclic collector only has to find the few cycles.

So while the dashboard runs, automatic collection is off, and the app calls `idle()` when a
refresh has been shown: the young generations are collected then (a few ms), and the whole heap
every `full_every` calls. Memory stays bounded: nothing is left uncollected for longer than one
refresh (young) or `full_every` refreshes (old). What exists when the app starts (modules,
classes, textual's widgets: most of the heap) lives as long as the app does: it is frozen out of
the full collections (`gc.freeze`). `stop()` puts the collector back as it was.
"""

from __future__ import annotations

import gc
import time

FULL_EVERY = 30  # idle calls between full collections (30 s at one refresh a second)


class QuietGc:
    def __init__(self, full_every: int = FULL_EVERY) -> None:
        self.full_every = max(1, full_every)
        self.calls = 0
        self.full = 0  # full collections made
        self.last_pause_s = 0.0
        self._was_enabled: bool | None = None
        self._froze = False

    def start(self) -> None:
        if self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()
            if gc.get_freeze_count() == 0:  # someone else's freeze is theirs to undo
                gc.collect()
                gc.freeze()
                self._froze = True

    def stop(self) -> None:
        if self._was_enabled is not None:
            if self._froze:
                gc.unfreeze()
                self._froze = False
            if self._was_enabled:
                gc.enable()
            self._was_enabled = None

    @property
    def running(self) -> bool:
        return self._was_enabled is not None

    def idle(self) -> None:
        """Collect now: the young generations, or everything every `full_every` calls."""
        if not self.running:
            return
        self.calls += 1
        start = time.perf_counter()
        if self.calls % self.full_every == 0:
            gc.collect()
            self.full += 1
        else:
            gc.collect(1)
        self.last_pause_s = time.perf_counter() - start
