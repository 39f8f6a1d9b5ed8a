"""A node's answering session (`SshTransport.ask`) against real sshd on loopback: warm polls go
through one long-lived command per node; an answer is whole or an error, never a partial one."""

import os
import signal
import time

import pytest

from gpuctl.adapters.exec_wrapper import SELF_BOUNDED
from gpuctl.adapters.ssh import PhaseTimeout, SshTransport
from gpuctl.core.model import Reach
from gpuctl.errors import TransportError
from gpuctl.ops.gather import Gatherer
from gpuctl.testing.lab import LabFleet
from gpuctl.testing.waiting import wait_for
from tests.e2e.test_ssh_transport import live_processes_with

pytestmark = pytest.mark.e2e


def unique() -> str:
    return f"gpuctl-session-test-{os.getpid()}-{time.monotonic_ns()}"


def test_warm_polls_reuse_one_session_per_node_and_read_every_gpu(
    lab: LabFleet, transport: SshTransport
) -> None:
    specs = lab.specs()
    with Gatherer(transport) as gatherer:
        for _ in range(3):
            fleet = gatherer.gather(specs)
            assert [(n.reach, len(n.gpus)) for n in fleet.nodes] == [(Reach.OK, 4)] * len(specs)
            # the static facts read by the first (full) poll are kept by the light ones
            assert all(n.observation and n.observation.facts.cuda_version for n in fleet.nodes)
        assert transport.connects == len(specs)
        assert transport.sessions_started == len(specs)


def test_an_answer_comes_back_byte_for_byte_with_its_exit_status(
    lab: LabFleet, transport: SshTransport
) -> None:
    # the program prints what looks like the session's own framing: the length decides
    program = (
        f"{SELF_BOUNDED}printf '\\036gpuctl-answer 0 1\\nX\\n\\036gpuctl-end\\n'\n"
        "printf 'a\\n\\n%s é\\n' \"$1\"; exit 3\n"
    )
    spec = lab.spec("lab-01")
    for request in ("one", "two; rm -rf ~ `x` $(y)"):
        result = transport.ask(spec, program, request, timeout_s=10)
        expected = f"\x1egpuctl-answer 0 1\nX\n\x1egpuctl-end\na\n\n{request} é".encode()
        assert (result.exit_code, result.stdout) == (3, expected)
    assert transport.sessions_started == 1


def test_a_late_answer_is_a_read_timeout_killed_on_the_node_and_the_next_ask_starts_afresh(
    lab: LabFleet, transport: SshTransport
) -> None:
    marker = f"30{os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    program = f'{SELF_BOUNDED}case $1 in slow) sleep {marker} ;; esac; echo "ok $1"\n'
    spec = lab.spec("lab-02")
    assert transport.ask(spec, program, "fast", timeout_s=10).stdout == b"ok fast"
    start = time.monotonic()
    with pytest.raises(PhaseTimeout) as err:
        transport.ask(spec, program, "slow", timeout_s=1.0)
    assert time.monotonic() - start < 2.5
    assert err.value.phase == "read" and "killed on the node" in err.value.message
    assert wait_for(lambda: not live_processes_with(f"sleep {marker}"), timeout_s=2)
    assert transport.ask(spec, program, "again", timeout_s=10).stdout == b"ok again"
    assert transport.sessions_started == 2


def test_a_session_killed_between_asks_is_started_again_without_an_error(
    lab: LabFleet, transport: SshTransport
) -> None:
    mark = unique()
    program = f"{SELF_BOUNDED}# {mark}\necho pong\n"
    spec = lab.spec("lab-03")
    assert transport.ask(spec, program, "ping", timeout_s=10).stdout == b"pong"
    loops = live_processes_with(mark)
    assert loops
    for pid in loops:
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not live_processes_with(mark), timeout_s=5)
    assert transport.ask(spec, program, "ping", timeout_s=10).stdout == b"pong"
    assert transport.sessions_started == 2
    assert transport.connects == 1


def test_an_answer_cut_short_is_a_transport_error_never_a_partial_answer(
    lab: LabFleet, transport: SshTransport
) -> None:
    # half an answer straight onto the session's stdout, then the session's processes die
    program = (
        f"{SELF_BOUNDED}printf '\\036gpuctl-answer 0 100\\nhalf an answer' > /proc/$$/fd/1\n"
        "kill -9 0\n"
    )
    with pytest.raises(TransportError) as err:
        transport.ask(lab.spec("lab-01"), program, "x", timeout_s=10)
    message = err.value.message
    assert message.startswith("lab-01 (") and "\n" not in message
    assert "the session ended before the answer was whole" in message


def test_warm_asks_go_out_together_leaving_nodes_without_a_session_to_ask(
    lab: LabFleet, transport: SshTransport
) -> None:
    n, ns = 40000 + os.getpid() % 1000, time.monotonic_ns() % 10**6
    marker = f"{n}.{ns}"  # the sleep's command line; the sessions' own say $((n)).ns
    program = f'{SELF_BOUNDED}case $1 in slow) sleep $(({n})).{ns} ;; esac; echo "ok $1"\n'
    one, two = lab.spec("lab-01"), lab.spec("lab-02", command_timeout_s=1.0)
    for spec in (one, two):
        transport.ask(spec, program, "warm-up", timeout_s=10)
    start = time.monotonic()
    answers = transport.ask_warm(
        [(one, "a"), (two, "slow"), (lab.spec("lab-03"), "a")], program, max_output_bytes=1000
    )
    assert time.monotonic() - start < 2.5
    assert sorted(answers) == [0, 1]  # lab-03 has no session yet: left to `ask`
    first, late = answers[0], answers[1]
    assert not isinstance(first, TransportError) and first.stdout == b"ok a"
    assert isinstance(late, PhaseTimeout) and late.phase == "read"
    assert late.message.startswith("lab-02 (") and "killed on the node" in late.message
    assert wait_for(lambda: not live_processes_with(f"sleep {marker}"), timeout_s=2)
    # the late node's session was dropped: it is left out until `ask` starts a new one
    assert sorted(transport.ask_warm([(one, "b"), (two, "b")], program)) == [0]
    assert transport.ask(two, program, "b", timeout_s=10).stdout == b"ok b"
