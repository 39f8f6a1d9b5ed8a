"""One function per kind of outcome maps it to the exit code the README documents."""

import re
from pathlib import Path

import pytest

from gpuctl.errors import (
    ExitCode,
    exit_for_apply,
    exit_for_db_check,
    exit_for_plan,
    exit_for_playbook,
    exit_for_poll,
)

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize(
    ("outcomes", "code"),
    [
        ((), ExitCode.OK),
        (("ok", "ok"), ExitCode.OK),
        (("ok", "timeout"), ExitCode.PARTIAL),  # some node did not answer
        (("refused", "auth_failed", "unreachable"), ExitCode.UNREACHABLE),  # none did
        (("ok", "timeout", "host_key"), ExitCode.HOST_KEY),  # an operator must decide first
        (("host_key",), ExitCode.HOST_KEY),
        (("ok", "failed"), ExitCode.ERROR),  # it answered, the action failed or was declined
        (("failed", "timeout"), ExitCode.PARTIAL),
        (("failed",), ExitCode.ERROR),  # a node that answered is not unreachable
    ],
)
def test_a_poll_exits_by_which_nodes_answered(outcomes: tuple[str, ...], code: ExitCode) -> None:
    assert exit_for_poll(iter(outcomes)) is code


def test_a_plan_or_an_apply_that_left_work_out_is_partial() -> None:
    assert exit_for_plan(complete=True) is ExitCode.OK
    assert int(exit_for_plan(complete=False)) == 3
    assert exit_for_apply(complete=True) is ExitCode.OK
    assert exit_for_apply(complete=False) is ExitCode.PARTIAL


def test_db_check_puts_a_store_it_cannot_trust_before_the_fleet() -> None:
    assert exit_for_db_check(store_ok=True, fleet_problems=0, unread_nodes=0) is ExitCode.OK
    assert exit_for_db_check(store_ok=False, fleet_problems=0, unread_nodes=0) is ExitCode.STATE
    assert exit_for_db_check(store_ok=True, fleet_problems=2, unread_nodes=1) is ExitCode.ERROR
    assert exit_for_db_check(store_ok=True, fleet_problems=0, unread_nodes=1) is ExitCode.PARTIAL


@pytest.mark.parametrize(
    ("outcome", "code"),
    [("ok", 0), ("outside_window", 0), ("failed", 1), ("stopped", 1), ("declined", 1)],
)
def test_a_playbook_run_exits_0_done_and_1_otherwise(outcome: str, code: int) -> None:
    assert exit_for_playbook(outcome) == code


def test_the_readme_documents_every_exit_code() -> None:
    text = README.read_text(encoding="utf-8")
    table = text[text.index("### Exit codes") :].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}
    assert documented == {int(c) for c in ExitCode}
