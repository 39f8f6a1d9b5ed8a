"""`JobRunner` over a `Transport`: launch, observe, signal, logs and checkpoints of jobs on nodes.

Each call is one remote exec of a script from `_launch`, `_runs` (observe, signal, fence,
processes, logs) or `_checkpoints` (checkpoints: two, one to list the markers and one to hash the
files they name). Checkpoint folders are copied with the transport's `get_tree` / `put_tree` (SFTP
in `SshTransport`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import posixpath
import secrets
import shlex
import shutil
from pathlib import Path

from gpuctl.adapters.files import fsync_dir
from gpuctl.adapters.node import _checkpoints, _launch, _runs
from gpuctl.adapters.node._script import RemoteCommand
from gpuctl.adapters.protocols import ExecResult, Transport, TreeExists, TreeTransport
from gpuctl.core.jobs import checkpoints
from gpuctl.core.jobs.model import CheckpointMarker, Fenced, JobProcess, LaunchRequest, RunStatus
from gpuctl.core.model import NodeSpec
from gpuctl.errors import GpuctlError, TransportError

log = logging.getLogger(__name__)

MARKER = _checkpoints.MARKER_NAME
DEFAULT_MAX_CHECKPOINTS = 8
DEFAULT_TRANSFER_BYTES = 256 << 30


class LaunchRefused(GpuctlError):
    """This incarnation was already launched on the node: it is never launched twice. Observe
    it (`JobRunner.observe`) or launch the next incarnation."""


class LaunchFailed(GpuctlError):
    """Nothing was started (`unknown` False), or the outcome is unknown (`unknown` True: the
    wrapper did not report in time; observe before deciding anything)."""

    def __init__(self, message: str, *, unknown: bool = False, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.unknown = unknown


class RunNotFound(GpuctlError):
    """The node has no run dir for this incarnation."""


class CheckpointCopyError(GpuctlError):
    """A checkpoint folder could not be copied, or its copy did not verify."""


class SshJobRunner:
    """`gpuctl.adapters.protocols.JobRunner` over a `Transport`.

    Exec deadlines are the node's `command_timeout_s` (checkpoint hashing: `hash_timeout_s`,
    which reads whole checkpoints); copies have `transfer_timeout_s` and `max_transfer_bytes`.
    `max_checkpoints` bounds how many of the newest step folders `checkpoints` lists and hashes.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        hash_timeout_s: float = 300.0,
        transfer_timeout_s: float = 1800.0,
        max_transfer_bytes: int = DEFAULT_TRANSFER_BYTES,
        max_checkpoints: int = DEFAULT_MAX_CHECKPOINTS,
    ) -> None:
        self._transport = transport
        self._hash_timeout_s = hash_timeout_s
        self._transfer_timeout_s = transfer_timeout_s
        self._max_transfer_bytes = max_transfer_bytes
        self._max_checkpoints = max_checkpoints

    def _run(
        self,
        node: NodeSpec,
        command: RemoteCommand,
        *,
        timeout_s: float | None = None,
        max_output_bytes: int = 8 << 20,
    ) -> ExecResult:
        return self._transport.run(
            node,
            command.command,
            timeout_s=node.command_timeout_s if timeout_s is None else timeout_s,
            max_output_bytes=max_output_bytes,
            stdin=command.stdin,
        )

    # -- launch, observe, signal, logs --------------------------------------------------------

    def launch(self, node: NodeSpec, request: LaunchRequest) -> RunStatus:
        """Start one incarnation detached on the node. Raises `LaunchRefused` when the node
        already has it, `LaunchFailed` when nothing started (or the outcome is unknown)."""
        command = _launch.launch_command(request)
        # the launcher waits up to LAUNCH_WAIT_S for the wrapper to report its pid
        timeout_s = max(node.command_timeout_s, _launch.LAUNCH_WAIT_S + 5.0)
        result = self._run(node, command, timeout_s=timeout_s, max_output_bytes=64 << 10)
        outcome = _launch.parse_launch(result.stdout)
        what = f"{node.name}: job {request.job_id} incarnation {request.incarnation}"
        if outcome.result == "started" and outcome.pid is not None:
            log.debug("%s started: pgid %s, MPS limit %s", what, outcome.pid, outcome.mps_limited)
            return RunStatus(
                job_id=request.job_id,
                incarnation=request.incarnation,
                pid=outcome.pid,
                alive=True,
                exit_code=None,
                run_dir=outcome.run_dir or "",
            )
        if outcome.result == "refused":
            raise LaunchRefused(
                f"{what} was already launched there ({outcome.run_dir})",
                hint="observe it, or launch the next incarnation",
            )
        if outcome.result == "failed":
            raise LaunchFailed(f"{what} did not start: {outcome.reason}")
        stderr = result.stderr[:300].decode("utf-8", errors="replace").strip()
        raise LaunchFailed(
            f"{what}: launch outcome unknown ({outcome.reason or 'no pid reported in time'})"
            + (f": {stderr}" if stderr else ""),
            unknown=True,
            hint="observe the node before launching again",
        )

    def observe(self, node: NodeSpec) -> list[RunStatus]:
        """Every incarnation's run on the node. Raises `TransportError` unless the listing arrived
        whole (the script's end line, exit status 0): a listing cut short is not an observation."""
        result = self._run(node, _runs.observe_command())
        runs = None if _incomplete(result) else _runs.parse_observe(result.stdout)
        if runs is None:
            raise TransportError(f"{node.name}: observe {_why_incomplete(result)}")
        return runs

    def fence(self, node: NodeSpec, job_id: str, incarnation: int) -> Fenced:
        """Kill every process of the incarnation on the node (its process group, and any process
        carrying its job id and incarnation) and claim its launch, so that it can never start
        there; `Fenced.gone` once none is left. Raises `TransportError` when the node's answer
        did not arrive whole: then nothing is known."""
        result = self._run(node, _runs.fence_command(job_id, incarnation))
        fenced = None if _incomplete(result) else _runs.parse_fence(result.stdout)
        if fenced is None:
            raise TransportError(
                f"{node.name}: fence of {job_id}/{incarnation} {_why_incomplete(result)}"
            )
        return fenced

    def processes(self, node: NodeSpec) -> list[JobProcess]:
        """Every live process on the node that carries a job's contract environment."""
        result = self._run(node, _runs.processes_command())
        found = None if _incomplete(result) else _runs.parse_processes(result.stdout)
        if found is None:
            raise TransportError(f"{node.name}: process listing {_why_incomplete(result)}")
        return found

    def signal(self, node: NodeSpec, job_id: str, incarnation: int, signal: str) -> bool:
        """Signal the incarnation's process group; False when it is not alive there."""
        result = self._run(node, _runs.signal_command(job_id, incarnation, signal))
        return _runs.parse_signal(result.stdout)

    def logs(
        self,
        node: NodeSpec,
        job_id: str,
        incarnation: int,
        *,
        offset: int = 0,
        limit: int = 1 << 20,
    ) -> tuple[bytes, int]:
        limit = min(limit, _runs.MAX_LOG_CHUNK_BYTES)
        result = self._run(
            node,
            _runs.logs_command(job_id, incarnation, offset, limit),
            max_output_bytes=limit + 4096,
        )
        parsed = _runs.parse_logs(result.stdout, offset, limit)
        if parsed is None:
            raise RunNotFound(f"{node.name}: job {job_id} incarnation {incarnation} has no run dir")
        return parsed

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoints(self, node: NodeSpec, checkpoint_dir: str) -> list[CheckpointMarker]:
        """The newest step folders of `checkpoint_dir` on the node, newest first, each verified
        on the node (sha256 of every file its marker names). Empty when the dir does not exist."""
        listing = self._run(
            node,
            _checkpoints.list_checkpoints_command(checkpoint_dir, self._max_checkpoints),
            max_output_bytes=(_checkpoints.MAX_MARKER_BYTES * 2) * self._max_checkpoints + 65536,
        )
        listed = _checkpoints.parse_checkpoint_listing(listing.stdout)
        if not listed:
            return []
        sums: dict[str, str] = {}
        if any(item.marker is not None for item in listed):
            hashed = self._run(
                node,
                _checkpoints.hash_command(checkpoint_dir, listed),
                timeout_s=self._hash_timeout_s,
                max_output_bytes=200 * _checkpoints.MAX_MANIFEST_FILES * self._max_checkpoints,
            )
            sums = _checkpoints.parse_hashes(hashed.stdout)
        markers = _checkpoints.verify(checkpoint_dir, listed, sums)
        for m in markers:
            if m.problem and m.problem != "no marker":
                log.warning("%s: checkpoint %s is not valid: %s", node.name, m.path, m.problem)
        return markers

    def _trees(self) -> TreeTransport:
        if not isinstance(self._transport, TreeTransport):
            raise CheckpointCopyError(
                f"the transport {type(self._transport).__name__} cannot copy folders "
                "(checkpoint.sync: pull needs SSH)"
            )
        return self._transport

    def pull_checkpoint(self, node: NodeSpec, remote_path: str, local_dir: str) -> None:
        """Copy a committed checkpoint folder from the node to `local_dir`, which appears only
        once complete and verified (temp name, marker last, checksums checked, rename). A
        `local_dir` already holding the same committed checkpoint is left as it is."""
        trees = self._trees()
        remote_path = self._expand_home(node, remote_path)
        dest = Path(local_dir)
        if dest.exists():
            if verify_local(dest) is None:
                return
            raise CheckpointCopyError(f"{dest} exists and is not a valid checkpoint")
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.pull-{secrets.token_hex(4)}"
        trees.get_tree(
            node,
            remote_path,
            tmp,
            timeout_s=self._transfer_timeout_s,
            max_bytes=self._max_transfer_bytes,
            last=(MARKER,),
        )
        try:
            problem = verify_local(tmp)
            if problem is not None:
                raise CheckpointCopyError(
                    f"{node.name}: the copy of {remote_path} is not a valid checkpoint: {problem}"
                )
            tmp.rename(dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            fsync_dir(dest.parent)

    def push_checkpoint(self, node: NodeSpec, local_dir: str, remote_path: str) -> None:
        """Copy a committed checkpoint folder to `remote_path` on the node (temp name, marker
        last, then rename). The source is verified first; a `remote_path` already holding the
        same marker is left as it is."""
        trees = self._trees()
        remote_path = self._expand_home(node, remote_path)
        src = Path(local_dir)
        problem = verify_local(src)
        if problem is not None:
            raise CheckpointCopyError(f"{src} is not a valid checkpoint: {problem}")
        try:
            trees.put_tree(
                node,
                src,
                remote_path,
                timeout_s=self._transfer_timeout_s,
                max_bytes=self._max_transfer_bytes,
                last=(MARKER,),
            )
        except TreeExists:
            if self._remote_marker(node, remote_path) == (src / MARKER).read_bytes():
                return
            raise CheckpointCopyError(
                f"{node.name}: {remote_path} already exists and holds another checkpoint"
            ) from None

    def _expand_home(self, node: NodeSpec, remote_path: str) -> str:
        """SFTP starts in the account's home, which need not be the $HOME jobs see: resolve a
        leading `~` as the launch does, on the node."""
        if remote_path != "~" and not remote_path.startswith("~/"):
            return remote_path
        result = self._run(node, RemoteCommand('printf "%s" "$HOME"'))
        home = result.stdout.decode("utf-8", "replace")
        if result.exit_code != 0 or not home.startswith("/"):
            raise CheckpointCopyError(f"{node.name}: cannot resolve {remote_path}: no $HOME")
        return home + remote_path[1:]

    def _remote_marker(self, node: NodeSpec, remote_path: str) -> bytes | None:
        path = posixpath.join(remote_path, MARKER)
        result = self._run(
            node,
            RemoteCommand(f"cat -- {shlex.quote(path)}"),
            max_output_bytes=_checkpoints.MAX_MARKER_BYTES,
        )
        return result.stdout if result.exit_code == 0 else None


def verify_local(folder: Path) -> str | None:
    """None when `folder` holds a committed checkpoint whose files match its marker, else why
    not (the same judgement as on a node: `gpuctl.core.jobs.checkpoints.judge_checkpoint`)."""
    try:
        raw: bytes | None = (folder / MARKER).read_bytes()
    except OSError:
        raw = None
    fields = checkpoints.parse_marker(raw) if raw is not None else None
    actual: dict[str, str | None] = {}
    for name, _digest in fields.files if fields is not None else ():
        path = folder / name
        if not checkpoints.valid_file_name(name) or path.is_symlink() or not path.is_file():
            actual[name] = None
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        actual[name] = h.hexdigest()
    return checkpoints.judge_checkpoint(folder.name, raw, actual).problem


def _incomplete(result: ExecResult) -> bool:
    return result.exit_code != 0 or result.truncated


def _why_incomplete(result: ExecResult) -> str:
    """Why a script's answer is not a reading: the session ended without an exit status (sshd
    went away mid-command), a failure, or output cut at the limit."""
    stderr = result.stderr[:300].decode("utf-8", errors="replace").strip()
    if result.truncated:
        what = "output passed its size limit"
    elif result.exit_code is None:
        what = "ended without an exit status (the session was cut)"
    elif result.exit_code != 0:
        what = f"failed (exit {result.exit_code})"
    else:
        what = "answer did not arrive whole"
    return f"incomplete: {what}" + (f": {stderr}" if stderr else "") + "; nothing is concluded"
