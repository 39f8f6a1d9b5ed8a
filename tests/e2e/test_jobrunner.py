"""Jobs on lab nodes over real sshd: launch, observe, the gather's view, secrets, SFTP copies of
checkpoints, node death; and the transport's stdin."""

import dataclasses
import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gpuctl.adapters.node import CheckpointCopyError, SshJobRunner
from gpuctl.adapters.protocols import ExecResult, TreeExists, TreeTooLarge
from gpuctl.adapters.ssh import SshTransport
from gpuctl.core.jobs.model import CommitSeen, LaunchRequest, RunStatus
from gpuctl.core.model import NodeSpec
from gpuctl.errors import TransportTimeout
from gpuctl.lab.sshd import alive
from gpuctl.ops.gather import Gatherer
from gpuctl.testing import waiting
from gpuctl.testing.lab import LabFleet

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
T = TypeVar("T")
FAST = ("--step-seconds", "0.05")


wait_for = functools.partial(waiting.wait_for, timeout_s=15.0, every_s=0.05)


class RecordingTransport:
    """An SshTransport that keeps every command line it sent."""

    def __init__(self, inner: SshTransport) -> None:
        self.inner = inner
        self.commands: list[str] = []

    def run(
        self,
        node: NodeSpec,
        command: str,
        *,
        timeout_s: float,
        max_output_bytes: int = 8 << 20,
        stdin: bytes | None = None,
    ) -> ExecResult:
        self.commands.append(command)
        return self.inner.run(
            node, command, timeout_s=timeout_s, max_output_bytes=max_output_bytes, stdin=stdin
        )

    def close(self) -> None:
        self.inner.close()


@dataclasses.dataclass
class Runs:
    runner: SshJobRunner
    launched: list[tuple[NodeSpec, str, int]]

    def launch(self, node: NodeSpec, request: LaunchRequest) -> RunStatus:
        status = self.runner.launch(node, request)
        self.launched.append((node, request.job_id, request.incarnation))
        return status

    def status(self, node: NodeSpec, job_id: str, n: int) -> RunStatus | None:
        found = [r for r in self.runner.observe(node) if (r.job_id, r.incarnation) == (job_id, n)]
        return found[0] if found else None

    def ended(self, node: NodeSpec, job_id: str, n: int) -> RunStatus | None:
        status = self.status(node, job_id, n)
        return status if status is not None and not status.alive else None


@pytest.fixture
def runs(transport: SshTransport) -> Iterator[Runs]:
    r = Runs(SshJobRunner(transport), [])
    yield r
    for node, job_id, n in r.launched:  # the session lab is shared: leave nothing running
        try:
            r.runner.signal(node, job_id, n, "KILL")
        except Exception:  # a killed node has nothing left to stop
            continue


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(3).hex()}"


def home_of(lab: LabFleet, name: str) -> Path:
    return lab.lab.node_dir(name) / "home"


def train_request(job_id: str, checkpoint_dir: Path, *, n: int = 1, **kw: object) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        incarnation=n,
        argv=(PYTHON, "train.py", "--steps", "100000", "--checkpoint-every", "5", *FAST),
        cuda_visible_devices="1",
        mib_per_card=3072,
        checkpoint_dir=str(checkpoint_dir),
        workdir=str(REPO / "examples"),
        env={"PYTHONDONTWRITEBYTECODE": "1"},
        **kw,  # type: ignore[arg-type]
    )


# -- a job on a lab node ---------------------------------------------------------------------------


def test_a_job_on_a_lab_node_is_observed_seen_by_the_gather_and_checkpoints(
    lab: LabFleet, transport: SshTransport, runs: Runs
) -> None:
    node = lab.spec("lab-01")
    job_id = unique("train")
    ckpt = home_of(lab, "lab-01") / "ckpt" / job_id
    started = runs.launch(node, train_request(job_id, ckpt))
    assert started.alive and started.pid is not None
    assert started.run_dir == str(home_of(lab, "lab-01") / ".gpuctl" / "runs" / job_id / "1")
    # observed, the run also says what it committed last: nothing yet
    assert runs.status(node, job_id, 1) == dataclasses.replace(
        started, commit=CommitSeen(None, None)
    )

    # the gather sees it as a GPU process on the granted card, with its slice
    snapshot = Gatherer(transport).gather([node])
    (seen,) = snapshot.nodes
    assert seen.observation is not None
    cards = {g.uuid: g.index for g in seen.gpus}
    mine = [p for p in seen.observation.processes if p.pid == started.pid]
    assert [(cards[p.gpu_uuid], p.used_mib) for p in mine if p.gpu_uuid] == [(1, 3072)]

    # it checkpoints; SIGTERM makes it checkpoint and exit 0 (the wrapper records it)
    markers = wait_for(lambda: [m for m in runs.runner.checkpoints(node, str(ckpt)) if m.valid])
    assert markers and markers[0].incarnation == 1
    assert runs.runner.signal(node, job_id, 1, "TERM") is True
    ended = wait_for(lambda: runs.ended(node, job_id, 1))
    assert ended is not None and ended.exit_code == 0
    log, offset = runs.runner.logs(node, job_id, 1)
    assert b"step 1 loss" in log and offset == len(log)
    newest = runs.runner.checkpoints(node, str(ckpt))[0]
    assert newest.valid and newest.step is not None and newest.step >= markers[0].step  # type: ignore[operator]


def test_a_secret_reaches_the_job_but_no_process_list_command_or_run_file(
    lab: LabFleet, transport: SshTransport, runs: Runs
) -> None:
    node = lab.spec("lab-02")
    secret = "s3cr3t-" + os.urandom(8).hex()
    recording = RecordingTransport(transport)
    runner = SshJobRunner(recording)
    job = (
        "import hashlib, os, time; "
        "print(hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest(), flush=True); "
        "time.sleep(60)"
    )
    seen: list[str] = []
    stop = threading.Event()

    def watch_process_list() -> None:  # every command line on this machine, during the launch
        while not stop.is_set():
            for entry in Path("/proc").iterdir():
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if secret.encode() in cmdline:
                    seen.append(cmdline.decode(errors="replace"))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch_process_list)
    watcher.start()
    job_id = unique("secret")
    try:
        request = LaunchRequest(
            job_id=job_id,
            incarnation=1,
            argv=(PYTHON, "-c", job),
            cuda_visible_devices="0",
            mib_per_card=1024,
            checkpoint_dir="/nonexistent",
            secret_env={"API_TOKEN": secret},
        )
        runs.launched.append((node, job_id, 1))
        runner.launch(node, request)
        digest = hashlib.sha256(secret.encode()).hexdigest().encode()
        assert wait_for(lambda: digest in runs.runner.logs(node, job_id, 1)[0])
        ps = transport.run(node, "ps -eo args", timeout_s=10)
        status = runs.status(node, job_id, 1)
    finally:
        stop.set()
        watcher.join()
    assert status is not None and status.alive
    assert ps.exit_code == 0 and b"python3 -c" in ps.stdout
    assert secret.encode() not in ps.stdout
    assert seen == []
    assert recording.commands and not any(secret in c for c in recording.commands)
    run_dir = Path(status.run_dir)
    files = [p for p in run_dir.iterdir() if p.is_file()]
    assert {p.name for p in files} >= {"run.sh", "pid", "log"}
    assert not any(secret.encode() in p.read_bytes() for p in files)
    # only the job's own environment holds it
    assert status.pid is not None
    assert secret.encode() in Path(f"/proc/{status.pid}/environ").read_bytes()


def test_killing_the_node_kills_its_job(own_lab: LabFleet, tmp_path: Path) -> None:
    node = own_lab.spec("lab-01", connect_timeout_s=2.0)
    with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
        runner = SshJobRunner(transport)
        job_id = unique("doomed")
        ckpt = home_of(own_lab, "lab-01") / "ckpt"
        started = runner.launch(node, train_request(job_id, ckpt))
        assert started.pid is not None and alive(started.pid)
        own_lab.kill("lab-01")
        assert wait_for(lambda: not alive(started.pid or 0))
        own_lab.revive("lab-01")
        (status,) = runner.observe(node)
        # the run dir stays; nothing recorded an exit: gone, not ended
        assert (status.job_id, status.alive, status.exit_code) == (job_id, False, None)
        assert runner.signal(node, job_id, 1, "KILL") is False


# -- checkpoints over SFTP ------------------------------------------------------------------------


def make_checkpoint(root: Path, step: int, files: dict[str, bytes]) -> Path:
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    marker = {
        "format": 1,
        "job_id": "copy",
        "incarnation": 1,
        "step": step,
        "committed_at": 1000.0 + step,
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    (folder / "COMMITTED").write_text(json.dumps(marker))
    return folder


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_checkpoint_is_pushed_to_one_node_pulled_back_and_pushed_to_another(
    lab: LabFleet, runs: Runs, tmp_path: Path
) -> None:
    one, two = lab.spec("lab-01"), lab.spec("lab-02")
    job = unique("copy")
    files = {"model.bin": os.urandom(300_000), "opt/state.json": b"{}", "empty": b""}
    local = make_checkpoint(tmp_path / "store", 40, files)
    on_one = str(home_of(lab, "lab-01") / "ckpt" / job / "step-00000040")
    on_two = str(home_of(lab, "lab-02") / "ckpt" / job / "step-00000040")

    runs.runner.push_checkpoint(one, str(local), on_one)
    (marker,) = runs.runner.checkpoints(one, str(Path(on_one).parent))
    assert (marker.valid, marker.step, marker.path) == (True, 40, on_one)

    pulled = tmp_path / "pulled" / "step-00000040"
    runs.runner.pull_checkpoint(one, on_one, str(pulled))
    assert tree(pulled) == tree(local)
    assert oct(pulled.stat().st_mode & 0o777) == "0o700"
    assert not [p for p in pulled.parent.iterdir() if p.name.startswith(".")]  # no temp left

    runs.runner.push_checkpoint(two, str(pulled), on_two)
    (marker,) = runs.runner.checkpoints(two, str(Path(on_two).parent))
    assert marker.valid and marker.step == 40
    assert tree(Path(on_two)) == tree(local)
    assert not [p for p in Path(on_two).parent.iterdir() if p.name.startswith(".")]

    # doing it again changes nothing; another checkpoint at the same path is refused
    runs.runner.pull_checkpoint(one, on_one, str(pulled))
    runs.runner.push_checkpoint(two, str(pulled), on_two)
    other = make_checkpoint(tmp_path / "other", 40, {"model.bin": b"different"})
    with pytest.raises(CheckpointCopyError, match="holds another checkpoint"):
        runs.runner.push_checkpoint(two, str(other), on_two)


def test_an_uncommitted_or_corrupt_checkpoint_is_not_pulled(
    lab: LabFleet, runs: Runs, transport: SshTransport, tmp_path: Path
) -> None:
    node = lab.spec("lab-03")
    base = home_of(lab, "lab-03") / "ckpt" / unique("bad")
    half = f"{base}/step-00000001"
    transport.run(
        node, f"mkdir -p {half} && printf data > {half}/model.bin", timeout_s=10
    )  # no marker yet
    dest = tmp_path / "store" / "step-00000001"
    with pytest.raises(CheckpointCopyError, match="no marker"):
        runs.runner.pull_checkpoint(node, half, str(dest))
    assert not dest.exists() and not list(dest.parent.iterdir())

    good = make_checkpoint(tmp_path / "src", 2, {"model.bin": b"two"})
    on_node = f"{base}/step-00000002"
    runs.runner.push_checkpoint(node, str(good), on_node)
    transport.run(node, f"printf corrupt > {on_node}/model.bin", timeout_s=10)
    with pytest.raises(CheckpointCopyError, match=r"checksum mismatch: model\.bin"):
        runs.runner.pull_checkpoint(node, on_node, str(tmp_path / "store" / "step-00000002"))
    assert not list((tmp_path / "store").iterdir())


def test_folder_copies_are_bounded_in_bytes_and_refuse_to_merge(
    lab: LabFleet, transport: SshTransport, tmp_path: Path
) -> None:
    node = lab.spec("lab-01")
    local = make_checkpoint(tmp_path / "src", 1, {"big.bin": b"x" * 10_000})
    remote = str(home_of(lab, "lab-01") / "trees" / unique("t"))
    with pytest.raises(TreeTooLarge, match="more than the limit of 5000"):
        transport.put_tree(node, local, remote, timeout_s=10, max_bytes=5000)
    assert transport.put_tree(node, local, remote, timeout_s=10, max_bytes=1 << 20) > 10_000
    with pytest.raises(TreeExists):
        transport.put_tree(node, local, remote, timeout_s=10, max_bytes=1 << 20)
    with pytest.raises(TreeTooLarge):
        transport.get_tree(node, remote, tmp_path / "back", timeout_s=10, max_bytes=5000)
    assert not (tmp_path / "back").exists()


def test_a_copy_to_a_hung_node_ends_at_its_deadline(own_lab: LabFleet, tmp_path: Path) -> None:
    node = own_lab.spec("lab-02", connect_timeout_s=1.0)
    local = make_checkpoint(tmp_path / "src", 1, {"m": b"m"})
    with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
        assert transport.run(node, "true", timeout_s=5).exit_code == 0  # connected, then hangs
        own_lab.freeze("lab-02")
        try:
            start = time.monotonic()
            with pytest.raises(TransportTimeout):
                transport.put_tree(node, local, "/tmp/never", timeout_s=1.0, max_bytes=1 << 20)
            assert time.monotonic() - start < 5.0
        finally:
            own_lab.thaw("lab-02")


# -- the transport's stdin ------------------------------------------------------------------------


def test_stdin_reaches_the_remote_command_byte_for_byte(
    lab: LabFleet, transport: SshTransport
) -> None:
    data = os.urandom(3 << 20)  # larger than the channel's window
    result = transport.run(lab.spec("lab-01"), "sha256sum", timeout_s=20, stdin=data)
    assert result.exit_code == 0
    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_a_command_that_ignores_its_stdin_still_returns(
    lab: LabFleet, transport: SshTransport
) -> None:
    result = transport.run(lab.spec("lab-01"), "echo ok", timeout_s=10, stdin=b"x" * 100_000)
    assert (result.exit_code, result.stdout) == (0, b"ok\n")


def test_a_node_without_the_sftp_subsystem_copies_through_sftp_server(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    """Some sshd configurations have no `Subsystem sftp`: checkpoints then go through the node's
    own sftp-server program over an exec, with the same results."""
    config = own_lab.lab.config_path("lab-01")
    own_lab.kill_sshd("lab-01")
    text = config.read_text()
    assert "Subsystem sftp" in text
    config.write_text("".join(line for line in text.splitlines(True) if "Subsystem" not in line))
    own_lab.revive("lab-01")
    node = own_lab.spec("lab-01")
    with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
        runner = SshJobRunner(transport)
        files = {"model.bin": os.urandom(100_000), "meta/step.json": b"{}"}
        local = make_checkpoint(tmp_path / "store", 7, files)
        remote = str(home_of(own_lab, "lab-01") / "ckpt" / unique("nosub") / "step-00000007")
        runner.push_checkpoint(node, str(local), remote)
        pulled = tmp_path / "pulled" / "step-00000007"
        runner.pull_checkpoint(node, remote, str(pulled))
        assert tree(pulled) == tree(local)
    # the subsystem was asked for first and refused: the copies went the other way
    assert "subsystem not found" in own_lab.lab.log_path("lab-01").read_text()
