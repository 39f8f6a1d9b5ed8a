"""The control loop as an elected service: `gpuctl controller run`.

Each controller process registers itself in the store (a heartbeat) and tries to take the lease
(`core.lease`). The one that holds it leads: its store carries the lease's fence, so every write
its passes make is refused once another controller has taken the lease (or the lease expired);
it renews the lease from a thread of its own every `renew_s`. The others are standbys: each
waits until the lease is due to expire, then tries to take it.

A leader whose write or renewal is refused steps down, says so in one line, and becomes a
standby. A store that fails (a database restarted, unreachable for a while) is retried with a
capped back-off; the pass's transactions are atomic, so nothing is left half-written. On a clean
stop (SIGTERM, Ctrl-C) the leader releases the lease, so a standby takes it at once.

A controller's passes do not take the loop lock (a leader stopped with SIGSTOP must not keep its
successor from acting: the fence does that job). `gpuctl reconcile` takes the loop lock and runs
no pass while a controller holds a live lease; a controller that takes the lease waits once for
the loop lock, so a reconcile pass in flight ends first.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from gpuctl.adapters.protocols import Store
from gpuctl.core.lease import LEADER, LEASE_S, RENEW_S, STANDBY, Lease
from gpuctl.errors import LeaseLost, StateError, StoreConflict, UsageError
from gpuctl.ops.loop import Reconciler

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
ROLE_TTL_FACTOR = 3.0  # a member is listed for this many renewals after its last heartbeat


def holder_name() -> str:
    """`host:pid:random`: unique per process, readable in `controller status`."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerSettings:
    lease_s: float = LEASE_S
    renew_s: float = RENEW_S
    interval_s: float = 5.0  # between the starts of two passes

    def check(self) -> ControllerSettings:
        if self.lease_s <= 0 or self.renew_s <= 0 or self.interval_s <= 0:
            raise UsageError("--lease, --renew and --interval must be positive")
        if self.renew_s >= self.lease_s:
            raise UsageError(
                f"--renew ({self.renew_s:g}s) must be shorter than --lease ({self.lease_s:g}s)",
                hint="renew a few times per lease: --lease 15 --renew 5",
            )
        return self


class Backoff:
    """Capped exponential back-off with jitter: 0.5 s, 1 s, 2 s, ... up to 30 s."""

    def __init__(self, first_s: float = BACKOFF_FIRST_S, max_s: float = BACKOFF_MAX_S) -> None:
        self.first_s, self.max_s, self.tries = first_s, max_s, 0

    def next_s(self) -> float:
        delay = min(self.max_s, self.first_s * 2.0**self.tries)
        self.tries += 1
        return delay * (0.75 + 0.5 * secrets.randbelow(1000) / 1000)

    def reset(self) -> None:
        self.tries = 0


class Controller:
    """One `gpuctl controller run` over a control loop (`Reconciler`) and its store."""

    def __init__(
        self,
        loop: Reconciler,
        *,
        holder: str,
        settings: ControllerSettings,
        say: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.holder = holder
        self.settings = settings.check()
        self.say = say
        self.token: int | None = None  # the lease's token while this controller leads
        self.passes = 0
        self._state = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._renewing = threading.Event()  # set while the renewer should run
        self._said_standby: tuple[str, int] | None = None

    @property
    def store(self) -> Store:
        return self.loop.store

    @property
    def leading(self) -> bool:
        return self.token is not None

    # --- the service ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Lead or stand by until `stop` is set; then give the lease back and leave."""
        backoff = Backoff()
        try:
            while not stop.is_set():
                try:
                    wait_s = self._step(stop)
                    backoff.reset()
                except LeaseLost as exc:
                    self._step_down(exc)
                    continue
                except StoreConflict as exc:  # a write lost a race: the next pass sees why
                    if self.leading:
                        wait_s = self.settings.interval_s
                        self.say(f"a pass was cut short: {exc.message}")
                    else:  # a standby's heartbeat waited on a lock: it ran no pass to cut
                        wait_s = self.settings.renew_s
                        self.say(f"the store was busy: {exc.message}; trying again in {wait_s:g}s")
                except StateError as exc:
                    wait_s = backoff.next_s()
                    self.say(f"the store failed: {exc.message}; trying again in {wait_s:.1f}s")
                stop.wait(wait_s)
        finally:
            self._stop_renewing()
            self._leave()

    def _step(self, stop: threading.Event) -> float:
        """One pass when leading (seconds to wait before the next), else one try to lead."""
        if not self.leading:
            try:
                lease = self.store.acquire_lease(self.holder, self.settings.lease_s)
            except StoreConflict as exc:  # a lock wait timed out (a leader stopped mid-write)
                wait_s = self.settings.renew_s  # a standby's cadence: it ran no pass to cut
                self.say(
                    f"could not take the lease: the store is busy ({exc.message}); "
                    f"retrying in {wait_s:g}s"
                )
                return wait_s
            if lease.holder != self.holder or not lease.live:
                self._stand_by(lease)
                # wake when the lease is due to expire, and heartbeat at least every renewal
                return max(0.05, min(self.settings.renew_s, lease.expires_at - lease.now + 0.05))
            self._lead(lease)
        started = time.monotonic()
        report = self.loop.run_once(stop, locked=False)
        if not report.interrupted:
            self.store.mark_pass()
            self.passes += 1
        return max(0.0, self.settings.interval_s - (time.monotonic() - started))

    def _stand_by(self, lease: Lease) -> None:
        self.store.heartbeat(self.holder, STANDBY, self.settings.renew_s * ROLE_TTL_FACTOR)
        seen = (lease.holder, lease.token)
        if seen != self._said_standby:
            self._said_standby = seen
            self.say(f"standby: {lease.holder} leads (token {lease.token})")

    def _lead(self, lease: Lease) -> None:
        self.store.set_fence(lease.fence)
        with self._state:
            self.token = lease.token
        self._said_standby = None
        self.store.heartbeat(self.holder, LEADER, self.settings.renew_s * ROLE_TTL_FACTOR)
        self.say(f"leading (token {lease.token}, lease {self.settings.lease_s:g}s)")
        self._start_renewing()
        try:  # a `gpuctl reconcile` pass in flight ends before this controller's first
            with self.store.loop_lock(self.settings.lease_s):
                pass
        except StoreConflict:
            self.say("a reconcile pass still holds the loop lock; leading anyway")

    def _step_down(self, exc: LeaseLost) -> None:
        """Stop acting; say why once (the renewer and the pass may both be refused)."""
        with self._state:
            if self.token is None:
                return
            self.token = None
        self.store.set_fence(None)
        self._renewing.clear()
        self.say(exc.message)

    def _leave(self) -> None:
        try:
            if self.leading:
                self.store.release_lease()
                self.say(f"released the lease (token {self.token})")
            self.store.leave(self.holder)
        except StateError:  # stopping anyway: the lease expires by itself
            pass

    # --- renewing the lease --------------------------------------------------------------------

    def _start_renewing(self) -> None:
        self._renewing.set()
        if self._renewer is not None and self._renewer.is_alive():
            return
        self._renewer = threading.Thread(target=self._renew, name="lease-renewer", daemon=True)
        self._renewer.start()

    def _stop_renewing(self) -> None:
        self._renewing.clear()

    def _renew(self) -> None:
        while True:
            time.sleep(self.settings.renew_s)
            if not self._renewing.is_set():
                if self.leading:
                    continue
                return
            try:
                self.store.renew_lease(self.settings.lease_s)
                self.store.heartbeat(self.holder, LEADER, self.settings.renew_s * ROLE_TTL_FACTOR)
            except LeaseLost as exc:
                self._step_down(exc)
                return
            except StateError as exc:
                self.say(f"cannot renew the lease: {exc.message}")


@dataclasses.dataclass(frozen=True, slots=True)
class ControllerStatus:
    """`gpuctl controller status`: who leads, until when, who stands by, the last pass."""

    lease: Lease | None
    members: tuple[dict[str, object], ...]

    @property
    def live(self) -> bool:
        return self.lease is not None and self.lease.live

    def to_dict(self) -> dict[str, object]:
        lease = self.lease
        standbys = [m for m in self.members if m["holder"] != (lease.holder if lease else None)]
        return {
            "leader": lease.holder if lease is not None and lease.live else None,
            "token": None if lease is None else lease.token,
            "lease_expires_at": None if lease is None else lease.expires_at,
            "last_pass_at": None if lease is None else lease.last_pass_at,
            "standbys": [m["holder"] for m in standbys if m["role"] == STANDBY],
            "members": list(self.members),
            "at": None if lease is None else lease.now,
        }


def status(store: Store) -> ControllerStatus:
    return ControllerStatus(store.lease(), tuple(m.to_dict() for m in store.members()))
