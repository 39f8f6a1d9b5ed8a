"""The SSH transport (paramiko): verified host keys, deadlines on every wait, reused connections,
folders copied by SFTP. The only room of gpuctl where paramiko is imported.

This front re-exports what the rest of gpuctl uses: `SshTransport` (the `Transport` and
`TreeTransport` protocols of `gpuctl.adapters.protocols`; `route` says how it reaches a node
through ssh_config and jump hosts, as `Route` and `Leg`), `fetch_host_key` and `login_user`
(`gpuctl hosts trust` reads a node's key before trusting it) and `PhaseTimeout`. The known_hosts
files are `known_hosts`, which `gpuctl hosts` reads and writes. The pieces are private: the
transport (`_transport`), connecting and its deadlines (`_connect`), a command's deadline and
bounded read (`_exec`), the answering sessions a warm poll goes through (`_session`, `_asks`),
the login keys (`_keys`), the SFTP copies (`_sftp`) and ssh_config with the jump hosts
(`_route`). `SshTransport` is also a `SessionTransport`.
"""

from __future__ import annotations

from gpuctl.adapters.ssh._connect import PhaseTimeout, fetch_host_key, login_user
from gpuctl.adapters.ssh._route import Leg, Route
from gpuctl.adapters.ssh._transport import SshTransport

__all__ = ["Leg", "PhaseTimeout", "Route", "SshTransport", "fetch_host_key", "login_user"]
