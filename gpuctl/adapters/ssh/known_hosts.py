"""known_hosts: reading (plain, hashed, `[host]:port`, wildcard entries), checking and recording.

A node's key is checked against every known_hosts file that applies to it, in order: the files the
inventory names for the node, gpuctl's own, then the system's (OpenSSH's `~/.ssh/known_hosts` and
`/etc/ssh/ssh_known_hosts`). Like OpenSSH: a key recorded for the host anywhere is trusted; a host
with recorded keys that offers another one has a *changed* key; a host recorded nowhere is
*unknown*. gpuctl never adds a key by itself: trust is `gpuctl hosts trust NODE`.

A host is named `host` on port 22, `[host]:port` otherwise; one whose ssh_config sets
`HostKeyAlias` is named by the alias alone, with no port, for lookup and recording alike
(as OpenSSH's sshconnect.c does).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuctl.adapters.files import write_atomic
from gpuctl.core.model import NodeSpec
from gpuctl.errors import HostKeyChanged, HostKeyUnknown, TransportError

if TYPE_CHECKING:
    import paramiko

_HASH_MAGIC = "|1|"


@dataclasses.dataclass(frozen=True, slots=True)
class KnownKey:
    """One key line of a known_hosts file."""

    path: str
    line: int
    hosts: str  # the first field as written: comma-separated names, patterns or a |1| hash
    key_type: str
    blob: bytes

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.blob)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclasses.dataclass(frozen=True, slots=True)
class KeyMatch:
    """How an offered key compares with what is recorded for the host."""

    trusted: KnownKey | None  # the entry that trusts the offered key
    recorded: tuple[KnownKey, ...]  # every entry for the host (different keys when changed)

    @property
    def known(self) -> bool:
        return self.trusted is not None


def fingerprint_of(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a public key blob: `SHA256:` + unpadded base64."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii")
    return "SHA256:" + digest.rstrip("=")


def host_key_name(host: str, port: int, alias: str | None = None) -> str:
    """How known_hosts names a host: ssh_config's HostKeyAlias when it has one (no port, as
    OpenSSH), else `host` on port 22, `[host]:port` otherwise."""
    if alias:
        return alias
    return host if port == 22 else f"[{host}]:{port}"


def node_where(node: NodeSpec, alias: str | None = None) -> str:
    return f"{node.name} ({host_key_name(node.host, node.port, alias)})"


# -- reading -----------------------------------------------------------------------------------


def parse_known_hosts(text: str, path: str) -> tuple[KnownKey, ...]:
    """Key lines of one file. Comments, markers (@cert-authority, @revoked) and lines that are
    not `hosts keytype base64` are skipped, as OpenSSH does."""
    keys = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "@")):
            continue
        fields = line.split()
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except (binascii.Error, ValueError):
            continue
        keys.append(KnownKey(path, number, fields[0], fields[1], blob))
    return tuple(keys)


def _hashed_match(entry: str, name: str) -> bool:
    parts = entry.split("|")  # "", "1", salt, hash
    if len(parts) != 4:
        return False
    try:
        salt = base64.b64decode(parts[2])
        want = base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    got = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(got, want)


def _glob(pattern: str, name: str) -> bool:
    """OpenSSH patterns: `*` and `?` only (brackets are literal, as in `[host]:port`)."""
    if "*" not in pattern and "?" not in pattern:
        return pattern == name
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, flags=re.DOTALL) is not None


def hosts_match(hosts: str, name: str) -> bool:
    """OpenSSH's host field: a |1| hash, or comma-separated names/patterns, `!` negates."""
    if hosts.startswith(_HASH_MAGIC):
        return _hashed_match(hosts, name)
    matched = False
    lowered = name.lower()
    for pattern in hosts.split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if _glob(pattern.lower(), lowered):
            if negated:
                return False
            matched = True
    return matched


class KnownHostsFiles:
    """Parsed known_hosts files, re-read only when a file changes (size or mtime)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int], tuple[KnownKey, ...]]] = {}

    def keys(self, path: Path) -> tuple[KnownKey, ...]:
        try:
            st = path.stat()
        except OSError:
            return ()  # a missing file trusts nothing
        stamp = (st.st_mtime_ns, st.st_size)
        name = str(path)
        with self._lock:
            hit = self._cache.get(name)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ()
        keys = parse_known_hosts(text, name)
        with self._lock:
            self._cache[name] = (stamp, keys)
        return keys

    def for_host(self, paths: Iterable[Path], name: str) -> tuple[KnownKey, ...]:
        return tuple(k for p in paths for k in self.keys(p) if hosts_match(k.hosts, name))


def verdict(recorded: Sequence[KnownKey], key_type: str, blob: bytes) -> KeyMatch:
    for entry in recorded:
        if entry.blob == blob and entry.key_type == key_type:
            return KeyMatch(trusted=entry, recorded=tuple(recorded))
    return KeyMatch(trusted=None, recorded=tuple(recorded))


def check(
    node: NodeSpec,
    recorded: Sequence[KnownKey],
    key_type: str,
    blob: bytes,
    *,
    trust: str | None = None,
    alias: str | None = None,
) -> KnownKey:
    """The entry trusting the offered key, or HostKeyUnknown / HostKeyChanged. `trust`: the
    inventory node whose `gpuctl hosts trust` records the key (a jump host's is its node's);
    `alias`: ssh_config's HostKeyAlias, the name `recorded` was looked up by (in messages)."""
    trust = trust or node.name
    where = node_where(node, alias)
    result = verdict(recorded, key_type, blob)
    if result.trusted is not None:
        return result.trusted
    offered = f"{key_type} {fingerprint_of(blob)}"
    if not recorded:
        raise HostKeyUnknown(
            f"{where}: host key unknown: {offered}",
            hint=f"check that fingerprint with the node's owner, then: gpuctl hosts trust {trust}",
        )
    old = next((k for k in recorded if k.key_type == key_type), recorded[0])
    raise HostKeyChanged(
        f"{where}: HOST KEY CHANGED: it offers {offered}, but {old.where} holds "
        f"{old.key_type} {old.fingerprint}; nothing was sent",
        hint="if the node was reinstalled, check the new fingerprint, then: "
        f"gpuctl hosts trust --replace {trust}",
    )


def preferred_key_types(recorded: Sequence[KnownKey], available: Sequence[str]) -> list[str]:
    """Host key algorithms with the recorded types first (as OpenSSH orders them)."""
    wanted: list[str] = []
    for entry in recorded:
        algos = ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if entry.key_type == "ssh-rsa" else []
        for algo in algos or [entry.key_type]:
            if algo in available and algo not in wanted:
                wanted.append(algo)
    return wanted + [a for a in available if a not in wanted]


# -- recording ---------------------------------------------------------------------------------


def known_hosts_line(
    host: str, port: int, key_type: str, blob: bytes, alias: str | None = None
) -> str:
    name = host_key_name(host, port, alias)
    return f"{name} {key_type} {base64.b64encode(blob).decode('ascii')}\n"


def record(
    path: Path,
    host: str,
    port: int,
    key_type: str,
    blob: bytes,
    *,
    replace: bool = False,
    alias: str | None = None,
) -> None:
    """Add the key for host:port (or for `alias`, ssh_config's HostKeyAlias) to `path` (folder
    0700, file 0600). With `replace`, the host's previous entries in this file (plain or hashed)
    are removed first."""
    name = host_key_name(host, port, alias)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        old = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        old = ""
    kept = []
    for raw in old.splitlines(keepends=True):
        fields = raw.split()
        is_entry = len(fields) >= 3 and not raw.lstrip().startswith(("#", "@"))
        if replace and is_entry and hosts_match(fields[0], name):
            continue
        kept.append(raw if raw.endswith("\n") else raw + "\n")
    text = "".join(kept) + known_hosts_line(host, port, key_type, blob, alias)
    _write_private(path, text)


def record_host_key(
    path: Path,
    node: NodeSpec,
    key: paramiko.PKey,
    *,
    replace: bool = False,
    alias: str | None = None,
) -> None:
    """Record `key` for the node in `path` (`[host]:port` form off port 22, `alias` alone when
    ssh_config sets HostKeyAlias; file 0600, dir 0700)."""
    record(path, node.host, node.port, key.get_name(), key.asbytes(), replace=replace, alias=alias)


def _write_private(path: Path, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise TransportError(f"{path}: cannot record the host key: {exc.strerror}") from None
