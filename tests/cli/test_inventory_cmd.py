"""`gpuctl inventory check` and `gpuctl inventory list` as an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpuctl.cli.main import app

FIXTURES = Path(__file__).parents[1] / "fixtures" / "inventory"
EXAMPLE = Path(__file__).parents[2] / "inventory" / "example.yaml"
BAD_PORT = "bad/port-too-big.yaml"
BAD_PORT_ERROR = (
    "error: bad/port-too-big.yaml:3: nodes[0].port: must be an integer between 1 and 65535 "
    "(got 70000)\n"
)


@pytest.fixture(autouse=True)
def _in_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)
    monkeypatch.delenv("GPUCTL_INVENTORY", raising=False)
    monkeypatch.setenv("HOME", "/home/op")


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_check_of_a_valid_inventory_prints_a_summary_and_exits_0() -> None:
    code, out, err = _run("-i", "good/full.yaml", "inventory", "check")
    assert (code, err) == (0, "")
    assert out == "ok: 5 nodes in 1 file, 2 groups (h100: 4, rack-r2: 1)\n"


def test_check_accepts_the_shipped_example() -> None:
    code, out, err = _run("-i", str(EXAMPLE), "inventory", "check")
    assert (code, err) == (0, "")
    assert out == "ok: 19 nodes in 1 file, 2 groups (h100-train: 18, rack-r2: 2)\n"


def test_check_reads_a_folder() -> None:
    code, out, _ = _run("inventory", "check", "-i", "split")
    assert (code, out) == (0, "ok: 3 nodes in 3 files, 1 group (a100: 3)\n")


def test_check_of_a_bad_inventory_prints_one_error_line_and_exits_2() -> None:
    code, out, err = _run("-i", BAD_PORT, "inventory", "check")
    assert (code, out, err) == (2, "", BAD_PORT_ERROR)


def test_unknown_key_error_carries_the_closest_key_as_a_hint() -> None:
    code, out, err = _run("inventory", "check", "-i", "bad/unknown-key-node.yaml")
    assert (code, out) == (2, "")
    assert err == (
        "error: bad/unknown-key-node.yaml:3: nodes[0].hots: unknown key 'hots'\n"
        "hint: did you mean 'host'?\n"
    )


def test_the_subcommand_option_and_the_environment_select_the_inventory() -> None:
    assert _run("inventory", "check", "-i", BAD_PORT) == (2, "", BAD_PORT_ERROR)
    assert _run("inventory", "check", "--inventory", BAD_PORT)[0] == 2
    assert _run("inventory", "check", env={"GPUCTL_INVENTORY": BAD_PORT}) == (
        2,
        "",
        BAD_PORT_ERROR,
    )
    # the subcommand's -i wins over the root's, which wins over the environment
    env = {"GPUCTL_INVENTORY": BAD_PORT}
    assert _run("-i", BAD_PORT, "inventory", "check", "-i", "good/minimal.yaml", env=env)[0] == 0
    assert _run("-i", "good/minimal.yaml", "inventory", "check", env=env)[0] == 0


def test_no_inventory_at_all_says_how_to_name_one() -> None:
    code, out, err = _run("inventory", "check")
    assert (code, out) == (2, "")
    assert err == (
        "error: no inventory given\nhint: pass -i/--inventory FILE|DIR or set GPUCTL_INVENTORY\n"
    )


@pytest.mark.parametrize("case", sorted(p.name for p in (FIXTURES / "bad").glob("*.yaml")))
def test_every_bad_fixture_fails_with_exit_2_and_no_traceback(case: str) -> None:
    code, out, err = _run("inventory", "check", "-i", f"bad/{case}")
    assert (code, out) == (2, "")
    assert err.startswith(f"error: bad/{case}")
    assert "Traceback" not in err
    assert len(err.splitlines()) <= 2  # the error, and a hint where there is one


def test_list_prints_a_table_of_resolved_nodes() -> None:
    code, out, err = _run("inventory", "list", "-i", "split")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "NAME  ADDRESS                 USER    GROUPS  GPUS  MODEL                  LABELS",
        "a1    a1:22                   site-a  a100    8     NVIDIA A100-SXM4-80GB  gpu=a100",
        "a2    a2:22                   site-a  a100    8     NVIDIA A100-SXM4-80GB  gpu=a100",
        "b1    b1.example.internal:22  -       a100    8     NVIDIA A100-SXM4-80GB  gpu=a100",
    ]


def test_list_wide_adds_key_file_timeouts_and_source() -> None:
    code, out, _ = _run("inventory", "list", "-i", "good/minimal.yaml", "-o", "wide")
    assert code == 0
    assert out.splitlines() == [
        "NAME  ADDRESS  USER  GROUPS  GPUS  MODEL  LABELS  KEY FILE  TIMEOUTS  SOURCE",
        "solo  solo:22  -     -       -     -      -       -         5s/10s    good/minimal.yaml:3",
    ]


def test_list_json_is_one_document_of_every_resolved_field() -> None:
    code, out, err = _run("inventory", "list", "-i", "good/minimal.yaml", "-o", "json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "sources": ["good/minimal.yaml"],
        "nodes": [
            {
                "name": "solo",
                "host": "solo",
                "port": 22,
                "user": None,
                "allow_root": False,
                "key_file": None,
                "known_hosts": [],
                "labels": {},
                "groups": [],
                "expected_gpus": None,
                "expected_model": None,
                "transport": "ssh",
                "connect_timeout_s": 5.0,
                "command_timeout_s": 10.0,
                "source": "good/minimal.yaml:3",
                "jump": None,
                "ssh_config": None,
                "port_set": False,
                "slurm": None,
            }
        ],
    }


def test_list_yaml_matches_the_json() -> None:
    _, as_json, _ = _run("inventory", "list", "-i", "good/full.yaml", "-o", "json")
    code, as_yaml, _ = _run("inventory", "list", "-i", "good/full.yaml", "-o", "yaml")
    assert code == 0
    assert yaml.safe_load(as_yaml) == json.loads(as_json)
    assert [n["name"] for n in json.loads(as_json)["nodes"]] == [
        "gpu08",
        "gpu09",
        "gpu10",
        "gpu11",
        "local",
    ]


def test_list_of_a_bad_inventory_exits_2_with_nothing_on_stdout() -> None:
    assert _run("inventory", "list", "-i", BAD_PORT, "-o", "json") == (2, "", BAD_PORT_ERROR)
