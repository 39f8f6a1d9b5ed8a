"""Opening SSH connections within a deadline: the TCP socket, the handshake with the host key
checked against known_hosts, and authentication; and the handshake alone, for `gpuctl hosts trust`
(`fetch_host_key`: the key the node offers, nothing authenticated).

`node.connect_timeout_s` covers TCP connect, SSH banner, key exchange and auth together. gpuctl
enforces it itself (a socket timeout, then a watchdog that shuts the socket down at the deadline);
paramiko's own timeouts are set a little later, as a backstop. `PhaseTimeout`, the transport's
timeout error, names the phase that ran out of time.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import socket
import time
from collections.abc import Sequence
from typing import Any

import paramiko

from gpuctl.adapters.ssh import known_hosts as kh
from gpuctl.adapters.ssh._exec import Watchdog
from gpuctl.core.model import NodeSpec
from gpuctl.errors import (
    AuthFailed,
    ConnectRefused,
    GpuctlError,
    TransportError,
    TransportTimeout,
    Unreachable,
)

# paramiko's transport threads log errors with tracebacks; with no handler anywhere, Python would
# print them on stderr (corrupting a TUI). They go to a logger of ours that has a NullHandler:
# silent by default, shown with --debug (which configures the root logger).
WIRE_LOG = "gpuctl.adapters.ssh.wire"
logging.getLogger(WIRE_LOG).addHandler(logging.NullHandler())


class PhaseTimeout(TransportTimeout):
    """A deadline passed; `phase` is connect, auth, exec or read."""

    def __init__(self, message: str, *, phase: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.phase = phase


class _Phase:
    """Which part of the connect is running, for the timeout message."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = "connect"


class _VerifyingPolicy(paramiko.MissingHostKeyPolicy):
    """Checks the offered key against known_hosts; raises HostKeyUnknown / HostKeyChanged.

    The client is given no host keys of its own, so paramiko asks this policy about every key;
    nothing is ever added (no AutoAddPolicy anywhere in gpuctl)."""

    def __init__(
        self,
        node: NodeSpec,
        recorded: Sequence[kh.KnownKey],
        phase: _Phase,
        trust: str,
        alias: str | None,
    ) -> None:
        self._node = node
        self._recorded = recorded
        self._phase = phase
        self._trust = trust
        self._alias = alias

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        kh.check(
            self._node,
            self._recorded,
            key.get_name(),
            key.asbytes(),
            trust=self._trust,
            alias=self._alias,
        )
        self._phase.value = "auth"


def login_user(node: NodeSpec) -> str:
    """The user gpuctl logs in to `node` as: the inventory's (or ssh_config's, resolved into
    `node.user`), else the local user's name (as ssh does). Root only when the inventory says
    `allow_root: true`: gpuctl run by root with no `user:` would otherwise run every job on the
    fleet as root without anyone choosing it."""
    user = node.user or getpass.getuser()
    if user == "root" and not node.allow_root:
        why = (
            "the inventory names no user and gpuctl runs as root"
            if node.user is None
            else "the ssh config or the jump host names User root"
        )
        raise AuthFailed(
            f"{kh.node_where(node)}: gpuctl would log in as root ({why}): refused",
            hint="set user: to the fleet's unprivileged account, or allow_root: true to mean it",
        )
    return user


def open_client(
    node: NodeSpec,
    sock: socket.socket | paramiko.Channel,
    *,
    deadline: float,
    pkey: paramiko.PKey | None,
    recorded: Sequence[kh.KnownKey],
    watchdog: Watchdog,
    key_files: Sequence[str] = (),
    agent: bool = True,
    trust: str | None = None,
    key_alias: str | None = None,
) -> paramiko.SSHClient:
    """Handshake and authenticate over `sock` (from `open_socket`, or `open_tunnel` through a
    jump host) by `deadline`; the host key must be one of `recorded` (`trust`: the node the
    hint names; `key_alias`: ssh_config's HostKeyAlias, which `recorded` was looked up by).
    Without `pkey`: `key_files` (ssh_config's IdentityFile), then, with `agent`, ssh-agent and
    the default keys."""
    where = kh.node_where(node)
    phase = _Phase()
    client = paramiko.SSHClient()
    client.set_log_channel(WIRE_LOG)
    policy = _VerifyingPolicy(node, recorded, phase, trust or node.name, key_alias)
    client.set_missing_host_key_policy(policy)
    timer = watchdog.arm(deadline, lambda: _shutdown(sock))
    slack = node.connect_timeout_s + 1.0  # paramiko's own timeouts: after our watchdog

    def factory(s: Any, /, **kwargs: Any) -> paramiko.Transport:
        transport = paramiko.Transport(s, disabled_algorithms=kwargs.get("disabled_algorithms"))
        opts = transport.get_security_options()
        opts.key_types = kh.preferred_key_types(recorded, list(opts.key_types))
        return transport

    user = login_user(node)
    try:
        client.connect(
            node.host,
            port=node.port,
            username=user,
            pkey=pkey,
            sock=sock,
            timeout=slack,
            banner_timeout=slack,
            auth_timeout=slack,
            channel_timeout=slack,
            # paramiko takes a list of files too (its annotation says one)
            key_filename=list(key_files) if pkey is None and key_files else None,  # type: ignore[arg-type]
            allow_agent=pkey is None and agent,
            look_for_keys=pkey is None and agent,
            transport_factory=factory,
        )
    except GpuctlError:
        timer.cancel()
        client.close()
        raise
    except paramiko.AuthenticationException as exc:
        fired = timer.cancel()
        client.close()
        if fired:
            raise _connect_timeout(node, phase.value) from None
        key = (
            f"key {node.key_file}"
            if node.key_file
            else f"IdentityFile {', '.join(key_files)}"
            if key_files
            else "the default keys"
        )
        raise AuthFailed(
            f"{where}: authentication failed: user {user} with {key} was refused ({exc})",
            hint="check the node's authorized_keys and the inventory's user and key_file",
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        fired = timer.cancel()
        client.close()
        if fired or time.monotonic() >= deadline:
            raise _connect_timeout(node, phase.value) from None
        raise TransportError(
            f"{where}: SSH {phase.value} failed: {error_reason(exc)}",
            hint="sshd may be overloaded (MaxStartups) or not speaking SSH on this port",
        ) from None
    timer.cancel()
    return client


def _connect_timeout(node: NodeSpec, phase: str) -> PhaseTimeout:
    what = "SSH handshake" if phase == "connect" else "authentication"
    return PhaseTimeout(
        f"{kh.node_where(node)}: timeout ({phase}): no {what} within {node.connect_timeout_s:g}s",
        phase=phase,
        hint="the node or its sshd hangs, or the network drops packets",
    )


def open_socket(node: NodeSpec, deadline: float) -> socket.socket:
    """TCP connect within the deadline, TCP_NODELAY on; refused/unreachable/timeout as errors."""
    where = f"{node.name} ({node.host}:{node.port})"
    try:
        sock = socket.create_connection(
            (node.host, node.port), timeout=max(0.001, deadline - time.monotonic())
        )
    except ConnectionRefusedError:
        raise ConnectRefused(
            f"{where}: connection refused: sshd is not running or listens on another port"
        ) from None
    except TimeoutError:
        raise PhaseTimeout(
            f"{where}: timeout (connect): no TCP connection within {node.connect_timeout_s:g}s",
            phase="connect",
        ) from None
    except OSError as exc:
        raise Unreachable(f"{where}: unreachable: {error_reason(exc)}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def open_tunnel(
    via: paramiko.SSHClient, via_node: NodeSpec, node: NodeSpec, deadline: float
) -> paramiko.Channel:
    """A `direct-tcpip` channel from the jump host `via` to the node's host:port, by `deadline`:
    the socket the node's own SSH connection runs over."""
    where = f"{node.name} ({node.host}:{node.port}) through {via_node.name}"
    transport = via.get_transport()
    if transport is None or not transport.is_active():
        raise TransportError(f"{where}: the jump host's connection closed")
    try:
        return transport.open_channel(
            "direct-tcpip",
            dest_addr=(node.host, node.port),
            src_addr=("127.0.0.1", 0),
            timeout=max(0.001, deadline - time.monotonic()),
        )
    except paramiko.ChannelException as exc:
        if exc.code == 1:  # OPEN_ADMINISTRATIVELY_PROHIBITED
            raise TransportError(
                f"{where}: the jump host refused to forward: {exc.text}",
                hint="the jump host's sshd needs AllowTcpForwarding yes (or local)",
            ) from None
        raise Unreachable(f"{where}: unreachable from the jump host: {exc.text}") from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        if time.monotonic() >= deadline:
            raise PhaseTimeout(
                f"{where}: timeout (connect): the jump host opened no connection within "
                f"{node.connect_timeout_s:g}s",
                phase="connect",
            ) from None
        raise TransportError(f"{where}: the jump host failed: {error_reason(exc)}") from None


def _shutdown(sock: socket.socket | paramiko.Channel) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def error_reason(exc: BaseException) -> str:
    """The short reason an SSH or socket error gives, for an error message."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# -- host key trust --------------------------------------------------------------------------


def fetch_host_key(
    node: NodeSpec,
    timeout_s: float,
    *,
    prefer: Sequence[kh.KnownKey] = (),
    sock: socket.socket | paramiko.Channel | None = None,
) -> tuple[str, str, paramiko.PKey]:
    """The key the node offers: (key type, SHA256 fingerprint, key). Nothing is authenticated.
    `sock`: a connection already open to it (through a jump host); else one is opened."""
    deadline = time.monotonic() + timeout_s
    if sock is None:
        sock = open_socket(node, deadline)
    watchdog = Watchdog()
    timer = watchdog.arm(deadline, lambda: _shutdown(sock))
    transport = paramiko.Transport(sock)
    transport.set_log_channel(WIRE_LOG)
    try:
        opts = transport.get_security_options()
        opts.key_types = kh.preferred_key_types(prefer, list(opts.key_types))
        transport.banner_timeout = timeout_s + 1.0
        transport.handshake_timeout = timeout_s + 1.0
        transport.start_client(timeout=timeout_s + 1.0)
        key = transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        if timer.cancel() or time.monotonic() >= deadline:
            raise PhaseTimeout(
                f"{kh.node_where(node)}: timeout (connect): no SSH handshake within {timeout_s:g}s",
                phase="connect",
            ) from None
        raise TransportError(
            f"{kh.node_where(node)}: SSH handshake failed: {error_reason(exc)}"
        ) from None
    finally:
        timer.cancel()
        watchdog.close()
        transport.close()
    return key.get_name(), kh.fingerprint_of(key.asbytes()), key
