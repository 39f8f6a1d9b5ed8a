"""The parts of an SSH exec that paramiko leaves to us: a deadline on every wait and a bounded
read of the command's output, process group first.

The command runs inside the wrapper of `gpuctl.adapters.exec_wrapper`, which prints its process
group before anything else. The client reads that number first; when its own deadline passes it
closes the channel and kills the group with a second, short exec (`kill_command`). coreutils
`timeout` on the node is the backstop when the client is gone (it stops the group a little after
the client's deadline).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuctl.adapters.exec_wrapper import PGID_MARK

if TYPE_CHECKING:
    from paramiko import Channel

_READ_CHUNK = 1 << 16


def send_stdin(chan: Channel, data: bytes) -> None:
    """Write `data` to the command's stdin. A command that ended (or whose channel the deadline
    closed) before reading it all is not an error here: its result, or the timeout, says what
    happened."""
    try:
        chan.sendall(data)
    except (OSError, EOFError):
        if not (chan.closed or chan.eof_received or chan.exit_status_ready()):
            raise


class Timer:
    __slots__ = ("_action", "_lock", "cancelled", "deadline", "fired")

    def __init__(self, deadline: float, action: Callable[[], None]) -> None:
        self.deadline = deadline
        self._action = action
        self._lock = threading.Lock()
        self.cancelled = False
        self.fired = False

    def fire(self) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.fired = True
        with contextlib.suppress(Exception):  # the action only closes things
            self._action()

    def cancel(self) -> bool:
        """Stop the timer; True if it had already fired."""
        with self._lock:
            self.cancelled = True
            return self.fired


class Watchdog:
    """One thread that runs `action` at `deadline` unless cancelled first: the deadline on waits
    that paramiko cannot bound itself (an exec request sshd never answers, a frozen handshake).
    One thread for all calls: warm rounds start no thread."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, deadline: float, action: Callable[[], None]) -> Timer:
        timer = Timer(deadline, action)
        with self._cv:
            heapq.heappush(self._heap, (deadline, next(self._seq), timer))
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._loop, name="gpuctl-ssh-watchdog", daemon=True
                )
                self._thread.start()
            if self._heap[0][2] is timer:  # else the thread already wakes earlier than this one
                self._cv.notify()
        return timer

    def _loop(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._closed:
                        return
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        timer = heapq.heappop(self._heap)[2]
                        break
                    self._cv.wait(self._heap[0][0] - now if self._heap else None)
            timer.fire()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify()


class ReadResult:
    __slots__ = ("exit_code", "finished", "pgid", "stderr", "stdout", "truncated")

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.pgid: int | None = None
        self.exit_code: int | None = None
        self.truncated = False
        self.finished = False  # the command ended (False: deadline passed or output cap hit)


def read_channel(chan: Channel, deadline: float, max_output_bytes: int) -> ReadResult:
    """Read stdout/stderr until the command exits, the deadline passes or a stream passes
    `max_output_bytes`. Never waits past `deadline`."""
    out = ReadResult()
    head = bytearray()  # stdout until the pgid line has been seen
    while True:
        eof = chan.eof_received  # read before draining: data always precedes EOF
        while chan.recv_ready():
            data = chan.recv(_READ_CHUNK)
            if out.pgid is None:
                head += data
                data = _take_pgid(out, head)
            _append(out.stdout, data, max_output_bytes, out)
        while chan.recv_stderr_ready():
            _append(out.stderr, chan.recv_stderr(_READ_CHUNK), max_output_bytes, out)
        if out.truncated:
            return out
        if eof or chan.closed:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return out
        wait_readable(chan, remaining)
    if out.pgid is None and head:  # no marker (odd login shell): keep what was printed
        _append(out.stdout, bytes(head), max_output_bytes, out)
    if chan.status_event.wait(max(0.0, deadline - time.monotonic())):
        out.finished = True
        out.exit_code = chan.exit_status if chan.exit_status >= 0 else None
    return out


def wait_readable(chan: Channel, timeout_s: float) -> None:
    """Wait until the channel has something to read (or `timeout_s` passes). poll(), not
    select(): a controller holding a fleet's connections has descriptors past select's 1024."""
    poller = select.poll()
    poller.register(chan.fileno(), select.POLLIN)
    poller.poll(max(0, math.ceil(timeout_s * 1000)))


def _take_pgid(out: ReadResult, head: bytearray) -> bytes:
    """Once the marker line is complete, record the pgid and return the rest of stdout."""
    start = head.find(PGID_MARK)
    if start < 0:
        if len(head) > 4096:  # the login shell printed a lot and no marker: give up on it
            out.pgid = -1
            rest = bytes(head)
            head.clear()
            return rest
        return b""
    end = head.find(b"\n", start)
    if end < 0:
        return b""
    number = head[start + len(PGID_MARK) : end]
    out.pgid = int(number) if number.isdigit() else -1
    rest = bytes(head[:start] + head[end + 1 :])
    head.clear()
    return rest


def _append(buf: bytearray, data: bytes, limit: int, out: ReadResult) -> None:
    room = limit - len(buf)
    if len(data) > room:
        data = data[: max(room, 0)]
        out.truncated = True
    buf += data
