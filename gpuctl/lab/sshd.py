"""The lab's low-level pieces: keys, sshd_config, starting sshd detached, reading /proc.

Everything here works on one node at a time; `gpuctl.lab.fleet` composes it into a fleet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpuctl.errors import LabError

DEFAULT_SSHD = Path("/usr/sbin/sshd")
IP = "/usr/sbin/ip" if Path("/usr/sbin/ip").exists() else "/sbin/ip"  # iproute2
LAB_USER = "gpuctl-lab"
_UNSAFE_IN_CONFIG = re.compile(r'["\n\r\\#]')


def generate_ed25519(private_path: Path, comment: str) -> str:
    """Write a new ed25519 private key (OpenSSH format, mode 0600); return its public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    write_private(private_path, private)
    line = f"{public.decode('ascii')} {comment}"
    public_path = private_path.with_name(private_path.name + ".pub")
    public_path.write_text(line + "\n")
    public_path.chmod(0o644)
    return line


def write_private(path: Path, data: bytes) -> None:
    """Write a file that only its owner may read, replacing any previous one."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _arg(value: str) -> str:
    if _UNSAFE_IN_CONFIG.search(value):
        raise LabError(f"lab path {value!r} has characters sshd_config cannot hold")
    return f'"{value}"' if any(c.isspace() for c in value) else value


def render_sshd_config(
    *,
    host: str,
    port: int,
    host_key: Path,
    authorized_keys: Path,
    user: str,
    env: Mapping[str, str],
    sshd_version: tuple[int, int] | None = None,
    forwarding: bool = False,
) -> str:
    """The sshd_config of one lab node: key-only auth for one user, the node's env via SetEnv.
    `forwarding`: a jump host's, forwarding TCP (`direct-tcpip`, ProxyJump) for that user."""
    set_env = " ".join(_arg(f"{k}={v}") for k, v in env.items())
    lines = [
        "# written by gpuctl lab up",
        f"ListenAddress {host}",
        f"Port {port}",
        f"HostKey {_arg(str(host_key))}",
        "PidFile none",
        f"AuthorizedKeysFile {_arg(str(authorized_keys))}",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        f"AllowUsers {user}",
        "PermitRootLogin no",
        "StrictModes no",
        "UsePAM no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        f"AllowTcpForwarding {'local' if forwarding else 'no'}",
        "AllowAgentForwarding no",
        "PermitTunnel no",
        "MaxStartups 100:30:200",
        "MaxSessions 50",
        "LogLevel INFO",
        "Subsystem sftp internal-sftp",  # checkpoint copies (sync: pull), as on a real node
        f"SetEnv {set_env}",
    ]
    if sshd_version is not None and sshd_version >= (9, 8):
        # Newer sshd penalizes sources that fail auth; the lab's tests fail auth on purpose.
        lines.append("PerSourcePenalties no")
    return "\n".join(lines) + "\n"


def sshd_version(sshd: Path) -> tuple[int, int] | None:
    """OpenSSH's version from `sshd -V` (it prints it on stderr), or None."""
    try:
        out = subprocess.run(
            [str(sshd), "-V"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stderr + out.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_sshd(sshd: Path) -> None:
    if not sshd.is_absolute() or not sshd.is_file() or not os.access(sshd, os.X_OK):
        raise LabError(
            f"OpenSSH server not found ({sshd}): install it with apt-get install -y openssh-server"
        )


def spawn_sshd(sshd: Path, config: Path, log: Path, *, netns: str | None = None) -> int:
    """Start `sshd -D -e -f CONFIG` detached (own session, parent exits at once); return its pid.
    With `netns`, sshd runs inside that network namespace (`ip netns exec`, which execs sshd:
    the pid is sshd's)."""
    argv = [str(sshd), "-D", "-e", "-f", str(config)]
    if netns is not None:
        argv = [IP, "netns", "exec", netns, *argv]
    try:
        return spawn_detached(argv, log)
    except LabError as exc:
        raise LabError(f"could not start sshd for {config}: {exc.message}") from None


def spawn_detached(argv: list[str], log: Path, *, pass_fds: tuple[int, ...] = ()) -> int:
    """Start `argv` detached, its output appended to `log`; return its pid.

    A throw-away shell backgrounds the command and exits, so the command is re-parented to init:
    it outlives the process that started it and never becomes a zombie of ours.
    """
    script = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
    out = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(log), *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"},
        start_new_session=True,
        timeout=10,
        check=False,
        pass_fds=pass_fds,
    )
    try:
        return int(out.stdout.strip())
    except ValueError:
        raise LabError(out.stderr.strip() or f"{argv[0]} did not start") from None


def free_ports(host: str, count: int) -> list[int]:
    """Ports the kernel says are free now (held together so they are distinct)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


def wait_listening(pid: int, log: Path, deadline: float, *, offset: int = 0) -> str | None:
    """Wait until sshd logs (past `offset`) that it listens. None when it does; else why not."""
    while True:
        text = _read_tail(log, offset)
        if "Server listening on" in text:
            return None
        if not alive(pid):
            return _last_lines(text) or "sshd exited"
        if time.monotonic() >= deadline:
            return "sshd did not start listening in time: " + (_last_lines(text) or "no output")
        time.sleep(0.01)


def _read_tail(path: Path, offset: int, size: int = 8192) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, fh.tell() - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _last_lines(text: str, n: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


# -- the lab user ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class LabUser:
    name: str
    uid: int
    gid: int
    dedicated: bool  # False when gpuctl does not run as root and the lab uses the current user


def lab_user() -> LabUser:
    """As root: the dedicated unprivileged `gpuctl-lab` (created and unlocked if needed).
    Otherwise the current user (an sshd not running as root can only log in its own user)."""
    if os.geteuid() != 0:
        pw = pwd.getpwuid(os.geteuid())
        return LabUser(pw.pw_name, pw.pw_uid, pw.pw_gid, dedicated=False)
    try:
        pw = pwd.getpwnam(LAB_USER)
    except KeyError:
        home = f"/var/lib/{LAB_USER}"
        _run_admin(
            "/usr/sbin/useradd", "--system", "--user-group", "--create-home", "--home-dir", home,
            "--shell", "/bin/sh", LAB_USER,
        )  # fmt: skip
        pw = pwd.getpwnam(LAB_USER)
    if _locked_account(LAB_USER):
        # useradd leaves the account "locked" ("!"), and sshd refuses even key auth for it
        _run_admin("/usr/sbin/usermod", "-p", "*", LAB_USER)
    return LabUser(pw.pw_name, pw.pw_uid, pw.pw_gid, dedicated=True)


def _locked_account(name: str) -> bool:
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == name and len(fields) > 1:
                return fields[1].startswith("!")
    except OSError:
        return False
    return False


def _run_admin(*argv: str) -> None:
    if not Path(argv[0]).exists():
        raise LabError(f"cannot create the lab user {LAB_USER}: {argv[0]} not found")
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if out.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed: {out.stderr.strip()}")


def check_traversable(path: Path, user: LabUser) -> None:
    """sshd reads the authorized keys as the lab user: every folder above DIR must let it in."""
    groups = set(os.getgrouplist(user.name, user.gid))
    for folder in (path, *path.parents):
        st = folder.stat()
        if st.st_uid == user.uid:
            ok = bool(st.st_mode & 0o100)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & 0o010)
        else:
            ok = bool(st.st_mode & 0o001)
        if not ok:
            raise LabError(
                f"{path}: user {user.name} cannot enter {folder} (mode {st.st_mode & 0o777:o})",
                hint="choose a lab folder the lab user can reach, e.g. under /tmp",
            )


# -- processes -------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    return raw[raw.rfind(")") + 2 :].split()


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    fields = _stat_fields(pid)
    if fields is None:
        return False
    if fields[0] == "Z":
        _reap(pid)
        return False
    return True


def wait_gone(pids: Iterable[int], timeout_s: float = 5.0) -> None:
    """Wait, at most `timeout_s`, until none of `pids` is alive: a process killed keeps its
    sockets open until the kernel has run its exit."""
    pending = {p for p in pids if alive(p)}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
        pending = {p for p in pending if alive(p)}


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


class ProcTable:
    """One scan of /proc: the process tree, and each process's value of one environment variable
    (as the process was started). Live processes only: zombies are left out."""

    def __init__(self, env_key: str) -> None:
        prefix = f"{env_key}=".encode()
        me = os.getpid()
        self._children: dict[int, list[int]] = {}
        self._env: dict[str, set[int]] = {}
        for pid in _all_pids():
            fields = _stat_fields(pid)
            if fields is None or len(fields) < 2 or fields[0] == "Z" or pid == me:
                continue
            self._children.setdefault(int(fields[1]), []).append(pid)
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            for item in environ.split(b"\0"):
                if item.startswith(prefix):
                    value = item[len(prefix) :].decode("utf-8", "replace")
                    self._env.setdefault(value, set()).add(pid)

    def descendants(self, root: int) -> set[int]:
        """Every live process below `root` in the process tree."""
        found: set[int] = set()
        todo = [root]
        while todo:
            for child in self._children.get(todo.pop(), ()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found

    def with_env(self, value: str) -> set[int]:
        return set(self._env.get(value, ()))


def signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def is_sshd_of(pid: int, config: Path) -> bool:
    """Guards against pid reuse: the pid still runs sshd with this node's config."""
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ..."): match text
    text = " ".join(cmdline(pid))
    return alive(pid) and "sshd" in text and str(config) in text
