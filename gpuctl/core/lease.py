"""The controller's lease: one control loop acts at a time, elected through the store.

A `gpuctl controller run` holds the lease (holder, expiry, a fencing token) while it leads and
renews it every few seconds; a standby takes it when it has expired. The token grows by one at
each acquisition and is never reused, so a write carrying a `Fence` whose token is no longer the
lease's (or whose lease expired) is refused by the store: a leader that was paused past its lease
can no longer act on what it read before.

Times are the store's clock (the database server's, for PostgreSQL), seconds since the epoch.
"""

from __future__ import annotations

import dataclasses

LEASE_S = 15.0  # how long a lease lasts unless renewed
RENEW_S = 5.0  # how often the leader renews it
LEADER = "leader"
STANDBY = "standby"


@dataclasses.dataclass(frozen=True, slots=True)
class Fence:
    """What a leader's writes carry: the store refuses them once `token` is not the lease's."""

    holder: str
    token: int


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """The lease as the store holds it, read at the store's time `now`."""

    holder: str
    token: int
    acquired_at: float
    renewed_at: float
    expires_at: float
    last_pass_at: float | None
    now: float

    @property
    def live(self) -> bool:
        return self.expires_at > self.now

    @property
    def fence(self) -> Fence:
        return Fence(self.holder, self.token)

    def held_by(self, holder: str) -> bool:
        return self.live and self.holder == holder

    def to_dict(self) -> dict[str, object]:
        return {
            "leader": self.holder if self.live else None,
            "holder": self.holder,
            "token": self.token,
            "live": self.live,
            "acquired_at": self.acquired_at,
            "renewed_at": self.renewed_at,
            "lease_expires_at": self.expires_at,
            "last_pass_at": self.last_pass_at,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """A controller process as it registered itself (a heartbeat every renewal)."""

    holder: str
    role: str  # LEADER | STANDBY
    started_at: float
    seen_at: float
    expires_at: float  # gone when not seen again by then

    def to_dict(self) -> dict[str, object]:
        return {
            "holder": self.holder,
            "role": self.role,
            "started_at": self.started_at,
            "seen_at": self.seen_at,
        }


def lost_message(fence: Fence, current: Lease | None) -> str:
    """One line: why a leader's write was refused."""
    if current is not None and current.token != fence.token:
        return (
            f"lost the lease to {current.holder} (token {current.token} > {fence.token}): "
            "stepping down"
        )
    return f"the lease (token {fence.token}) expired before it was renewed: stepping down"
