"""How a transport runs every remote command, as text: a wrapper that prints the command's
process group first (so the client can kill it, and everything it starts, when its own deadline
passes) and runs it under coreutils `timeout` as the backstop when the client is gone.

The remote command runs as `printf MARK$$; exec timeout -k 2 LIMIT sh -c COMMAND`: sshd starts
every session command in a new session, so `$$` is the process group of the command and everything
it starts (bar daemons that call `setsid`). A command that starts with the `SELF_BOUNDED` line
bounds every step it takes itself (the gather probe: each step under its own `timeout`) and runs
without that backstop, as `printf MARK$$; exec sh -c COMMAND`: two processes fewer per run (three
when the login shell is itself `sh`: it then runs the command with `eval`).

PURE: text in, text out. The SSH transport (`gpuctl.adapters.ssh`) sends it; the probe script says
it is self-bounded, and the launch script's size is measured inside it.
"""

from __future__ import annotations

import math
import shlex

PGID_MARK = b"\x1egpuctl-pgid="
SELF_BOUNDED = "# gpuctl: every step of this command has its own time limit\n"


def wrap_command(command: str, timeout_s: float) -> str:
    """The command line sent to sshd (`command` itself is already quoted by the caller)."""
    limit = math.ceil(timeout_s) + 2
    inner = shlex.quote(command)
    mark = PGID_MARK.decode("ascii").replace("\x1e", "\\036")
    if command.startswith(SELF_BOUNDED):
        # sshd runs `SHELL -c` with the shell's name as $0: a login shell that is `sh` runs the
        # command itself (one exec fewer, the same $0); any other hands it to sh
        return (
            f"printf '{mark}%s\\n' \"$$\"; gpuctl_c={inner}; "
            'case $0 in sh) eval "$gpuctl_c"; exit ;; esac; exec sh -c "$gpuctl_c"'
        )
    return (
        f"printf '{mark}%s\\n' \"$$\"; "
        f"command -v timeout >/dev/null 2>&1 && exec timeout -k 2 {limit} sh -c {inner}; "
        f"exec sh -c {inner}"
    )


def kill_command(pgid: int) -> str:
    # `kill -9 -PGID`: the one spelling dash, bash and zsh all read as "the process group"
    return f"kill -9 -{int(pgid)} 2>/dev/null || kill -9 {int(pgid)} 2>/dev/null; true"


# -- a session: one long-lived command answering request lines --------------------------------

ANSWER_MARK = b"\x1egpuctl-answer "
ANSWER_END = b"\x1egpuctl-end\n"
_MAX_ANSWER_HEAD = 64


class AnswerFramingError(ValueError):
    """What a session printed is not a framed answer (a shell counting characters, not bytes,
    or noise on its stdout): the session cannot be trusted and is dropped."""


def session_command(program: str) -> str:
    """A loop reading one request line at a time on stdin and answering each with `program`
    run in a subshell (the line is its `$1`, stdin /dev/null), framed as

        \\036gpuctl-answer <exit status> <bytes>\\n<answer>\\n\\036gpuctl-end\\n

    The answer's length, not a text marker, says where it ends, and the end line after it checks
    the count: nothing the program prints can end an answer early or forge the next one. The
    answer is captured whole before it is written, so it leaves in one go (sh's `$(...)` drops
    trailing newlines and NUL bytes). `program` must bound every step itself (`SELF_BOUNDED`):
    the loop runs for as long as the connection, with no `timeout` around it; it ends when its
    stdin closes (the channel or the connection went) and the client kills its process group
    when an answer is late. Constant text but `program`, which is quoted here."""
    if not program.startswith(SELF_BOUNDED):
        raise ValueError("a session's program must bound its own steps (SELF_BOUNDED)")
    return (
        f"{SELF_BOUNDED}LC_ALL=C; export LC_ALL\n"  # ${#a} counts bytes
        f"gpuctl_p={shlex.quote(program)}\n"
        "while IFS= read -r gpuctl_q; do\n"
        '  gpuctl_a=$(set -- "$gpuctl_q"; eval "$gpuctl_p" </dev/null); gpuctl_rc=$?\n'
        "  printf '\\036gpuctl-answer %s %s\\n%s\\n\\036gpuctl-end\\n' "
        '"$gpuctl_rc" "${#gpuctl_a}" "$gpuctl_a"\n'
        "done\n"
    )


def take_answer(buf: bytearray, max_bytes: int) -> tuple[int, bytes] | None:
    """The first whole answer in `buf` as (exit status, answer), removed from `buf`; None while
    it has not all come. Raises `AnswerFramingError` when `buf` does not hold a framed answer,
    or one over `max_bytes` (the loop must then be dropped: its stream has lost its framing)."""
    head_end = buf.find(b"\n", 0, _MAX_ANSWER_HEAD)
    if head_end < 0:
        if len(buf) >= _MAX_ANSWER_HEAD or not ANSWER_MARK.startswith(
            bytes(buf[: len(ANSWER_MARK)])
        ):
            raise AnswerFramingError("the session printed something that is not an answer")
        return None
    if not buf.startswith(ANSWER_MARK):
        raise AnswerFramingError("the session printed something that is not an answer")
    fields = bytes(buf[len(ANSWER_MARK) : head_end]).split(b" ")
    if len(fields) != 2 or not all(f.isdigit() and len(f) <= 12 for f in fields):
        raise AnswerFramingError("the session's answer header is malformed")
    status, size = int(fields[0]), int(fields[1])
    if size > max_bytes:
        raise AnswerFramingError(f"the answer is {size} bytes, over the limit of {max_bytes}")
    body_end = head_end + 1 + size
    end = body_end + 1 + len(ANSWER_END)
    if len(buf) < end:
        return None
    if buf[body_end:end] != b"\n" + ANSWER_END:
        raise AnswerFramingError("the session's answer does not end where its length says")
    body = bytes(buf[head_end + 1 : body_end])
    del buf[:end]
    return status, body
