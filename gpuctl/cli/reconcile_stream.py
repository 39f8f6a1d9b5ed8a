"""What `gpuctl reconcile --watch` prints on stderr, action by action.

A pass reports what it waits for every time it waits: a drain held by the rate limit, a job not
requeued while most nodes look down, a job with no room yet. The pass's report (`-o json`) keeps
them all; the stream prints such a line (outcome `waiting` or `skipped`) only when it is new or its
message changed since the previous pass, and says once when it cleared (unless the same kind for
the same job and node did something else meanwhile, which was printed already).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuctl.cli.render import safe

if TYPE_CHECKING:
    from gpuctl.ops.loop.model import Action

QUIET = frozenset({"waiting", "skipped"})
Key = tuple[str, str | None, str | None]  # kind, job, node


def line(kind: str, job_id: str | None, node: str | None, message: str) -> str:
    who = " ".join(x for x in (job_id, node) if x)
    return safe(f"{kind}: {who + ': ' if who else ''}{message}")


def _stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class Stream:
    """The `on_action` of a watching loop; `end_pass()` after each pass that ran."""

    def __init__(self, write: Callable[[str], None] = _stderr) -> None:
        self.write = write
        self._before: dict[Key, list[str]] = {}  # the previous pass's waiting lines
        self._now: dict[Key, list[str]] = {}
        self._acted: set[Key] = set()

    def __call__(self, action: Action) -> None:
        key: Key = (action.kind, action.job_id, action.node)
        if action.outcome not in QUIET:
            self._acted.add(key)
            self.write(line(*key, action.message))
            return
        self._now.setdefault(key, []).append(action.message)
        if action.message not in self._before.get(key, ()):
            self.write(line(*key, action.message))

    def end_pass(self) -> None:
        """Say once which waiting lines of the previous pass this one no longer reported."""
        for key, messages in self._before.items():
            if key not in self._now and key not in self._acted:
                self.write(line(*key, f"cleared (was: {messages[-1]})"))
        self._before, self._now, self._acted = self._now, {}, set()
