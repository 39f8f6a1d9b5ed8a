"""Global options where people type them: before or after the command; shell completion; help
that names no `<bool>` on flags."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from gpuctl.cli.main import EXAMPLES, app


def test_inventory_after_the_command_is_the_same_as_before_it(tmp_path: Path) -> None:
    missing = tmp_path / "fleet.yaml"
    before = CliRunner().invoke(app, ["-i", str(missing), "status"])
    after = CliRunner().invoke(app, ["status", "-i", str(missing)])
    assert after.exit_code == before.exit_code == 2
    assert after.stderr == before.stderr == f"error: {missing}: inventory not found\n"


def test_state_dir_after_a_sub_command_and_the_later_one_wins(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["--state-dir", str(tmp_path / "a"), "db", "path", "--state-dir", str(tmp_path / "b")]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{tmp_path / 'b' / 'state.db'}\n"


def test_debug_after_the_command_shows_the_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["nodes", "list", "-i", str(tmp_path / "x"), "--debug"])
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.endswith(f"error: {tmp_path / 'x'}: inventory not found\n")


def test_a_command_s_own_inventory_option_still_wins(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["-i", str(tmp_path / "a"), "inventory", "check", "-i", "b"])
    assert result.exit_code == 2
    assert result.stderr == "error: b: inventory not found\n"


def test_help_offers_shell_completion() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout


def test_help_names_no_bool_type_on_flags() -> None:
    for argv in (["--help"], ["cordon", "--help"], ["drain", "-h"], ["nodes", "list", "-h"]):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        assert "--help" in result.stdout and "<bool>" not in result.stdout


def _leaves(command: Any, path: str = "") -> dict[str, Any]:
    sub = getattr(command, "commands", None)
    if not sub:
        return {path: command}
    found: dict[str, Any] = {}
    for name, child in sub.items():
        found.update(_leaves(child, f"{path} {name}".strip()))
    return found


def test_every_command_s_help_ends_with_an_example_that_parses() -> None:
    leaves = _leaves(typer.main.get_command(app))
    assert set(leaves) == set(EXAMPLES)
    for path, command in leaves.items():
        shown = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "200"})
        assert f"Example: gpuctl {EXAMPLES[path]}" in shown.stdout, path
        args = shlex.split(EXAMPLES[path])[len(path.split()) :]
        command.make_context(path, args)  # raises on an unknown option or a missing argument
