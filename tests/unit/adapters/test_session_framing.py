"""The answering session's framing (`exec_wrapper.session_command` / `take_answer`): an answer is
taken whole, by its length, or the stream is refused; never a partial answer."""

import pytest

from gpuctl.adapters.exec_wrapper import (
    SELF_BOUNDED,
    AnswerFramingError,
    session_command,
    take_answer,
)


def frame(status: int, body: bytes) -> bytes:
    return b"\x1egpuctl-answer %d %d\n%s\n\x1egpuctl-end\n" % (status, len(body), body)


def test_an_answer_is_taken_only_once_all_of_it_came() -> None:
    whole = frame(3, b"line\n\x1egpuctl-end\nmore")  # its own end line inside: length decides
    buf = bytearray()
    for i in range(len(whole) - 1):
        buf[:] = whole[: i + 1]
        assert take_answer(buf, 1 << 20) is None
        assert bytes(buf) == whole[: i + 1]  # nothing consumed yet
    buf[:] = whole + frame(0, b"next")
    assert take_answer(buf, 1 << 20) == (3, b"line\n\x1egpuctl-end\nmore")
    assert take_answer(buf, 1 << 20) == (0, b"next")
    assert buf == b""


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        (b"hello from .bashrc\n", "not an answer"),
        (b"\x1egpuctl-answer x 3\nabc\n\x1egpuctl-end\n", "malformed"),
        (b"\x1egpuctl-answer 0 2\nabc\n\x1egpuctl-end\n", "does not end where its length says"),
        (b"\x1egpuctl-answer 0 4\nabc\n\x1egpuctl-end\nXX", "does not end where its length says"),
        (b"\x1egpuctl-answer 0 999999\n", "over the limit of 1000"),
        (b"\x1egpuctl-answer 0 " + b"1" * 80, "not an answer"),
    ],
)
def test_a_stream_out_of_framing_is_refused(stream: bytes, why: str) -> None:
    with pytest.raises(AnswerFramingError, match=why):
        take_answer(bytearray(stream), 1000)


def test_a_session_runs_only_a_program_that_bounds_its_own_steps() -> None:
    with pytest.raises(ValueError, match="SELF_BOUNDED"):
        session_command("sleep 1000")
    command = session_command(f"{SELF_BOUNDED}echo '$1'; rm -rf /tmp/x")
    assert command.startswith(SELF_BOUNDED)
    assert "gpuctl_p='# gpuctl" in command  # the program travels quoted, as one word
