"""`gpuctl inventory import ansible`: INI and YAML Ansible inventories become a valid gpuctl
inventory (groups, connection vars, labels, ranges), skipped vars are listed, bad input is one
line naming the file and line."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner, Result

from gpuctl.cli.main import app
from gpuctl.config.inventory import load_inventory

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ansible"


def gpuctl(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def test_an_ini_inventory_becomes_a_gpuctl_inventory(tmp_path: Path) -> None:
    out = tmp_path / "fleet.yaml"
    result = gpuctl(
        "inventory", "import", "ansible", str(FIXTURES / "hosts.ini"), "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "skipped: train.vars: gpu_count (not a string: int)" in result.stderr
    inv = load_inventory(out).by_name()
    assert sorted(inv) == ["gpu01", "gpu02", "gpu03", "gpu04", "l40s-a"]
    gpu04, l40s = inv["gpu04"], inv["l40s-a"]
    assert (gpu04.host, gpu04.port, gpu04.user) == ("10.0.1.4", 2222, "gpuops")
    assert gpu04.groups == ("train", "gpus")
    assert dict(gpu04.labels) == {"datacenter": "par1", "pool": "train", "rack": "r2"}
    assert l40s.key_file is not None and l40s.key_file.endswith(".ssh/id_infer")
    assert dict(l40s.labels) == {"datacenter": "par1", "pool": "infer"}


def test_a_yaml_inventory_goes_to_stdout_and_its_skipped_vars_to_stderr() -> None:
    result = gpuctl("inventory", "import", "ansible", str(FIXTURES / "hosts.yaml"))
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load(result.stdout)
    assert [n["name"] for n in doc["nodes"]] == ["gpu01", "gpu02", "gpu03", "l40s-a"]
    assert doc["groups"]["train"] == {"labels": {"pool": "train"}}
    assert doc["nodes"][3] == {
        "name": "l40s-a",
        "host": "10.0.2.10",
        "port": 2222,
        "groups": ["infer", "gpus"],
        "labels": {"datacenter": "par1"},
    }
    assert result.stderr.splitlines()[:2] == [
        "skipped: infer.vars: ansible_python_interpreter (an Ansible setting gpuctl has no use "
        "for)",
        "skipped: gpu03: maintenance (not a string: bool)",
    ]


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "fleet.yaml"
    args = ("inventory", "import", "ansible", str(FIXTURES / "hosts.ini"), "--out", str(out))
    result = gpuctl(*args, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "dry run: 5 node(s), 3 group(s)" in result.stderr
    assert result.stdout == "" and not out.exists()


def test_bad_input_is_one_line_naming_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.ini"
    bad.write_text("[train]\ngpu01\n[train:bogus]\nx=1\n")
    result = gpuctl("inventory", "import", "ansible", str(bad))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {bad}:3: unknown section kind 'bogus' (hosts, vars or children)\n"
    )
    ranged = tmp_path / "r.ini"
    ranged.write_text("[train]\ngpu[09:01]\n")
    result = gpuctl("inventory", "import", "ansible", str(ranged))
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"error: {ranged}:2: host 'gpu[09:01]': bad range [09-01]: 09 is after 01\n"
    )
