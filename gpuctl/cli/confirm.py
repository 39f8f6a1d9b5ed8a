"""The one question every confirming verb asks (cordon, uncordon, drain, cancel, consolidate
--apply, hosts trust, playbook run), after showing what it is about to do.

The question goes to stderr, the answer comes from stdin: y/yes goes on, anything else is no
(exit 1, nothing changed). No answer at all (stdin at its end: no terminal, `</dev/null`, cron)
is a usage error, exit 2, with the hint to pass --yes: a script that forgot --yes learns it
the same way from every verb. `--yes` skips the question.
"""

from __future__ import annotations

import sys

import typer

from gpuctl.cli.render import safe
from gpuctl.errors import ExitCode, UsageError

NO_ANSWER_HINT = "pass --yes to apply without a terminal"


def answer(question: str) -> bool:
    """Ask `question`; True on y/yes, False on any other answer. Raises UsageError (exit 2,
    nothing changed) when stdin ends without an answer."""
    sys.stderr.write(f"{safe(question)} [y/N]: ")
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line.endswith("\n"):
        sys.stderr.write("\n")
    if not line:
        raise UsageError("no answer (no terminal): nothing changed", hint=NO_ANSWER_HINT)
    return line.strip().lower() in ("y", "yes")


def ask(question: str) -> None:
    """Ask `question`; return on y/yes, else say 'nothing changed' and exit 1."""
    if not answer(question):
        sys.stderr.write("nothing changed\n")
        raise typer.Exit(int(ExitCode.ERROR))
