"""The remote wrapper and the deadline machinery of the SSH transport, run with the local shells."""

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpuctl.adapters import exec_wrapper
from gpuctl.adapters.ssh import _exec as ssh_exec

SHELLS = [s for s in ("/bin/sh", "/bin/dash", "/bin/bash") if shutil.which(s)]


def run_like_sshd(shell: str, command: str) -> subprocess.CompletedProcess[bytes]:
    """sshd runs `$SHELL -c COMMAND` in a new session, the shell's own name as $0; so do we."""
    return subprocess.run(
        [Path(shell).name, "-c", command],
        executable=shell,
        capture_output=True,
        start_new_session=True,
        timeout=10,
        check=False,
    )


def live_in_group(pgid: int) -> list[int]:
    """Processes of the group that are still alive (zombies wait for init to reap them)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def split_marker(stdout: bytes) -> tuple[int, bytes]:
    out = ssh_exec.ReadResult()
    head = bytearray(stdout)
    rest = ssh_exec._take_pgid(out, head)
    assert out.pgid is not None
    return out.pgid, rest


@pytest.mark.parametrize("shell", SHELLS)
def test_the_wrapper_reports_the_process_group_the_command_runs_in(shell: str) -> None:
    done = run_like_sshd(shell, exec_wrapper.wrap_command("ps -o pgid= -p $$; exit 7", timeout_s=5))
    pgid, rest = split_marker(done.stdout)
    assert done.returncode == 7
    assert int(rest.strip()) == pgid


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("head", ["", exec_wrapper.SELF_BOUNDED])
def test_the_wrapper_passes_a_hostile_command_through_unchanged(shell: str, head: str) -> None:
    command = head + "printf '%s|' 'a;b' \"\\$(x)\" '`y`' \"it's\" \"$0\"; printf '\\n'"
    wrapped = run_like_sshd(shell, exec_wrapper.wrap_command(command, timeout_s=5))
    assert split_marker(wrapped.stdout)[1] == b"a;b|$(x)|`y`|it's|sh|\n"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_self_bounded_command_runs_in_place_of_the_login_shell(shell: str) -> None:
    """No `timeout` backstop: the command is the session's own process (two processes fewer),
    in the group the client kills on its deadline; any other command runs under `timeout`."""
    probe = (
        exec_wrapper.SELF_BOUNDED + "echo $$; tr '\\0' ' ' </proc/$$/cmdline | head -c 12; exit 7"
    )
    done = run_like_sshd(shell, exec_wrapper.wrap_command(probe, timeout_s=5))
    pgid, rest = split_marker(done.stdout)
    pid, running = rest.decode().splitlines()
    assert (done.returncode, int(pid)) == (7, pgid)
    # a login shell that is `sh` runs it itself (eval), any other execs sh in its place
    assert running == ("sh -c printf" if Path(shell).name == "sh" else "sh -c # gpuc")
    other = run_like_sshd(shell, exec_wrapper.wrap_command("echo $$; exit 7", timeout_s=5))
    pgid, rest = split_marker(other.stdout)
    assert other.returncode == 7 and int(rest) != pgid  # a child of timeout, in the same group


@pytest.mark.parametrize("shell", SHELLS)
def test_the_kill_command_kills_the_whole_process_group(shell: str) -> None:
    group = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 300 & sleep 300 & wait"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        killer = subprocess.run([shell, "-c", exec_wrapper.kill_command(group.pid)], check=False)
        assert killer.returncode == 0
        assert group.wait(timeout=5) == -signal.SIGKILL
        deadline = time.monotonic() + 2  # SIGKILL is sent; the kernel finishes them a moment later
        while live_in_group(group.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live_in_group(group.pid) == []
    finally:
        if group.poll() is None:
            os.killpg(group.pid, signal.SIGKILL)
            group.wait()


def test_noise_from_the_login_shell_before_the_marker_is_kept() -> None:
    out = ssh_exec.ReadResult()
    head = bytearray(b"welcome\n")
    assert ssh_exec._take_pgid(out, head) == b""  # no marker yet: wait for more
    head += exec_wrapper.PGID_MARK + b"12"
    assert ssh_exec._take_pgid(out, head) == b""  # marker line not complete yet
    head += b"34\nresult\n"
    assert ssh_exec._take_pgid(out, head) == b"welcome\nresult\n"
    assert out.pgid == 1234


def test_without_a_marker_the_output_is_not_held_back_forever() -> None:
    out = ssh_exec.ReadResult()
    head = bytearray(b"x" * 5000)
    assert ssh_exec._take_pgid(out, head) == b"x" * 5000
    assert out.pgid == -1  # unknown: nothing will be killed by number


def test_the_watchdog_runs_an_action_at_its_deadline() -> None:
    dog = ssh_exec.Watchdog()
    fired = threading.Event()
    try:
        timer = dog.arm(time.monotonic() + 0.05, fired.set)
        assert fired.wait(timeout=5)
        assert timer.cancel() is True  # it had fired
    finally:
        dog.close()


def test_a_cancelled_timer_never_fires_while_later_ones_still_do() -> None:
    dog = ssh_exec.Watchdog()
    cancelled = threading.Event()
    later = threading.Event()
    try:
        timer = dog.arm(time.monotonic() + 0.05, cancelled.set)
        assert timer.cancel() is False
        dog.arm(time.monotonic() + 0.1, later.set)
        assert later.wait(timeout=5)
        assert not cancelled.is_set()
    finally:
        dog.close()


def test_a_timer_due_before_every_pending_one_fires_on_time() -> None:
    dog = ssh_exec.Watchdog()
    early, late = threading.Event(), threading.Event()
    try:
        far = dog.arm(time.monotonic() + 30, late.set)  # the thread now sleeps for 30 s
        started = time.monotonic()
        dog.arm(time.monotonic() + 0.05, early.set)
        assert early.wait(timeout=5)
        assert time.monotonic() - started < 2
        assert not late.is_set() and far.cancel() is False
    finally:
        dog.close()


class PipeChannel:
    """What `read_channel` uses of a paramiko Channel, over a pipe whose read end is `fd`."""

    def __init__(self, fd: int, write_fd: int) -> None:
        self.fd, self.write_fd = fd, write_fd
        self.data = b""
        self.eof_received = False
        self.closed = False
        self.status_event = threading.Event()
        self.exit_status = -1

    def fileno(self) -> int:
        return self.fd

    def recv_ready(self) -> bool:
        if not self.data:
            try:
                os.set_blocking(self.fd, False)
                self.data = os.read(self.fd, 4096)
            except BlockingIOError:
                return False
            if not self.data:  # the writer closed: the command's end
                self.eof_received = True
                self.exit_status = 0
                self.status_event.set()
        return bool(self.data)

    def recv(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out

    def recv_stderr_ready(self) -> bool:
        return False

    def recv_stderr(self, n: int) -> bytes:
        return b""


def test_a_channel_whose_descriptor_is_past_1024_is_read_to_its_end() -> None:
    """A controller pooling a fleet's connections holds more than 1024 descriptors; select()
    refused such a channel ("filedescriptor out of range") and the command failed."""
    read_fd, write_fd = os.pipe()
    high = os.dup2(read_fd, 1500)
    os.close(read_fd)
    chan = PipeChannel(high, write_fd)
    mark = exec_wrapper.PGID_MARK.decode()

    def command() -> None:
        os.write(write_fd, f"{mark}4242\nhello ".encode())
        time.sleep(0.2)  # the reader has to wait for the rest: the wait is what is tested
        os.write(write_fd, b"world\n")
        os.close(write_fd)

    writer = threading.Thread(target=command)
    writer.start()
    try:
        out = ssh_exec.read_channel(chan, time.monotonic() + 10, 1 << 20)  # type: ignore[arg-type]
    finally:
        writer.join()
        os.close(high)
    assert bytes(out.stdout) == b"hello world\n"
    assert out.pgid == 4242 and out.finished and out.exit_code == 0
