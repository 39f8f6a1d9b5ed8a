"""Private keys for the SSH transport: loaded once per file version, refused when others can
read them (as OpenSSH does) or when they need a passphrase (gpuctl never prompts: such a key is
used through ssh-agent, with no `key_file`)."""

from __future__ import annotations

import threading
from pathlib import Path

import paramiko

from gpuctl.adapters.ssh._connect import error_reason
from gpuctl.core.model import NodeSpec
from gpuctl.errors import AuthFailed, TransportError


class KeyCache:
    """Private keys loaded once per file version; files readable by others are refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int, int], paramiko.PKey]] = {}

    def load(self, node: NodeSpec) -> paramiko.PKey | None:
        if node.key_file is None:
            return None  # ssh-agent and ~/.ssh/id_* as OpenSSH would
        path = node.key_file
        try:
            st = Path(path).stat()
        except OSError as exc:
            raise TransportError(
                f"{node.name}: key_file {path}: {error_reason(exc)}",
                hint="fix key_file in the inventory",
            ) from None
        if st.st_mode & 0o077:
            raise TransportError(
                f"{node.name}: key_file {path} is readable by others (mode "
                f"{st.st_mode & 0o777:o}); refusing to use it",
                hint=f"chmod 600 {path}",
            )
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            hit = self._cache.get(path)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        try:
            key = paramiko.PKey.from_path(path)
        except (TypeError, paramiko.PasswordRequiredException):
            # cryptography raises TypeError for an encrypted key loaded without its passphrase
            raise AuthFailed(
                f"{node.name}: key_file {path} needs a passphrase, which gpuctl never asks for: "
                "load it into ssh-agent and drop key_file, or use a key without a passphrase",
                hint=f"ssh-add {path}, then remove key_file from the inventory; or a key without "
                "a passphrase that only you can read (chmod 600)",
            ) from None
        except (paramiko.SSHException, OSError, ValueError) as exc:
            raise TransportError(
                f"{node.name}: key_file {path} is not a usable private key: {error_reason(exc)}"
            ) from None
        with self._lock:
            self._cache[path] = (stamp, key)
        return key

    @staticmethod
    def identity_files(node: NodeSpec, files: tuple[str, ...]) -> tuple[str, ...]:
        """ssh_config's IdentityFile entries that exist (ssh skips the others); one that others
        can read is refused, as `key_file` is. paramiko loads them (a key needing a passphrase is
        skipped: ssh-agent may hold it)."""
        found = []
        for path in files:
            try:
                st = Path(path).stat()
            except OSError:
                continue
            if st.st_mode & 0o077:
                raise TransportError(
                    f"{node.name}: IdentityFile {path} is readable by others (mode "
                    f"{st.st_mode & 0o777:o}); refusing to use it",
                    hint=f"chmod 600 {path}",
                )
            found.append(path)
        return tuple(found)
