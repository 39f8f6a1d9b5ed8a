"""Where gpuctl keeps its own files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def state_dir(env: Mapping[str, str] | None = None, override: Path | None = None) -> Path:
    """`--state-dir`, `GPUCTL_STATE_DIR`, `$XDG_STATE_HOME/gpuctl`, then ~/.local/state/gpuctl."""
    env = os.environ if env is None else env
    if override is not None:
        return override
    if env.get("GPUCTL_STATE_DIR"):
        return Path(env["GPUCTL_STATE_DIR"])
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local/state")
    return Path(base) / "gpuctl"


def own_known_hosts(env: Mapping[str, str] | None = None, override: Path | None = None) -> Path:
    """gpuctl's own known_hosts, where `gpuctl hosts trust` records keys."""
    return state_dir(env, override) / "known_hosts"


def ssh_config(env: Mapping[str, str] | None = None) -> Path:
    """The operator's OpenSSH client config: `$GPUCTL_SSH_CONFIG`, else ~/.ssh/config (an
    inventory's `ssh_config:` wins over both for its nodes)."""
    env = os.environ if env is None else env
    if env.get("GPUCTL_SSH_CONFIG"):
        return Path(os.path.expanduser(env["GPUCTL_SSH_CONFIG"]))  # noqa: PTH111
    return Path(env.get("HOME") or Path.home()) / ".ssh/config"


def system_known_hosts(env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The OpenSSH files an operator already trusts: ~/.ssh/known_hosts and the system-wide one."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home())
    return (home / ".ssh/known_hosts", Path("/etc/ssh/ssh_known_hosts"))
