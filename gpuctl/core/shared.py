"""What operators share through the store instead of each polling the fleet (pure).

The control loop publishes each poll's `FleetSnapshot` into the store (`PublishedFleet`: the
snapshot's JSON, zlib-compressed, with when it was taken and by whom); `status`, `dash` and
`metrics serve` read it while it is fresh (`fresh`: newer than `STALE_PASSES` of the loop's
interval, never older than `MAX_AGE_S`) and poll the nodes themselves only when it is not, or when
asked to (`--live`). So N operators cost the fleet one poll, not N.
"""

from __future__ import annotations

import dataclasses
import json
import zlib

from gpuctl.core.model import FleetSnapshot, fleet_from_dict, fleet_to_dict
from gpuctl.core.timefmt import ago

STALE_PASSES = 3.0  # a snapshot older than this many of the loop's intervals is stale ...
MIN_AGE_S = 10.0  # ... but one younger than this never is (a loop polling every second) ...
MAX_AGE_S = 300.0  # ... and one older than this always is (a loop that polls hourly)
KEEP = 3  # published snapshots the store keeps (the newest)


@dataclasses.dataclass(frozen=True, slots=True)
class PublishedFleet:
    """One poll of the fleet as the control loop published it."""

    taken_at: float  # when the poll began (the snapshot's own time)
    published_at: float
    publisher: str  # who polled: "gpuctl" (the loop) or the controller's holder
    interval_s: float  # the loop's pass interval: how soon the next one is due
    nodes: int
    body: bytes  # `encode(snapshot)`
    id: int | None = None

    def snapshot(self) -> FleetSnapshot:
        return decode(self.body)


def encode(snapshot: FleetSnapshot) -> bytes:
    """The snapshot as compact JSON (`fleet_to_dict`), zlib-compressed: a 2,000-node, 8-GPU
    fleet is a few hundred KiB."""
    text = json.dumps(fleet_to_dict(snapshot), separators=(",", ":"), allow_nan=False)
    return zlib.compress(text.encode("utf-8"), 6)


def decode(body: bytes) -> FleetSnapshot:
    """Inverse of `encode`; ValueError (zlib.error, JSON errors, missing keys) when damaged."""
    try:
        return fleet_from_dict(json.loads(zlib.decompress(body).decode("utf-8")))
    except (zlib.error, KeyError, TypeError) as exc:
        raise ValueError(f"the published snapshot cannot be read: {exc}") from exc


def max_age_s(interval_s: float) -> float:
    """How old a snapshot published by a loop passing every `interval_s` may be and still be
    read as the fleet now."""
    return min(MAX_AGE_S, max(MIN_AGE_S, STALE_PASSES * interval_s))


def fresh(published: PublishedFleet | None, now: float, *, live: bool | None = None) -> bool:
    """Whether `published` may stand for a poll now: young enough (`max_age_s`), and taken by a
    loop that still runs (`live`: what the store knows of its lease; None: unknown, the age
    alone decides)."""
    if published is None or live is False:
        return False
    age = now - published.taken_at
    return -MIN_AGE_S <= age <= max_age_s(published.interval_s)


def seen_line(published: PublishedFleet, now: float) -> str:
    """`fleet as the controller saw it 4s ago` (what status, dash and metrics say they show)."""
    return f"fleet as the controller saw it {ago(published.taken_at, now)}"
