"""`SshTransport.ask` and `ask_warm`: a node's probe through its answering session
(`_session.Session`), started on the node's connection on first use and kept between calls.

A mixin of the transport, apart so that the transport's module stays readable: it uses the
transport's connections (`_conn`, `_client`), its watchdog and its kill of a process group.
"""

from __future__ import annotations

import heapq
import math
import select
import threading
import time
from collections.abc import Sequence

import paramiko

from gpuctl.adapters import exec_wrapper
from gpuctl.adapters.protocols import ExecResult
from gpuctl.adapters.ssh import known_hosts as kh
from gpuctl.adapters.ssh._connect import PhaseTimeout, error_reason
from gpuctl.adapters.ssh._exec import Watchdog
from gpuctl.adapters.ssh._route import Leg, Route
from gpuctl.adapters.ssh._session import Conn, Cut, Late, Session, Stale
from gpuctl.core.model import NodeSpec
from gpuctl.errors import TransportError


class SessionAsks:
    """What `SshTransport` adds for answering sessions (see the module's doc)."""

    _lock: threading.Lock
    _watchdog: Watchdog
    _session_commands: dict[tuple[str, float], str]
    sessions_started: int

    # the transport's own, used here
    def route(self, node: NodeSpec) -> Route:
        raise NotImplementedError

    def _conn(self, legs: tuple[Leg, ...], node: str = "") -> Conn:
        raise NotImplementedError

    def _client(
        self, route: Route, conn: Conn, *, upto: int | None = None
    ) -> tuple[paramiko.SSHClient, bool]:
        raise NotImplementedError

    def _kill(self, node: NodeSpec, client: paramiko.SSHClient, pgid: int | None) -> bool:
        raise NotImplementedError

    @staticmethod
    def _exec_timeout(node: NodeSpec, timeout_s: float) -> PhaseTimeout:
        raise NotImplementedError

    def ask(
        self,
        node: NodeSpec,
        program: str,
        request: str,
        *,
        timeout_s: float,
        max_output_bytes: int = 8 << 20,
    ) -> ExecResult:
        """`program` run with `request` as its `$1`, by the node's answering session: started
        on first use (`exec_wrapper.session_command`), kept for later calls with the same
        program, so a warm call writes one line and reads one framed answer. `program` must
        bound its own steps (it starts with `exec_wrapper.SELF_BOUNDED`); `request` is one
        printable ASCII line. An answer cut short is a `TransportError`, a late one a timeout
        (the session's processes killed on the node): never a partial answer."""
        if not (request.isascii() and request.isprintable()):
            raise ValueError("a session request is one line of printable ASCII")
        start = time.monotonic()
        where = kh.node_where(node)
        route = self.route(node)
        conn = self._conn(route.legs, node.name)
        command = self._session_command(program, timeout_s)
        wait_s = node.connect_timeout_s + timeout_s
        if not conn.asking.acquire(timeout=wait_s):
            raise PhaseTimeout(
                f"{where}: timeout (exec): the node's session stayed busy for {wait_s:g}s",
                phase="exec",
            )
        try:
            for attempt in range(2):
                client, fresh = self._client(route, conn)
                session = conn.session
                started = False
                if (
                    session is None
                    or session.client is not client
                    or not session.alive()
                    or session.command != command
                ):
                    if session is not None:
                        session.close()
                    conn.session = None
                    try:
                        session = self._start_session(node, conn, client, command, timeout_s)
                    except Stale:
                        conn.drop(client)
                        if fresh or attempt:
                            raise TransportError(
                                f"{where}: the connection closed before the command started"
                            ) from None
                        continue
                    conn.session, started = session, True
                deadline = time.monotonic() + timeout_s
                try:
                    status, answer = session.exchange(
                        request.encode("ascii") + b"\n", deadline, max_output_bytes
                    )
                except (Cut, Late, exec_wrapper.AnswerFramingError) as exc:
                    failure = self._session_failed(node, conn, client, session, exc, timeout_s)
                    if failure is None and not started and not attempt:
                        continue  # the loop ended since the last call: start it again, once
                    raise failure or self._cut(node, 0) from None
                return ExecResult(
                    exit_code=status,
                    stdout=answer,
                    stderr=b"",
                    duration_s=time.monotonic() - start,
                )
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            conn.asking.release()

    def ask_warm(
        self,
        asks: Sequence[tuple[NodeSpec, str]],
        program: str,
        *,
        max_output_bytes: int = 8 << 20,
    ) -> dict[int, ExecResult | TransportError]:
        """`ask` every node of `asks` (node, request) whose answering session for `program` is
        up and idle, all together from this thread: every request written first, then the
        answers read as they come, one `select` over all of them (a thread per node costs
        more CPU than the answers). By index in `asks`; the nodes left out (no live session,
        or one in use) are the caller's to `ask` one by one. Each node's deadline is its
        `command_timeout_s`, as `ask`'s `timeout_s`."""
        out: dict[int, ExecResult | TransportError] = {}
        taken: dict[paramiko.Channel, tuple[int, NodeSpec, Conn, Session, float, float]] = {}
        try:
            for i, (node, request) in enumerate(asks):
                conn = self._conn(self.route(node).legs, node.name)
                session = conn.session
                if session is None or not conn.asking.acquire(blocking=False):
                    continue
                timeout_s = node.command_timeout_s
                if (
                    conn.session is not session
                    or conn.client is not session.client
                    or not session.alive()
                    or session.command != self._session_command(program, timeout_s)
                ):
                    conn.asking.release()
                    continue
                start = time.monotonic()
                try:
                    session.send(request.encode("ascii") + b"\n")
                except Cut:
                    conn.asking.release()  # `ask` starts it again
                    continue
                taken[session.chan] = (i, node, conn, session, start, start + timeout_s)
            # poll(), not select(): a fleet's descriptors pass select's 1024. A wake looks at
            # the channels it names (and at every one only once the first deadline is past)
            poller = select.poll()
            by_fd, fd_of = {}, {}
            deadlines: list[
                tuple[float, int]
            ] = []  # (deadline, fd): the soonest first; answered ones skipped lazily
            for chan, entry in taken.items():
                fd = fd_of[chan] = chan.fileno()
                by_fd[fd] = chan
                poller.register(fd, select.POLLIN)
                heapq.heappush(deadlines, (entry[5], fd))
            ready = list(taken)
            while taken:
                while by_fd.get(deadlines[0][1]) not in taken:
                    heapq.heappop(deadlines)
                now = time.monotonic()
                if now >= deadlines[0][0]:
                    ready = list(taken)
                for chan in ready:
                    found = taken.get(chan)
                    if found is None:
                        continue
                    i, node, conn, session, begun, deadline = found
                    try:
                        answer = session.take(max_output_bytes)
                        if answer is None and now >= deadline:
                            raise Late
                    except (Cut, Late, exec_wrapper.AnswerFramingError) as e:
                        answer = None
                        out[i] = self._session_failed(
                            node, conn, session.client, session, e, node.command_timeout_s
                        ) or self._cut(node, 0)
                    else:
                        if answer is None:
                            continue
                        status, body = answer
                        out[i] = ExecResult(status, body, b"", time.monotonic() - begun)
                    del taken[chan]
                    poller.unregister(fd_of[chan])
                    conn.asking.release()
                if taken:
                    while by_fd.get(deadlines[0][1]) not in taken:
                        heapq.heappop(deadlines)
                    wait_s = deadlines[0][0] - time.monotonic()
                    events = poller.poll(max(0, math.ceil(wait_s * 1000)))
                    ready = [by_fd[fd] for fd, _event in events]
        finally:
            for entry in taken.values():
                entry[2].asking.release()
        return out

    def _session_failed(
        self,
        node: NodeSpec,
        conn: Conn,
        client: paramiko.SSHClient,
        session: Session,
        exc: Exception,
        timeout_s: float,
    ) -> TransportError | None:
        """Drop a session that failed; the error to raise, None for a session found ended
        before any of its answer came (which the caller may start again, once)."""
        conn.session = None
        session.close()
        if isinstance(exc, Cut):
            return self._cut(node, exc.received) if exc.received else None
        killed = self._kill(node, client, session.pgid)
        note = "killed on the node" if killed else "could not kill it on the node"
        where = kh.node_where(node)
        if isinstance(exc, exec_wrapper.AnswerFramingError):
            return TransportError(f"{where}: {exc}; session {note}")
        return PhaseTimeout(
            f"{where}: timeout (read): the command ran past {timeout_s:g}s; {note}", phase="read"
        )

    @staticmethod
    def _cut(node: NodeSpec, received: int) -> TransportError:
        return TransportError(
            f"{kh.node_where(node)}: the session ended before the answer was whole "
            f"({received} bytes of it came)"
        )

    def _session_command(self, program: str, timeout_s: float) -> str:
        key = (program, timeout_s)
        command = self._session_commands.get(key)
        if command is None:
            command = exec_wrapper.wrap_command(exec_wrapper.session_command(program), timeout_s)
            with self._lock:
                if len(self._session_commands) > 16:
                    self._session_commands.clear()
                self._session_commands[key] = command
        return command

    def _start_session(
        self,
        node: NodeSpec,
        conn: Conn,
        client: paramiko.SSHClient,
        command: str,
        timeout_s: float,
    ) -> Session:
        """Open a channel and start the answering loop in it, under the exec deadline."""
        deadline = time.monotonic() + timeout_s
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise Stale
        try:
            chan = transport.open_session(timeout=max(0.001, timeout_s))
        except (paramiko.SSHException, OSError, EOFError):
            if time.monotonic() < deadline:
                raise Stale from None
            conn.drop(client)
            raise self._exec_timeout(node, timeout_s) from None
        timer = self._watchdog.arm(deadline, chan.close)
        try:
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            if timer.cancel():  # sshd never answered the exec request: the node hangs
                conn.drop(client)
                raise self._exec_timeout(node, timeout_s) from None
            raise TransportError(
                f"{kh.node_where(node)}: exec failed: {error_reason(exc)}"
            ) from None
        timer.cancel()
        with self._lock:
            self.sessions_started += 1
        return Session(client, chan, command)
