"""Which of the store's events the dashboard lists: all of them, only some kinds (`:events
drain,failover`), or all but some (`:events -checkpoint`, the `e` key), so that drains and
failovers are not buried under the checkpoints that make half the audit log.

Kinds asked for by name are read from the store by kind, so the newest of them are found however
many other events came after them. Hidden kinds (a prefix: `-checkpoint` hides `checkpoint`,
`checkpoint_skipped` and `checkpoint_invalid`) are skipped over the store's newest events, up to
`SCAN_MAX` of them.
"""

from __future__ import annotations

import dataclasses
import re

from gpuctl.adapters.protocols import Store
from gpuctl.core.jobs.model import Event
from gpuctl.errors import UsageError

SCAN_MAX = 5000  # events looked through for the ones a hiding filter keeps
CHECKPOINT_KINDS = "checkpoint"  # the prefix of checkpoint, checkpoint_skipped, checkpoint_invalid
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclasses.dataclass(frozen=True, slots=True)
class EventFilter:
    """`only`: the kinds listed (none: every kind); `hide`: kind prefixes left out."""

    only: tuple[str, ...] = ()
    hide: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.only or self.hide)

    def keeps(self, kind: str) -> bool:
        if self.only and kind not in self.only:
            return False
        return not any(kind.startswith(prefix) for prefix in self.hide)

    def describe(self) -> str:
        """As typed after `:events` (`drain,failover`, `-checkpoint`); `all` when inactive."""
        words = [*self.only, *(f"-{h}" for h in self.hide)]
        return ",".join(words) or "all"


ALL_EVENTS = EventFilter()
NO_CHECKPOINTS = EventFilter(hide=(CHECKPOINT_KINDS,))


def parse_event_filter(text: str) -> EventFilter:
    """`drain,failover` (only those kinds), `-checkpoint` (all but kinds starting so), both
    mixed, or `all` / nothing (every kind). Commas or spaces separate the words."""
    words = [w for w in re.split(r"[,\s]+", text.strip().lower()) if w]
    if words in ([], ["all"]):
        return ALL_EVENTS
    only: list[str] = []
    hide: list[str] = []
    for word in words:
        hidden = word.startswith(("-", "!"))
        kind = word[1:] if hidden else word
        if not _KIND.fullmatch(kind):
            raise UsageError(
                f"events filter: {word!r} is not an event kind",
                hint="e.g. `:events drain,failover` or `:events -checkpoint`; `:events` shows all",
            )
        target = hide if hidden else only
        if kind not in target:
            target.append(kind)
    return EventFilter(tuple(only), tuple(hide))


def recent_events(
    store: Store, since: float, limit: int, event_filter: EventFilter = ALL_EVENTS
) -> tuple[Event, ...]:
    """The newest `limit` events since `since` that the filter keeps, newest first."""
    if event_filter.only:
        found = store.events(since=since, kinds=event_filter.only, limit=limit * 4)
        kept = [e for e in found if event_filter.keeps(e.kind)]
        return tuple(reversed(kept[-limit:]))
    if not event_filter.hide:
        return tuple(reversed(store.events(since=since, limit=limit)))
    scan = limit * 4
    while True:
        found = store.events(since=since, limit=scan)
        kept = [e for e in found if event_filter.keeps(e.kind)]
        if len(kept) >= limit or len(found) < scan or scan >= SCAN_MAX:
            return tuple(reversed(kept[-limit:]))
        scan = min(SCAN_MAX, scan * 4)
