"""Where a node really is: the operator's ssh_config (read by paramiko's `SSHConfig`) and the
inventory's jump hosts, resolved into the legs gpuctl connects one through the other, first hop
first, the node last.

What the inventory says wins over ssh_config (as ssh's command line wins over its config file):
its `user`, `port`, `key_file` and `jump`. From ssh_config, for the node's `host`: `HostName`,
`User`, `Port`, `IdentityFile` (several), `IdentitiesOnly`, `HostKeyAlias` and `ProxyJump`; for
each jump host, the same but `ProxyJump` (a jump host's own jump hosts are not followed).
`HostKeyAlias` alone (lowercased, no `[..]:port`) names the leg's key in known_hosts instead of
its HostName and Port, for checking and for `gpuctl hosts trust` (as OpenSSH). `ProxyCommand` and
`Match exec` are refused: gpuctl runs no local command an SSH config names (everything it runs
is quoted by itself). `Include` lines are read in place (globs, relative to ~/.ssh), 16 deep at
most.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import threading
from pathlib import Path
from typing import Any

import paramiko

from gpuctl.adapters.ssh.known_hosts import host_key_name
from gpuctl.core.model import Hop, NodeSpec, parse_jump
from gpuctl.errors import ConfigError

MAX_INCLUDE_DEPTH = 16
_INCLUDE = re.compile(r"^\s*include(?:\s*=\s*|\s+)(.+?)\s*$", re.IGNORECASE)
_HOST = re.compile(r"^[A-Za-z0-9_.:%-]{1,253}$")
_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}$")
# `Match exec` runs a local command when the config is read (paramiko runs it through invoke
# when that is installed): refused like ProxyCommand, by line, before paramiko sees the file.
_MATCH_EXEC = re.compile(r"^\s*match\b.*\bexec\b", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, slots=True)
class Leg:
    """One SSH connection of a route. `node` is resolved (its `host`, `port` and `user` are
    the ones dialled; its `name` names it in messages); `identity_files`: ssh_config's, tried
    when the inventory names no `key_file`; `agent`: ssh-agent and ~/.ssh/id_* are tried too;
    `key_alias`: ssh_config's HostKeyAlias, the name its key has in known_hosts."""

    node: NodeSpec
    identity_files: tuple[str, ...] = ()
    agent: bool = True
    trust: str = ""  # the inventory node whose `gpuctl hosts trust` records this leg's key
    key_alias: str | None = None

    @property
    def key_name(self) -> str:
        """The name this leg's key is looked up and recorded by in known_hosts."""
        return host_key_name(self.node.host, self.node.port, self.key_alias)


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    hops: tuple[Leg, ...]  # the jump hosts, first hop first
    target: Leg

    @property
    def legs(self) -> tuple[Leg, ...]:
        return (*self.hops, self.target)


def direct(node: NodeSpec) -> Route:
    """The node as the inventory says it, no ssh_config."""
    return Route(hops=(), target=Leg(node=node, trust=node.name))


class SshConfigs:
    """ssh_config files parsed once per version; `route` resolves a node through them.

    `default`: the file for nodes whose inventory names none (`$GPUCTL_SSH_CONFIG`, else
    ~/.ssh/config; the caller says which); a missing default file is no configuration, a missing
    file the inventory names is an error."""

    def __init__(self, default: Path | None) -> None:
        self._default = default
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[tuple[str, int], ...], paramiko.SSHConfig]] = {}

    def route(self, node: NodeSpec) -> Route:
        path = self._path(node)
        if path is None:
            if node.jump:
                return _resolve(node, None, "")
            return direct(node)
        return _resolve(node, self._config(node, path), str(path))

    def _path(self, node: NodeSpec) -> Path | None:
        if node.ssh_config == "none":
            return None
        if node.ssh_config is not None:
            path = Path(node.ssh_config)
            if not path.is_file():
                raise ConfigError(
                    f"ssh_config {path}: no such file",
                    path=node.source,
                    field="ssh_config",
                    hint="fix ssh_config: in the inventory, or set it to none",
                )
            return path
        if self._default is None or not self._default.is_file():
            return None
        return self._default

    def _config(self, node: NodeSpec, path: Path) -> paramiko.SSHConfig:
        with self._lock:
            hit = self._cache.get(str(path))
        if hit is not None and _unchanged(hit[0]):
            return hit[1]
        try:
            files: list[Path] = []
            text = _expanded(path, files, 0)
            _refuse_match_exec(text, path)
            config = paramiko.SSHConfig.from_text(text)
            stamp = tuple((str(f), f.stat().st_mtime_ns) for f in files)
        except OSError as exc:
            raise ConfigError(f"cannot read it: {exc.strerror}", path=str(path)) from None
        except (paramiko.ConfigParseError, ValueError) as exc:
            raise ConfigError(f"not a valid ssh_config: {exc}", path=str(path)) from None
        with self._lock:
            self._cache[str(path)] = (stamp, config)
        return config


def _refuse_match_exec(text: str, path: Path) -> None:
    for number, line in enumerate(text.splitlines(), 1):
        if _MATCH_EXEC.match(line):
            raise ConfigError(
                "is not supported: gpuctl runs no local command a config names (it quotes "
                "everything it runs itself); use Host or Match host",
                path=str(path),
                field=f"line {number}: Match exec",
            )


def _unchanged(stamp: tuple[tuple[str, int], ...]) -> bool:
    """Whether every file a parsed config was read from (Include'd ones too) is as it was."""
    try:
        return all(Path(name).stat().st_mtime_ns == mtime for name, mtime in stamp)
    except OSError:
        return False


def _expanded(path: Path, files: list[Path], depth: int) -> str:
    """The file's text with every `Include` replaced by the files it names."""
    if depth > MAX_INCLUDE_DEPTH:
        raise ValueError(f"Include nested more than {MAX_INCLUDE_DEPTH} deep at {path}")
    files.append(path)
    out: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _INCLUDE.match(line)
        if match is None:
            out.append(line)
            continue
        for word in match.group(1).split():
            pattern = os.path.expanduser(word.strip('"'))  # noqa: PTH111 - ~user too
            if not os.path.isabs(pattern):  # noqa: PTH117 - a glob, not a Path
                pattern = str(Path.home() / ".ssh" / pattern)
            for found in sorted(glob.glob(pattern)):  # noqa: PTH207 - as ssh: glob(3)
                if Path(found).is_file():
                    out.append(_expanded(Path(found), files, depth + 1))
    return "\n".join(out)


def _resolve(node: NodeSpec, config: paramiko.SSHConfig | None, source: str) -> Route:
    opts = _lookup(config, node.host, source)

    def bad(alias: str, key: str, problem: str) -> ConfigError:
        return ConfigError(problem, path=source, field=f"Host {alias}: {key}")

    proxy_command = str(opts.get("proxycommand", "none"))
    if node.jump is None and proxy_command.lower() != "none":
        raise ConfigError(
            "is not supported: gpuctl runs no local command a config names (it quotes "
            "everything it runs itself); use ProxyJump",
            path=source,
            field=f"Host {node.host}: ProxyCommand",
            hint=f"replace ProxyCommand with ProxyJump, or give {node.name} a jump: in the "
            "inventory",
        )
    if node.jump is not None:
        hops = node.jump
    elif "proxyjump" in opts:
        try:
            hops = parse_jump(str(opts["proxyjump"]))
        except ValueError as exc:
            raise bad(node.host, "ProxyJump", str(exc)) from None
    else:
        hops = ()
    target = _leg(node, opts, source, bad, port=node.port if node.port_set else None)
    legs = []
    for hop in hops:
        legs.append(_hop_leg(node, hop, _lookup(config, hop.host, source), source, bad))
    return Route(hops=tuple(legs), target=target)


def _lookup(config: paramiko.SSHConfig | None, host: str, source: str) -> dict[str, Any]:
    if config is None:
        return {"hostname": host}
    try:
        return dict(config.lookup(host))
    except (paramiko.ConfigParseError, paramiko.CouldNotCanonicalize, ImportError) as exc:
        raise ConfigError(f"Host {host}: {exc}", path=source) from None


def _leg(node: NodeSpec, opts: dict[str, Any], source: str, bad: Any, *, port: int | None) -> Leg:
    alias = node.host
    host = str(opts.get("hostname") or alias)
    if host.startswith("-") or not _HOST.match(host):
        raise bad(alias, "HostName", f"must be a host name or IP address (got {host!r})")
    if port is None:
        port = _port(opts, alias, bad)
    user = node.user
    if user is None and "user" in opts:
        user = str(opts["user"])
        if user.startswith("-") or not _USER.match(user):
            raise bad(alias, "User", f"must be a user name (got {user!r})")
    files: tuple[str, ...] = ()
    if node.key_file is None:
        files = tuple(
            os.path.expanduser(str(f))  # noqa: PTH111
            for f in opts.get("identityfile", ())
        )
    agent = str(opts.get("identitiesonly", "no")).lower() != "yes" or not files
    key_alias = None
    if "hostkeyalias" in opts:
        # lowercased as OpenSSH does; a name only: no pattern, list or space reaches known_hosts
        text = str(opts["hostkeyalias"])
        if text.startswith("-") or not _HOST.match(text):
            raise bad(alias, "HostKeyAlias", f"must be a host name (got {text!r})")
        key_alias = text.lower()
    resolved = dataclasses.replace(node, host=host, port=port, user=user, port_set=True)
    return Leg(
        node=resolved, identity_files=files, agent=agent, trust=node.name, key_alias=key_alias
    )


def _port(opts: dict[str, Any], alias: str, bad: Any) -> int:
    text = str(opts.get("port", "22"))
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise bad(alias, "Port", f"must be an integer between 1 and 65535 (got {text!r})")
    return int(text)


def _hop_leg(node: NodeSpec, hop: Hop, opts: dict[str, Any], source: str, bad: Any) -> Leg:
    """A jump host: its own user, port and keys (`[user@]host[:port]`, else ssh_config's for
    it, else the local user and 22, as ssh does), the node's known_hosts files and deadline."""
    spec = NodeSpec(
        name=f"jump host {hop.host} of {node.name}",
        host=hop.host,
        port=hop.port or 22,
        user=hop.user,
        allow_root=node.allow_root,
        known_hosts=node.known_hosts,
        connect_timeout_s=node.connect_timeout_s,
        command_timeout_s=node.command_timeout_s,
        source=node.source,
        jump=(),
    )
    leg = _leg(spec, opts, source, bad, port=hop.port)
    return dataclasses.replace(leg, trust=node.name)
