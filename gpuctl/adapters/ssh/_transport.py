"""The SSH transport (paramiko): verified host keys, deadlines on every wait, reused connections.

One connection per node, opened on first use and kept for later calls (a TUI polls the same nodes
every few seconds: no re-handshake, no re-auth). A node behind jump hosts (ssh_config's ProxyJump
or the inventory's `jump`, resolved by `_route`) is reached over a `direct-tcpip` channel of its
jump host's connection, which is opened once and shared by every node behind it. Each `run` is
one channel on the node's connection; a per-host semaphore bounds concurrent channels. A
connection that died in between (node rebooted, sshd restarted) is noticed and reopened once.
`ask` (`_asks`) goes through the node's answering session instead: one more channel, kept.

Deadlines: `node.connect_timeout_s` covers TCP connect, SSH banner, key exchange and auth together
(see `_connect`); `timeout_s` covers the exec request and reading the output.
Both are enforced by gpuctl (socket timeouts, select with a monotonic deadline, and a watchdog
thread for the waits paramiko cannot bound); a command past its deadline is killed on the node
(see `_exec` and `gpuctl.adapters.exec_wrapper`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import paramiko

from gpuctl.adapters import exec_wrapper
from gpuctl.adapters.protocols import ExecResult
from gpuctl.adapters.ssh import _sftp
from gpuctl.adapters.ssh import known_hosts as kh
from gpuctl.adapters.ssh._asks import SessionAsks
from gpuctl.adapters.ssh._connect import (
    PhaseTimeout,
    error_reason,
    fetch_host_key,
    login_user,
    open_client,
    open_socket,
    open_tunnel,
)
from gpuctl.adapters.ssh._exec import Watchdog, read_channel, send_stdin
from gpuctl.adapters.ssh._keys import KeyCache
from gpuctl.adapters.ssh._route import Leg, Route, SshConfigs
from gpuctl.adapters.ssh._session import Conn as _Conn
from gpuctl.adapters.ssh._session import Stale as _Stale
from gpuctl.core.model import NodeSpec
from gpuctl.errors import TransportError

DEFAULT_PER_HOST_LIMIT = 4
KILL_TIMEOUT_S = 2.0
# How often an idle connection's reader thread wakes (paramiko's default, 0.1 s, costs about
# 1.2 ms of CPU per connection per second: 6 cores for 5,000 idle nodes). Nothing of gpuctl's
# waits on it: every deadline is gpuctl's own, a closed peer wakes the reader at once, and
# close() does not wait for the thread.
IDLE_WAKE_S = 5.0


def _leg_key(leg: Leg) -> tuple[Any, ...]:
    node = leg.node
    return (node.host, node.port, node.user, node.key_file, leg.identity_files, leg.agent,
            node.known_hosts, node.connect_timeout_s, leg.key_alias)  # fmt: skip


class SshTransport(SessionAsks):
    """`gpuctl.adapters.protocols.Transport` over SSH. Thread-safe; call `close()` when done."""

    def __init__(
        self,
        *,
        own_known_hosts: Path,
        system_known_hosts: Sequence[Path],
        per_host_limit: int = DEFAULT_PER_HOST_LIMIT,
        ssh_config: Path | None = None,
    ) -> None:
        """`own_known_hosts`: gpuctl's own file (`gpuctl hosts trust` records keys there);
        `system_known_hosts`: the OpenSSH files the operator already trusts; `ssh_config`: the
        operator's ssh_config for nodes whose inventory names none (None: read none). The
        caller says where they are (`gpuctl.config.paths`): an adapter does not read the
        environment."""
        self._own_known_hosts = own_known_hosts
        self._system = tuple(system_known_hosts)
        self._per_host_limit = per_host_limit
        self._known = kh.KnownHostsFiles()
        self._keys = KeyCache()
        self._configs = SshConfigs(ssh_config)
        self._watchdog = Watchdog()
        self._lock = threading.Lock()
        self._conns: dict[tuple[Any, ...], _Conn] = {}
        self.connects = 0  # connections opened so far (reuse is visible in tests and benchmarks)
        self.sessions_started = 0  # answering sessions started so far (`ask`)
        self._session_commands: dict[tuple[str, float], str] = {}

    # -- the protocol ----------------------------------------------------------------------

    def run(
        self,
        node: NodeSpec,
        command: str,
        *,
        timeout_s: float,
        max_output_bytes: int = 8 << 20,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run `command` on the node; `stdin` (if any) is written to it, then its stdin closed."""
        start = time.monotonic()
        route = self.route(node)
        conn = self._conn(route.legs, node.name)
        wait_s = node.connect_timeout_s + timeout_s
        if not conn.slots.acquire(timeout=wait_s):
            raise PhaseTimeout(
                f"{kh.node_where(node)}: timeout (exec): no free session within {wait_s:g}s",
                phase="exec",
            )
        try:
            for attempt in range(2):
                client, fresh = self._client(route, conn)
                try:
                    return self._exec(
                        node, conn, client, command, timeout_s, max_output_bytes, start, stdin
                    )
                except _Stale:
                    conn.drop(client)
                    if fresh or attempt:
                        raise TransportError(
                            f"{kh.node_where(node)}: the connection closed before the command "
                            "started"
                        ) from None
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            conn.slots.release()

    # -- folder copies (SFTP) ----------------------------------------------------------------

    def get_tree(
        self,
        node: NodeSpec,
        remote_dir: str,
        local_dir: str | Path,
        *,
        timeout_s: float,
        max_bytes: int,
        last: Sequence[str] = (),
    ) -> int:
        """Copy a folder from the node to `local_dir` (which must not exist), atomically: into a
        temporary sibling, the `last` names last, then one rename. Returns the bytes copied."""
        local = Path(local_dir)
        return self._with_sftp(
            node,
            timeout_s,
            max_bytes,
            f"the copy of {remote_dir}",
            lambda sftp, limits: _sftp.download(sftp, remote_dir, local, limits, last),
        )

    def put_tree(
        self,
        node: NodeSpec,
        local_dir: str | Path,
        remote_dir: str,
        *,
        timeout_s: float,
        max_bytes: int,
        last: Sequence[str] = (),
    ) -> int:
        """Copy `local_dir` to a folder on the node (which must not exist), atomically like
        `get_tree`. A relative `remote_dir` is relative to the node user's home."""
        local = Path(local_dir)
        return self._with_sftp(
            node,
            timeout_s,
            max_bytes,
            f"the copy to {remote_dir}",
            lambda sftp, limits: _sftp.upload(sftp, local, remote_dir, limits, last),
        )

    def _with_sftp(
        self,
        node: NodeSpec,
        timeout_s: float,
        max_bytes: int,
        what: str,
        action: Callable[[paramiko.SFTPClient, _sftp.Limits], int],
    ) -> int:
        start = time.monotonic()
        limits = _sftp.Limits(
            deadline=start + node.connect_timeout_s + timeout_s,
            max_bytes=max_bytes,
            where=kh.node_where(node),
        )
        route = self.route(node)
        conn = self._conn(route.legs, node.name)
        if not conn.slots.acquire(timeout=max(0.0, limits.deadline - start)):
            raise PhaseTimeout(
                f"{limits.where}: timeout (exec): no free session for {what}", phase="exec"
            )
        channels: list[paramiko.Channel] = []

        def close_all() -> None:
            for chan in list(channels):
                chan.close()

        timer = self._watchdog.arm(limits.deadline, close_all)
        try:
            client, _fresh = self._client(route, conn)
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                conn.drop(client)
                raise TransportError(f"{limits.where}: the connection closed before {what}")
            sftp = _sftp.open_sftp(transport, limits, channels)
            try:
                return action(sftp, limits)
            finally:
                sftp.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _sftp.translate(exc, limits, what) from None
        finally:
            timer.cancel()
            close_all()
            conn.slots.release()

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.drop(conn.client)
        self._watchdog.close()

    def __enter__(self) -> SshTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- known hosts -----------------------------------------------------------------------

    def route(self, node: NodeSpec) -> Route:
        """How the node is reached: its jump hosts and itself, resolved through ssh_config."""
        return self._configs.route(node)

    def known_hosts_files(self, node: NodeSpec) -> tuple[Path, ...]:
        """Where `node`'s key is looked up, in order."""
        own = (self._own_known_hosts,)
        return tuple(Path(p) for p in node.known_hosts) + own + self._system

    def recorded_keys(self, node: NodeSpec) -> tuple[kh.KnownKey, ...]:
        """The keys recorded for the node under the name it is dialled by (ssh_config's
        HostName and Port, or its HostKeyAlias, as OpenSSH looks it up, through jump hosts
        too)."""
        return self._recorded(self.route(node).target)

    def recorded_route_keys(
        self, node: NodeSpec
    ) -> tuple[tuple[Leg, tuple[kh.KnownKey, ...]], ...]:
        """Per leg of the node's route (its jump hosts first, then the node), the keys recorded
        for it under the name it is dialled by (or its HostKeyAlias). No network."""
        return tuple((leg, self._recorded(leg)) for leg in self.route(node).legs)

    def _recorded(self, leg: Leg) -> tuple[kh.KnownKey, ...]:
        return self._known.for_host(self.known_hosts_files(leg.node), leg.key_name)

    def fetch_route_keys(
        self, node: NodeSpec
    ) -> tuple[tuple[Leg, str, str, paramiko.PKey, tuple[kh.KnownKey, ...]], ...]:
        """The keys the node's jump hosts and the node offer, first hop first: (leg, key type,
        fingerprint, key, the keys recorded for it). Nothing is authenticated to the leg whose
        key is fetched; a jump host is logged in to (its key verified) to reach the next leg,
        so the list stops at the first leg whose key is not trusted yet."""
        route = self.route(node)
        found = []
        for i, leg in enumerate(route.legs):
            recorded = self._recorded(leg)
            timeout_s = leg.node.connect_timeout_s
            sock: Any = None
            if i:
                via, _fresh = self._client(route, self._conn(route.legs[:i]), upto=i - 1)
                deadline = time.monotonic() + timeout_s
                sock = open_tunnel(via, route.legs[i - 1].node, leg.node, deadline)
            key_type, fp, key = fetch_host_key(leg.node, timeout_s, prefer=recorded, sock=sock)
            found.append((leg, key_type, fp, key, recorded))
            if kh.verdict(recorded, key_type, key.asbytes()).trusted is None:
                break
        return tuple(found)

    # -- connections -----------------------------------------------------------------------

    def _conn(self, legs: tuple[Leg, ...], node: str = "") -> _Conn:
        """The connection of the last of `legs` (reached through the ones before it): the
        node's own (named), or a jump host's (`node` empty), shared by every node behind it."""
        key = (node, tuple(_leg_key(leg) for leg in legs))
        with self._lock:
            conn = self._conns.get(key)
            if conn is None:
                conn = self._conns[key] = _Conn(self._per_host_limit)
            return conn

    def _client(
        self, route: Route, conn: _Conn, *, upto: int | None = None
    ) -> tuple[paramiko.SSHClient, bool]:
        """The open connection of `route.legs[upto]` (default: the node), or a new one (True)
        when there was none or it died; a jump host's first, when the leg is behind one."""
        i = len(route.legs) - 1 if upto is None else upto
        leg = route.legs[i]
        if not conn.lock.acquire(timeout=leg.node.connect_timeout_s * 2 * (i + 1)):
            raise PhaseTimeout(
                f"{kh.node_where(leg.node)}: timeout (connect): another connect to it hangs",
                phase="connect",
            )
        try:
            client = conn.client
            if client is not None:
                transport = client.get_transport()
                if transport is not None and transport.is_active():
                    return client, False
                conn.client = None
                client.close()
            via = None
            if i:
                via, _fresh = self._client(route, self._conn(route.legs[:i]), upto=i - 1)
            conn.client = self._connect(leg, via, route.legs[i - 1] if i else None)
            transport = conn.client.get_transport()
            if transport is not None:  # paramiko's reader wakes every 0.1 s by default
                transport.sock.settimeout(IDLE_WAKE_S)
            with self._lock:
                self.connects += 1
            return conn.client, True
        finally:
            conn.lock.release()

    def _connect(
        self, leg: Leg, via: paramiko.SSHClient | None, via_leg: Leg | None
    ) -> paramiko.SSHClient:
        node = leg.node
        deadline = time.monotonic() + node.connect_timeout_s
        login_user(node)  # before the network: root only when the inventory allows it
        pkey = self._keys.load(node)  # before the network: a bad key file fails fast
        key_files = self._keys.identity_files(node, leg.identity_files)
        if via is None or via_leg is None:
            sock: Any = open_socket(node, deadline)
        else:
            sock = open_tunnel(via, via_leg.node, node, deadline)
        return open_client(
            node,
            sock,
            deadline=deadline,
            pkey=pkey,
            recorded=self._recorded(leg),
            watchdog=self._watchdog,
            key_files=key_files,
            agent=leg.agent,
            trust=leg.trust,
            key_alias=leg.key_alias,
        )

    # -- exec ------------------------------------------------------------------------------

    def _exec(
        self,
        node: NodeSpec,
        conn: _Conn,
        client: paramiko.SSHClient,
        command: str,
        timeout_s: float,
        max_output_bytes: int,
        start: float,
        stdin: bytes | None = None,
    ) -> ExecResult:
        where = kh.node_where(node)
        deadline = time.monotonic() + timeout_s
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise _Stale
        try:
            chan = transport.open_session(timeout=max(0.001, timeout_s))
        except (paramiko.SSHException, OSError, EOFError):
            if time.monotonic() < deadline:
                raise _Stale from None
            conn.drop(client)
            raise self._exec_timeout(node, timeout_s) from None
        try:
            timer = self._watchdog.arm(deadline, chan.close)
            try:
                chan.exec_command(exec_wrapper.wrap_command(command, timeout_s))
                if stdin:
                    send_stdin(chan, stdin)
                chan.shutdown_write()  # the command gets EOF on stdin, never waits for input
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if timer.cancel():  # sshd never answered the exec request: the node hangs
                    conn.drop(client)
                    raise self._exec_timeout(node, timeout_s) from None
                raise TransportError(f"{where}: exec failed: {error_reason(exc)}") from None
            timer.cancel()
            out = read_channel(chan, deadline, max_output_bytes)
        finally:
            chan.close()
        if not out.finished:
            killed = self._kill(node, client, out.pgid)
            if not out.truncated:
                note = "killed on the node" if killed else "could not kill it on the node"
                raise PhaseTimeout(
                    f"{where}: timeout (read): the command ran past {timeout_s:g}s; {note}",
                    phase="read",
                )
        return ExecResult(
            exit_code=out.exit_code,
            stdout=bytes(out.stdout),
            stderr=bytes(out.stderr),
            duration_s=time.monotonic() - start,
            truncated=out.truncated,
        )

    @staticmethod
    def _exec_timeout(node: NodeSpec, timeout_s: float) -> PhaseTimeout:
        return PhaseTimeout(
            f"{kh.node_where(node)}: timeout (exec): sshd did not start the command within "
            f"{timeout_s:g}s",
            phase="exec",
            hint="the node or its sshd hangs",
        )

    def _kill(self, node: NodeSpec, client: paramiko.SSHClient, pgid: int | None) -> bool:
        """Kill the command's process group on the node with a second, short exec."""
        transport = client.get_transport()
        if pgid is None or pgid <= 0 or transport is None or not transport.is_active():
            return False
        deadline = time.monotonic() + KILL_TIMEOUT_S
        try:
            chan = transport.open_session(timeout=KILL_TIMEOUT_S)
        except (paramiko.SSHException, OSError, EOFError):
            return False
        timer = self._watchdog.arm(deadline, chan.close)
        try:
            chan.exec_command(exec_wrapper.kill_command(pgid))
            chan.shutdown_write()
            return chan.status_event.wait(max(0.0, deadline - time.monotonic()))
        except (paramiko.SSHException, OSError, EOFError):
            return False
        finally:
            timer.cancel()
            chan.close()
