"""Jobs on a node: the remote scripts of `gpuctl.adapters` (job_launch, jobexec, job_checkpoints),
run by the local `sh` as if on a node (ShellTransport, a HOME of its own), through
`SshJobRunner`."""

import dataclasses
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gpuctl.adapters.node import (
    CheckpointCopyError,
    LaunchFailed,
    LaunchRefused,
    RunNotFound,
    SshJobRunner,
)
from gpuctl.adapters.node import _launch as job_launch
from gpuctl.adapters.node import _runs as jobexec
from gpuctl.adapters.protocols import ExecResult
from gpuctl.core.jobs.model import CommitSeen, Fenced, LaunchRequest, RunStatus
from gpuctl.core.model import NodeSpec
from gpuctl.errors import UsageError
from gpuctl.lab.sshd import alive
from gpuctl.testing import waiting
from gpuctl.testing.fakes import FakeTransport, ShellTransport

NODE = NodeSpec(name="n1", host="127.0.0.1", command_timeout_s=15.0)
PY = sys.executable
T = TypeVar("T")


wait_for = functools.partial(waiting.wait_for, timeout_s=10.0, every_s=0.02)


@dataclasses.dataclass
class Node:
    home: Path
    env: dict[str, str]
    transport: ShellTransport
    runner: SshJobRunner

    def run_dir(self, job_id: str, n: int) -> Path:
        return self.home / ".gpuctl" / "runs" / job_id / str(n)

    def status(self, job_id: str, n: int) -> RunStatus | None:
        found = [r for r in self.runner.observe(NODE) if (r.job_id, r.incarnation) == (job_id, n)]
        return found[0] if found else None

    def ended(self, job_id: str, n: int) -> RunStatus | None:
        status = self.status(job_id, n)
        return status if status is not None and not status.alive else None

    def log(self, job_id: str, n: int) -> bytes:
        return (self.run_dir(job_id, n) / "log").read_bytes()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "no-mps")}
    transport = ShellTransport({"n1": env})
    n = Node(home, env, transport, SshJobRunner(transport))
    yield n
    for run in n.runner.observe(NODE):  # leave nothing running
        if run.alive:
            n.runner.signal(NODE, run.job_id, run.incarnation, "KILL")


def request(job_id: str = "train-0a1b2c", n: int = 1, *argv: str, **kw: object) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        incarnation=n,
        argv=argv or ("sleep", "60"),
        cuda_visible_devices=str(kw.pop("devices", "0")),
        mib_per_card=int(kw.pop("mem", 8192)),  # type: ignore[call-overload]
        checkpoint_dir=str(kw.pop("ckpt", "/ckpt/train")),
        **kw,  # type: ignore[arg-type]
    )


def sh(script: str) -> tuple[str, ...]:
    return ("sh", "-c", script)


# -- launch and observe ---------------------------------------------------------------------------


def test_a_launched_job_runs_detached_with_the_contract_env_and_shows_up_alive(node: Node) -> None:
    started = node.runner.launch(
        NODE,
        request(
            "train-0a1b2c",
            2,
            *sh("env | grep -E '^(GPUCTL_|CUDA_VISIBLE|FOO=)' | sort; sleep 60"),
            devices="1,3",
            mem=4096,
            resume_from="/ckpt/train/step-00000010",
            env={"FOO": "bar"},
        ),
    )
    assert started.alive and started.pid is not None and started.exit_code is None
    run_dir = node.run_dir("train-0a1b2c", 2)
    assert started.run_dir == str(run_dir)
    # the pid is the leader of the job's own session and process group
    assert os.getpgid(started.pid) == started.pid == os.getsid(started.pid)
    # its checkpoint dir holds no commit yet
    assert node.status("train-0a1b2c", 2) == dataclasses.replace(started, commit=CommitSeen(None))
    lines = wait_for(lambda: node.log("train-0a1b2c", 2).count(b"\n") >= 7)
    assert lines
    assert node.log("train-0a1b2c", 2).decode().splitlines() == [
        "CUDA_VISIBLE_DEVICES=1,3",
        "FOO=bar",
        "GPUCTL_CHECKPOINT_DIR=/ckpt/train",
        "GPUCTL_INCARNATION=2",
        "GPUCTL_JOB_ID=train-0a1b2c",
        "GPUCTL_MEM_LIMIT_MIB=4096",
        "GPUCTL_RESUME_FROM=/ckpt/train/step-00000010",
    ]
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
    assert oct((node.home / ".gpuctl" / "runs").stat().st_mode & 0o777) == "0o700"
    assert (run_dir / "started").read_text().strip().isdigit()


def test_the_job_reads_no_stdin_and_holds_no_terminal(node: Node) -> None:
    node.runner.launch(NODE, request("j1", 1, *sh("cat; echo read-done; ls -l /proc/$$/fd/0")))
    ended = wait_for(lambda: node.ended("j1", 1))
    assert ended is not None and ended.exit_code == 0
    log = node.log("j1", 1)
    assert log.startswith(b"read-done\n") and b"/dev/null" in log


def test_the_exit_status_is_recorded_when_the_job_ends(node: Node) -> None:
    node.runner.launch(NODE, request("j1", 1, *sh("echo bye; exit 3")))
    ended = wait_for(lambda: node.ended("j1", 1))
    assert ended is not None
    assert (ended.alive, ended.exit_code) == (False, 3)
    assert (node.run_dir("j1", 1) / "exit").read_text() == "3\n"
    assert node.log("j1", 1) == b"bye\n"


def test_a_command_that_does_not_exist_ends_with_127_and_says_so_in_the_log(node: Node) -> None:
    node.runner.launch(NODE, request("j1", 1, "no-such-program-gpuctl", "x"))
    ended = wait_for(lambda: node.ended("j1", 1))
    assert ended is not None and ended.exit_code == 127
    assert b"no-such-program-gpuctl" in node.log("j1", 1)


def test_a_shell_builtin_name_cannot_run_inside_the_wrapper(node: Node) -> None:
    # `exit` as a command would end the wrapper before it records anything, were it run there
    node.runner.launch(NODE, request("j1", 1, "exit", "4"))
    ended = wait_for(lambda: node.ended("j1", 1))
    assert ended is not None and ended.exit_code == 127


def test_an_incarnation_is_never_launched_twice(node: Node) -> None:
    node.runner.launch(NODE, request("j1", 1, *sh("echo started; sleep 60")))
    with pytest.raises(LaunchRefused, match="j1 incarnation 1 was already launched"):
        node.runner.launch(NODE, request("j1", 1, *sh("echo started; sleep 60")))
    wait_for(lambda: node.log("j1", 1))
    assert node.log("j1", 1) == b"started\n"
    assert [r.incarnation for r in node.runner.observe(NODE)] == [1]


def test_an_ended_incarnation_is_not_launched_again_either(node: Node) -> None:
    node.runner.launch(NODE, request("j1", 1, "true"))
    wait_for(lambda: node.ended("j1", 1))
    with pytest.raises(LaunchRefused):
        node.runner.launch(NODE, request("j1", 1, "true"))


def test_a_missing_workdir_starts_nothing_and_leaves_the_incarnation_free(
    node: Node, tmp_path: Path
) -> None:
    work = tmp_path / "work dir; $(x)"
    with pytest.raises(LaunchFailed, match="working directory") as caught:
        node.runner.launch(NODE, request("j1", 1, "pwd", workdir=str(work)))
    assert caught.value.unknown is False
    assert node.runner.observe(NODE) == []
    work.mkdir()
    node.runner.launch(NODE, request("j1", 1, "pwd", workdir=str(work)))
    wait_for(lambda: node.ended("j1", 1))
    assert node.log("j1", 1) == f"{work}\n".encode()


def test_the_default_workdir_is_the_node_users_home(node: Node) -> None:
    node.runner.launch(NODE, request("j1", 1, "pwd"))
    wait_for(lambda: node.ended("j1", 1))
    assert node.log("j1", 1) == f"{node.home}\n".encode()


def test_observe_lists_every_incarnation_on_the_node_in_one_exec(node: Node) -> None:
    node.runner.launch(NODE, request("a-1", 1, "true"))
    node.runner.launch(NODE, request("a-1", 2))
    node.runner.launch(NODE, request("b.2", 7))
    wait_for(lambda: node.ended("a-1", 1))
    before = len(node.transport.calls)
    runs = node.runner.observe(NODE)
    assert len(node.transport.calls) == before + 1
    assert [(r.job_id, r.incarnation, r.alive, r.exit_code) for r in runs] == [
        ("a-1", 1, False, 0),
        ("a-1", 2, True, None),
        ("b.2", 7, True, None),
    ]


def test_observe_on_a_node_without_runs_is_empty(node: Node) -> None:
    assert node.runner.observe(NODE) == []


# -- signals and fencing --------------------------------------------------------------------------

GROUP_JOB = "sleep 60 & echo $! > child; echo ready; wait"


def child_of(node: Node, job_id: str, n: int, workdir: Path) -> int:
    wait_for(lambda: b"ready" in node.log(job_id, n))
    return int((workdir / "child").read_text())


@pytest.mark.parametrize(("sig", "exit_code"), [("TERM", 143), ("KILL", None)])
def test_a_signal_reaches_the_whole_process_group(
    node: Node, tmp_path: Path, sig: str, exit_code: int | None
) -> None:
    started = node.runner.launch(NODE, request("j1", 1, *sh(GROUP_JOB), workdir=str(tmp_path)))
    assert started.pid is not None
    child = child_of(node, "j1", 1, tmp_path)
    assert node.runner.signal(NODE, "j1", 1, sig) is True
    assert wait_for(lambda: not alive(child) and not alive(started.pid or 0))
    ended = wait_for(lambda: node.ended("j1", 1))
    assert ended is not None
    # TERM: the wrapper survives to record how the job ended; KILL takes the wrapper too
    assert ended.exit_code == exit_code
    assert node.runner.signal(NODE, "j1", 1, sig) is False


def test_usr1_reaches_the_job_and_does_not_stop_it(node: Node) -> None:
    job = "trap 'echo checkpoint-now' USR1; echo ready; while :; do sleep 0.05; done"
    node.runner.launch(NODE, request("j1", 1, *sh(job)))
    wait_for(lambda: b"ready" in node.log("j1", 1))
    assert node.runner.signal(NODE, "j1", 1, "SIGUSR1") is True
    assert wait_for(lambda: b"checkpoint-now" in node.log("j1", 1))
    status = node.status("j1", 1)
    assert status is not None and status.alive


def test_signalling_an_incarnation_leaves_the_next_one_alone(node: Node) -> None:
    one = node.runner.launch(NODE, request("j1", 1))
    two = node.runner.launch(NODE, request("j1", 2))
    assert node.runner.signal(NODE, "j1", 1, "KILL") is True
    assert wait_for(lambda: node.ended("j1", 1))
    assert two.pid is not None and one.pid is not None
    assert alive(two.pid) and not alive(one.pid)
    two_now = node.status("j1", 2)
    assert two_now is not None and two_now.alive


def test_only_the_signals_of_the_contract_are_sent(node: Node) -> None:
    with pytest.raises(UsageError, match="TERM, USR1 or KILL"):
        node.runner.signal(NODE, "j1", 1, "HUP")
    assert node.transport.calls == []


def test_a_recycled_pid_is_not_taken_for_the_job(node: Node) -> None:
    # a process that now has the recorded pid, leads its own group, but is not the job
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_dir = node.run_dir("j1", 1)
        run_dir.mkdir(parents=True)
        (run_dir / "pid").write_text(f"{stranger.pid} 12345\n")
        status = node.status("j1", 1)
        assert status is not None
        assert (status.pid, status.alive, status.exit_code) == (stranger.pid, False, None)
        assert node.runner.signal(NODE, "j1", 1, "KILL") is False
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_worker_left_behind_by_a_dead_wrapper_still_counts_and_is_fenced(
    node: Node, tmp_path: Path
) -> None:
    started = node.runner.launch(NODE, request("j1", 1, *sh(GROUP_JOB), workdir=str(tmp_path)))
    assert started.pid is not None
    child = child_of(node, "j1", 1, tmp_path)
    os.kill(started.pid, signal.SIGKILL)  # the wrapper only: its group lives on
    assert wait_for(lambda: not alive(started.pid or 0))
    status = node.status("j1", 1)
    assert status is not None and status.alive and alive(child)
    assert node.runner.signal(NODE, "j1", 1, "KILL") is True
    assert wait_for(lambda: not alive(child))
    assert wait_for(lambda: node.ended("j1", 1))


# -- fence ----------------------------------------------------------------------------------------


def test_a_fence_kills_the_group_and_every_process_of_the_incarnation_and_says_none_is_left(
    node: Node, tmp_path: Path
) -> None:
    started = node.runner.launch(NODE, request("j1", 1, *sh(GROUP_JOB), workdir=str(tmp_path)))
    other = node.runner.launch(NODE, request("j1", 2))
    child = child_of(node, "j1", 1, tmp_path)
    fenced = node.runner.fence(NODE, "j1", 1)
    assert (fenced.killed, fenced.gone) == (1, True)
    assert not alive(child) and not alive(started.pid or 0)
    assert other.pid is not None and alive(other.pid)  # the next incarnation is left alone
    assert node.runner.fence(NODE, "j1", 1) == Fenced(killed=0, remaining=0)


def test_a_fence_finds_a_copy_whose_run_dir_is_gone_by_its_environment(
    node: Node, tmp_path: Path
) -> None:
    started = node.runner.launch(NODE, request("j1", 1, *sh(GROUP_JOB), workdir=str(tmp_path)))
    child = child_of(node, "j1", 1, tmp_path)
    subprocess.run(["rm", "-rf", str(node.run_dir("j1", 1))], check=True)
    assert node.status("j1", 1) is None  # the observe cannot see it any more
    assert {(p.job_id, p.incarnation) for p in node.runner.processes(NODE)} == {("j1", 1)}
    fenced = node.runner.fence(NODE, "j1", 1)
    assert fenced.killed == 1 and fenced.gone
    assert wait_for(lambda: not alive(child) and not alive(started.pid or 0))
    assert node.runner.processes(NODE) == []


def test_a_fenced_incarnation_that_never_started_can_never_start_there_later(node: Node) -> None:
    # a launch delayed on a node that hung arrives after gpuctl gave up on it and fenced it
    assert node.runner.fence(NODE, "j1", 1).gone
    with pytest.raises(LaunchRefused):
        node.runner.launch(NODE, request("j1", 1))
    assert node.runner.processes(NODE) == []


# -- logs -----------------------------------------------------------------------------------------


def test_logs_are_read_from_an_offset_within_a_limit(node: Node) -> None:
    node.runner.launch(NODE, request("j1", 1, "printf", "0123456789abcdef"))
    wait_for(lambda: node.ended("j1", 1))
    assert node.runner.logs(NODE, "j1", 1, offset=0, limit=4) == (b"0123", 4)
    assert node.runner.logs(NODE, "j1", 1, offset=4, limit=100) == (b"456789abcdef", 16)
    assert node.runner.logs(NODE, "j1", 1, offset=16) == (b"", 16)
    assert node.runner.logs(NODE, "j1", 1, offset=99) == (b"", 99)


def test_logs_of_an_incarnation_that_never_ran_there_are_an_error(node: Node) -> None:
    with pytest.raises(RunNotFound, match="n1: job j1 incarnation 5 has no run dir"):
        node.runner.logs(NODE, "j1", 5)


def test_binary_log_bytes_come_back_unchanged(node: Node) -> None:
    node.runner.launch(
        NODE, request("j1", 1, PY, "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))")
    )
    wait_for(lambda: node.ended("j1", 1))
    assert node.runner.logs(NODE, "j1", 1) == (bytes(range(256)), 256)


# -- secrets and quoting --------------------------------------------------------------------------

HOSTILE = [
    "a;b",
    "$(touch canary-dollar)",
    "`touch canary-tick`",
    'it\'s "quoted"',
    "new\nline",
    "; touch canary-semi #",
    "tail\n\n",
    "ünïcödé $HOME *",
]
PRINT_ARGS = (PY, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))")


def test_hostile_arguments_reach_the_job_unchanged_and_run_nothing(
    node: Node, tmp_path: Path
) -> None:
    node.runner.launch(NODE, request("j1", 1, *PRINT_ARGS, *HOSTILE, workdir=str(tmp_path)))
    wait_for(lambda: node.ended("j1", 1))
    assert json.loads(node.log("j1", 1)) == HOSTILE
    assert not list(tmp_path.glob("canary*")) and not list(node.home.glob("canary*"))


def test_hostile_env_and_secret_values_reach_the_job_unchanged(node: Node, tmp_path: Path) -> None:
    env = {f"E{i}": v for i, v in enumerate(HOSTILE)}
    secrets = {f"S{i}": v for i, v in enumerate(HOSTILE)}
    dump = (
        "import os, json; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k[0] in 'ES' and k[1:].isdigit()}))"
    )
    node.runner.launch(
        NODE,
        request("j1", 1, PY, "-c", dump, workdir=str(tmp_path), env=env, secret_env=secrets),
    )
    wait_for(lambda: node.ended("j1", 1))
    assert json.loads(node.log("j1", 1)) == env | secrets
    assert not list(tmp_path.glob("canary*")) and not list(node.home.glob("canary*"))


@pytest.mark.parametrize("job_id", ["a;touch canary", "$(touch canary)", "-rf", "../x", "a b", ""])
def test_a_hostile_job_id_is_refused_before_anything_is_sent(node: Node, job_id: str) -> None:
    with pytest.raises(UsageError, match="job id"):
        node.runner.launch(NODE, request(job_id))
    with pytest.raises(UsageError, match="job id"):
        node.runner.signal(NODE, job_id, 1, "KILL")
    with pytest.raises(UsageError, match="job id"):
        node.runner.logs(NODE, job_id, 1)
    assert node.transport.calls == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"env": {"BAD-NAME": "x"}}, "not a valid environment variable name"),
        ({"secret_env": {"1X": "x"}}, "not a valid environment variable name"),
        ({"env": {"X": "nul\0"}}, "without NUL"),
        ({"argv": ()}, "command is empty"),
        ({"argv": ("a\0b",)}, "without NUL"),
        ({"incarnation": 0}, "incarnation"),
        ({"workdir": ""}, "workdir is empty"),
    ],
)
def test_a_request_the_node_could_misread_is_refused(
    node: Node, change: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        node.runner.launch(NODE, dataclasses.replace(request("j1"), **change))  # type: ignore[arg-type]
    assert node.transport.calls == []


def test_secret_values_travel_on_stdin_only(node: Node) -> None:
    secret = "hunter2-" + "x" * 20
    digest = hashlib.sha256(secret.encode()).hexdigest()
    job = "import os, hashlib; print(hashlib.sha256(os.environ['TOKEN'].encode()).hexdigest())"
    node.runner.launch(NODE, request("j1", 1, PY, "-c", job, secret_env={"TOKEN": secret}))
    wait_for(lambda: node.ended("j1", 1))
    assert node.log("j1", 1).decode().strip() == digest
    assert not any(secret in command for _node, command in node.transport.calls)
    files = [p for p in node.run_dir("j1", 1).iterdir() if p.is_file()]
    assert {p.name for p in files} == {"run.sh", "pid", "started", "log", "exit", "checkpoint_dir"}
    for path in files:
        assert secret.encode() not in path.read_bytes()
    assert secret not in repr(
        job_launch.launch_command(request("j1", secret_env={"TOKEN": secret}))
    )


def test_secrets_are_framed_as_a_count_then_base64_lines() -> None:
    data = job_launch.encode_secrets({"B": "two\nlines", "A": ""})
    assert data == b"2\nA=\nB=dHdvCmxpbmVz\n"
    assert job_launch.encode_secrets({}) == b"0\n"


def test_a_launch_stdin_cut_short_starts_nothing(node: Node) -> None:
    command = job_launch.launch_command(request("j1", secret_env={"A": "1", "B": "2"}))
    assert command.stdin is not None
    result = node.transport.run(
        NODE, command.command, timeout_s=10, stdin=command.stdin.split(b"\n")[0] + b"\n"
    )
    outcome = job_launch.parse_launch(result.stdout)
    assert (outcome.result, outcome.reason) == ("failed", "secret env: stdin ended early")
    assert node.runner.observe(NODE) == []


# -- MPS ------------------------------------------------------------------------------------------

MPS_ENV = (PY, "-c", "import os; print(os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'))")


def test_where_mps_runs_the_slice_is_set_as_the_mps_client_memory_limit(
    node: Node, tmp_path: Path
) -> None:
    pipes = tmp_path / "mps"
    pipes.mkdir()
    os.mkfifo(pipes / "control")
    node.env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipes)
    node.runner.launch(NODE, request("j1", 1, *MPS_ENV, devices="2,5", mps_limit_mib=2048))
    wait_for(lambda: node.ended("j1", 1))
    assert node.log("j1", 1) == b"0=2048M,1=2048M\n"


def test_without_an_mps_daemon_no_mps_limit_is_set(node: Node) -> None:
    node.runner.launch(NODE, request("j1", 1, *MPS_ENV, devices="0", mps_limit_mib=2048))
    wait_for(lambda: node.ended("j1", 1))
    assert node.log("j1", 1) == b"None\n"


# -- checkpoints ----------------------------------------------------------------------------------


def commit(root: Path, step: int, files: dict[str, bytes], *, incarnation: int = 1) -> Path:
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    marker = {
        "format": 1,
        "job_id": "j1",
        "incarnation": incarnation,
        "step": step,
        "committed_at": 1000.0 + step,
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    }
    (folder / "COMMITTED").write_text(json.dumps(marker))
    return folder


def test_checkpoints_are_verified_on_the_node_and_a_corrupted_one_is_reported(
    node: Node, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    commit(root, 10, {"model.pt": b"ten", "opt/state.bin": b"x" * 5000})
    commit(root, 20, {"model.pt": b"twenty"}, incarnation=2)
    bad = commit(root, 30, {"model.pt": b"thirty"}, incarnation=2)
    (bad / "model.pt").write_bytes(b"thirtY")
    gone = commit(root, 40, {"model.pt": b"forty"}, incarnation=2)
    (gone / "model.pt").unlink()
    (root / "step-00000050").mkdir()  # being written: no marker yet
    (root / ".tmp-step-60-2-123").mkdir()  # the helper's temp folder: not a checkpoint
    markers = node.runner.checkpoints(NODE, str(root))
    assert [(m.step, m.valid, m.problem) for m in markers] == [
        (50, False, "no marker"),
        (40, False, "missing file: model.pt"),
        (30, False, "checksum mismatch: model.pt"),
        (20, True, None),
        (10, True, None),
    ]
    assert markers[3].path == str(root / "step-00000020")
    assert (markers[3].incarnation, markers[3].committed_at) == (2, 1020.0)


def test_an_unreadable_marker_makes_its_checkpoint_invalid(node: Node, tmp_path: Path) -> None:
    folder = commit(tmp_path / "ckpt", 10, {"model.pt": b"ten"})
    (folder / "COMMITTED").write_text("{not json")
    (marker,) = node.runner.checkpoints(NODE, str(tmp_path / "ckpt"))
    assert marker.valid is False and marker.problem is not None
    assert marker.problem.startswith("unreadable marker")


def test_a_marker_cannot_make_the_node_hash_files_outside_its_folder(
    node: Node, tmp_path: Path
) -> None:
    folder = commit(tmp_path / "ckpt", 10, {"model.pt": b"ten"})
    doc = json.loads((folder / "COMMITTED").read_text())
    doc["files"] = {"../../../etc/passwd": "0" * 64}
    (folder / "COMMITTED").write_text(json.dumps(doc))
    (marker,) = node.runner.checkpoints(NODE, str(tmp_path / "ckpt"))
    assert marker.valid is False
    assert all("passwd" not in command for _n, command in node.transport.calls)


def test_only_the_newest_checkpoints_are_listed(node: Node, tmp_path: Path) -> None:
    for step in (5, 100, 20, 7):
        commit(tmp_path / "ckpt", step, {"m": str(step).encode()})
    runner = SshJobRunner(node.transport, max_checkpoints=2)
    assert [m.step for m in runner.checkpoints(NODE, str(tmp_path / "ckpt"))] == [100, 20]


def test_a_checkpoint_dir_that_does_not_exist_has_no_checkpoints(
    node: Node, tmp_path: Path
) -> None:
    assert node.runner.checkpoints(NODE, str(tmp_path / "nowhere")) == []


def test_copying_checkpoints_needs_a_transport_that_copies_folders(
    node: Node, tmp_path: Path
) -> None:
    with pytest.raises(CheckpointCopyError, match="cannot copy folders"):
        node.runner.pull_checkpoint(NODE, "/x/step-00000001", str(tmp_path / "dest"))


# -- parsers on their own -------------------------------------------------------------------------


def test_the_launch_result_is_found_after_login_shell_noise() -> None:
    out = b"Welcome!\ngpuctl-launch started 4242 1 /home/u/.gpuctl/runs/j1/3\n"
    outcome = job_launch.parse_launch(out)
    assert (outcome.result, outcome.pid, outcome.mps_limited) == ("started", 4242, True)
    assert outcome.run_dir == "/home/u/.gpuctl/runs/j1/3"
    assert job_launch.parse_launch(b"").result == "unknown"
    assert job_launch.parse_launch(b"gpuctl-launch started x\n").result == "unknown"


def test_observe_output_that_is_not_a_run_is_ignored() -> None:
    out = (
        b"gpuctl-run j1 1 100 1 - /h/.gpuctl/runs/j1/1\n"
        b"gpuctl-run bad;id 1 100 1 - /h\n"
        b"gpuctl-run j1 x 100 1 - /h\n"
        b"gpuctl-run j2 2 - 0 137 /h/.gpuctl/runs/j2/2\n"
        b"gpuctl-run short\n"
        b"noise\n"
        b"gpuctl-observed 5\n"
    )
    assert jobexec.parse_observe(out) == [
        RunStatus("j1", 1, 100, True, None, "/h/.gpuctl/runs/j1/1"),
        RunStatus("j2", 2, None, False, 137, "/h/.gpuctl/runs/j2/2"),
    ]


def test_an_observe_listing_cut_short_is_no_reading_not_an_empty_node() -> None:
    whole = b"gpuctl-run j1 1 100 1 - /h/.gpuctl/runs/j1/1\ngpuctl-observed 1\n"
    assert jobexec.parse_observe(whole) is not None
    assert jobexec.parse_observe(b"") is None  # sshd killed before the script printed
    assert jobexec.parse_observe(whole.split(b"gpuctl-observed")[0]) is None
    assert jobexec.parse_observe(b"gpuctl-observed 2\n" + whole) is None  # lines lost


@pytest.mark.parametrize(
    "answer",
    [
        # the session ended without an exit status, nothing printed: sshd was killed mid-exec
        ExecResult(exit_code=None, stdout=b"", stderr=b"", duration_s=0.1),
        ExecResult(exit_code=None, stdout=b"gpuctl-observed 0\n", stderr=b"", duration_s=0.1),
        ExecResult(exit_code=255, stdout=b"gpuctl-observed 0\n", stderr=b"", duration_s=0.1),
        ExecResult(exit_code=0, stdout=b"", stderr=b"", duration_s=0.1),
    ],
)
def test_an_observe_that_did_not_arrive_whole_is_a_transport_error_never_an_empty_list(
    answer: ExecResult,
) -> None:
    from gpuctl.errors import TransportError

    runner = SshJobRunner(FakeTransport({"n1": answer}))
    with pytest.raises(TransportError, match="nothing is concluded"):
        runner.observe(NODE)
    with pytest.raises(TransportError, match="nothing is concluded"):
        runner.fence(NODE, "j1", 1)
    with pytest.raises(TransportError, match="nothing is concluded"):
        runner.processes(NODE)


def test_an_unreachable_node_is_a_transport_error_from_the_runner() -> None:
    from gpuctl.errors import ConnectRefused

    runner = SshJobRunner(FakeTransport({"n1": ConnectRefused("n1: connection refused")}))
    with pytest.raises(ConnectRefused):
        runner.observe(NODE)


def test_the_log_header_is_found_after_login_shell_noise() -> None:
    out = b"motd\ngpuctl-log 12\nline one\ngpuctl-log fake\n"
    assert jobexec.parse_logs(out, 100, 1000) == (b"line one\ngpuctl-log fake\n", 125)
    assert jobexec.parse_logs(b"gpuctl-log missing\n", 0, 10) is None
    assert jobexec.parse_logs(b"", 7, 10) == (b"", 7)


def test_the_launch_sends_secrets_on_stdin_and_the_rest_on_the_command_line() -> None:
    answer = ExecResult(0, b"gpuctl-launch started 77 0 /h/.gpuctl/runs/j1/4\n", b"", 0.01)
    fake = FakeTransport({"n1": answer})
    status = SshJobRunner(fake).launch(
        NODE, request("j1", 4, "python3", "train.py", secret_env={"TOKEN": "t0ps3cret"})
    )
    assert status == RunStatus("j1", 4, 77, True, None, "/h/.gpuctl/runs/j1/4")
    ((_, command),) = fake.calls
    assert "train.py" in command and "GPUCTL_INCARNATION=4" in command
    assert "t0ps3cret" not in command and "dDBwczNjcmV0" not in command
    assert fake.stdins == [b"1\nTOKEN=dDBwczNjcmV0\n"]


def test_a_tilde_means_the_node_users_home_in_workdir_and_the_checkpoint_env(node: Node) -> None:
    (node.home / "work").mkdir()
    script = 'pwd; printf "%s\\n" "$GPUCTL_CHECKPOINT_DIR" "$GPUCTL_RESUME_FROM" "$PLAIN"'
    node.runner.launch(
        NODE,
        request(
            "j1", 1, *sh(script),
            workdir="~/work", ckpt="~/ckpt/j1", resume_from="~/ckpt/j1/step-00000010",
            env={"PLAIN": "a~b"},
        ),
    )  # fmt: skip
    wait_for(lambda: node.ended("j1", 1))
    assert node.log("j1", 1).decode().splitlines() == [
        f"{node.home}/work",
        f"{node.home}/ckpt/j1",
        f"{node.home}/ckpt/j1/step-00000010",
        "a~b",
    ]


def test_checkpoints_under_a_tilde_dir_are_found_in_the_node_users_home(node: Node) -> None:
    commit(node.home / "ckpt", 10, {"model.pt": b"ten"})
    (marker,) = node.runner.checkpoints(NODE, "~/ckpt")
    assert (marker.step, marker.valid) == (10, True)


def test_a_node_whose_grep_cannot_read_nul_separated_files_gives_no_reading(
    tmp_path: Path,
) -> None:
    # an empty process listing from a grep without -z would read as "nothing of it is left"
    from gpuctl.errors import TransportError

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "grep").write_text("#!/bin/sh\necho 'grep: invalid option -- z' >&2\nexit 2\n")
    (bin_dir / "grep").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    runner = SshJobRunner(ShellTransport({"n1": env}))
    with pytest.raises(TransportError, match="cannot read NUL-separated files"):
        runner.fence(NODE, "j1", 1)
    with pytest.raises(TransportError, match="cannot read NUL-separated files"):
        runner.processes(NODE)


def test_observe_says_what_each_alive_run_committed_last_without_reading_markers(
    node: Node, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    (work / "ck").mkdir(parents=True)
    node.runner.launch(NODE, request("a-1", 1, workdir=str(work), ckpt="ck"))  # relative
    node.runner.launch(NODE, request("b-2", 1, ckpt=str(tmp_path / "none-yet")))
    node.runner.launch(NODE, request("c-3", 1, "true", ckpt=str(work / "ck")))
    wait_for(lambda: node.ended("c-3", 1))
    for step, at in ((30, 1_700_000_030.5), (40, 1_700_000_020.0), (7, 1_700_000_010.0)):
        folder = work / "ck" / f"step-{step:08d}"
        folder.mkdir()
        (folder / "COMMITTED").write_text("{}")  # never read: a stat is all it takes
        os.utime(folder / "COMMITTED", (at, at))
    (work / "ck" / "step-00000099").mkdir()  # not committed

    runs = {r.job_id: r.commit for r in node.runner.observe(NODE)}
    # the most recently written marker, with its time, whichever step it names
    assert runs == {
        "a-1": CommitSeen(30, 1_700_000_030.5),
        "b-2": CommitSeen(None, None),
        "c-3": None,  # ended: not looked at
    }


def test_observe_reads_commit_lines_it_can_trust_and_ignores_the_rest() -> None:
    out = (
        b"gpuctl-commit j1 1 00000120 1767225610.250000000\n"
        b"gpuctl-run j1 1 100 1 - /h/.gpuctl/runs/j1/1\n"
        b"gpuctl-commit j2 1 - -\n"
        b"gpuctl-run j2 1 101 1 - /h/.gpuctl/runs/j2/1\n"
        b"gpuctl-commit j3 1 5 %s.%N\n"
        b"gpuctl-run j3 1 102 1 - /h/.gpuctl/runs/j3/1\n"
        b"gpuctl-commit j4 1 x 1\n"
        b"gpuctl-run j4 1 103 1 - /h/.gpuctl/runs/j4/1\n"
        b"gpuctl-observed 4\n"
    )
    runs = jobexec.parse_observe(out)
    assert runs is not None
    assert [r.commit for r in runs] == [
        CommitSeen(120, 1767225610.25),
        CommitSeen(None, None),
        CommitSeen(5, None),  # a `date` without %N: the step still says it changed
        None,
    ]
