"""A node's answering session: one long-lived command on the node's connection that answers a
request line at a time (`exec_wrapper.session_command`), so a warm poll is one request written
and one framed answer read, with no channel opened, no exec request and no remote shell started.

The SSH transport (`SshTransport.ask`) starts it, keeps it between calls and drops it at the first
doubt: an answer cut short, late or out of its framing ends the session (the next call starts a
new one); a partial answer is never returned.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from gpuctl.adapters.exec_wrapper import PGID_MARK, AnswerFramingError, take_answer
from gpuctl.adapters.ssh._exec import wait_readable

if TYPE_CHECKING:
    from paramiko import Channel, SSHClient

_READ_CHUNK = 1 << 16
_MAX_PREAMBLE = 4096  # what a login shell may print before the process group line


class Cut(Exception):
    """The session ended (EOF, channel or connection closed) before the answer was whole."""

    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received  # bytes of this answer that came


class Late(Exception):
    """The deadline passed before the answer was whole."""


class Session:
    """One running answering loop on one node's connection. Not thread-safe: the transport
    lets one caller at a time talk to it."""

    __slots__ = ("buf", "chan", "client", "command", "pgid", "received")

    def __init__(self, client: SSHClient, chan: Channel, command: str) -> None:
        self.client = client
        self.chan = chan
        self.command = command
        self.buf = bytearray()
        self.pgid: int | None = None  # the loop's process group on the node, once it said
        self.received = 0  # bytes come since the last request

    def alive(self) -> bool:
        chan = self.chan
        return not (chan.closed or chan.eof_received or chan.exit_status_ready())

    def close(self) -> None:
        self.chan.close()

    def exchange(self, request: bytes, deadline: float, max_bytes: int) -> tuple[int, bytes]:
        """Write one request line, read its answer: (exit status, answer bytes)."""
        self.send(request)
        while True:
            answer = self.take(max_bytes)
            if answer is not None:
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Late
            wait_readable(self.chan, remaining)

    def send(self, request: bytes) -> None:
        self.received = 0
        try:
            self.chan.sendall(request)
        except (OSError, EOFError):
            raise Cut(0) from None

    def take(self, max_bytes: int) -> tuple[int, bytes] | None:
        """The answer if all of it came, without waiting; None while more is to come."""
        chan = self.chan
        eof = chan.eof_received or chan.closed  # read before draining: data precedes EOF
        while chan.recv_ready():
            data = chan.recv(_READ_CHUNK)
            self.received += len(data)
            self.buf += data
        while chan.recv_stderr_ready():  # the loop's own complaints: not part of an answer
            chan.recv_stderr(_READ_CHUNK)
        if self.pgid is None:
            self._take_pgid()
        if self.pgid is not None:
            answer = take_answer(self.buf, max_bytes)
            if answer is not None:
                return answer
        if eof:
            raise Cut(self.received)
        return None

    def _take_pgid(self) -> None:
        """Drop what precedes the wrapper's process group line, and that line, once it came."""
        start = self.buf.find(PGID_MARK)
        end = self.buf.find(b"\n", start) if start >= 0 else -1
        if end < 0:
            if len(self.buf) > _MAX_PREAMBLE:
                raise AnswerFramingError("the session did not start (no process group line)")
            return
        number = self.buf[start + len(PGID_MARK) : end]
        self.pgid = int(number) if number.isdigit() else -1
        del self.buf[: end + 1]


class Stale(Exception):
    """A reused connection turned out dead before the command started."""


class Conn:
    """One node's connection: opened under `lock`, shared by up to `slots` concurrent channels
    and by its answering session (`ask`), which one caller at a time holds (`asking`)."""

    def __init__(self, per_host_limit: int) -> None:
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(per_host_limit)
        self.client: SSHClient | None = None
        self.asking = threading.Lock()
        self.session: Session | None = None  # under `asking`

    def drop(self, client: SSHClient | None) -> None:
        with self.lock:
            if client is not None and self.client is client:
                self.client = None
        if client is not None:
            client.close()  # and with it the channels on it: a session's too
