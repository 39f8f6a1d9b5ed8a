"""`gpuctl status` and `gpuctl nodes`: output formats, exit codes, no tracebacks."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.core.timefmt import parse_rfc3339
from gpuctl.errors import ConnectRefused, HostKeyChanged, HostKeyUnknown, TransportTimeout
from gpuctl.testing.fakes import FakeTransport, ShellTransport, fake_node_env
from tests.unit.adapters.test_ssh_keys import write_key


@pytest.fixture
def node_env(tmp_path: Path) -> dict[str, str]:
    return fake_node_env(tmp_path, "gpu01")


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "nodes:\n"
        "  - {name: gpu01, host: 127.0.0.1, port: 2201, gpus: 2, labels: {pool: a}}\n"
        "  - {name: gpu02, host: 127.0.0.1, port: 2202}\n"
        "  - {name: gpu03, host: 127.0.0.1, port: 2203}\n"
    )
    return path


def _invoke(inventory: Path, transport: object, *args: str) -> object:
    ctx = AppContext(transport_factory=lambda: transport)  # type: ignore[arg-type,return-value]
    state = inventory.parent / "state"  # never the machine's own state dir
    return CliRunner().invoke(
        app, ["-i", str(inventory), "--state-dir", str(state), *args], obj=ctx
    )


def _transport(node_env: dict[str, str], **down: Exception) -> FakeTransport:
    shell = ShellTransport({"gpu01": node_env, "gpu02": node_env, "gpu03": node_env})
    answer = lambda n, c: shell.run(n, c, timeout_s=10)  # noqa: E731
    return FakeTransport({name: down.get(name, answer) for name in ("gpu01", "gpu02", "gpu03")})


def test_status_json_is_one_document_with_numbers_and_nulls(
    inventory: Path, node_env: dict[str, str]
) -> None:
    result = _invoke(inventory, _transport(node_env), "status", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [n["name"] for n in doc["nodes"]] == ["gpu01", "gpu02", "gpu03"]
    node = doc["nodes"][0]
    assert node["state"] == "ready"
    assert node["error"] is None
    assert node["labels"] == {"pool": "a"}
    assert node["expected_gpus"] == 2
    gpu = node["gpus"][0]
    assert gpu["index"] == 0
    assert gpu["uuid"].startswith("GPU-")
    assert gpu["model"] == "NVIDIA H100 80GB HBM3"
    assert gpu["mem_total_mib"] == 81559
    assert isinstance(gpu["mem_used_mib"], int)
    assert isinstance(gpu["util_pct"], int)
    assert isinstance(gpu["temp_c"], int)
    assert gpu["retired_pages_sbe"] is None  # H100 reports row remapping, not page retirement
    assert doc["summary"] == {
        "nodes": 3,
        "nodes_answered": 3,
        "gpus": 6,
        "mem_total_mib": 6 * 81559,
        "mem_used_mib": 0,
    }


def test_status_exits_3_and_still_prints_the_rest_when_some_nodes_do_not_answer(
    inventory: Path, node_env: dict[str, str]
) -> None:
    transport = _transport(
        node_env,
        gpu02=ConnectRefused("gpu02 (127.0.0.1:2202): connection refused"),
        gpu03=TransportTimeout("gpu03 (127.0.0.1:2203): timeout (connect) after 5s"),
    )
    result = _invoke(inventory, transport, "status", "-o", "json")
    assert result.exit_code == 3
    doc = json.loads(result.stdout)
    states = {n["name"]: (n["state"], n["reach"], n["error"]) for n in doc["nodes"]}
    assert states["gpu01"] == ("ready", "ok", None)
    assert states["gpu02"] == ("down", "refused", "gpu02 (127.0.0.1:2202): connection refused")
    assert states["gpu03"][:2] == ("down", "timeout")


def test_status_exits_4_when_no_node_answers(inventory: Path) -> None:
    transport = FakeTransport(
        {n: ConnectRefused(f"{n}: refused") for n in ("gpu01", "gpu02", "gpu03")}
    )
    result = _invoke(inventory, transport, "status")
    assert result.exit_code == 4
    assert "gpu02: refused" in result.stdout
    assert "Traceback" not in result.output


def test_a_changed_host_key_exits_5_before_the_partial_3(
    inventory: Path, node_env: dict[str, str]
) -> None:
    transport = _transport(
        node_env,
        gpu02=HostKeyChanged("gpu02 (127.0.0.1:2202): HOST KEY CHANGED"),
        gpu03=ConnectRefused("gpu03 (127.0.0.1:2203): connection refused"),
    )
    result = _invoke(inventory, transport, "status", "-o", "json")
    assert result.exit_code == 5, result.output
    nodes = {n["name"]: n["reach"] for n in json.loads(result.stdout)["nodes"]}
    assert nodes == {"gpu01": "ok", "gpu02": "host_key", "gpu03": "refused"}


def test_unknown_host_keys_everywhere_exit_5_not_4(inventory: Path) -> None:
    transport = FakeTransport(
        {n: HostKeyUnknown(f"{n}: host key unknown") for n in ("gpu01", "gpu02", "gpu03")}
    )
    assert _invoke(inventory, transport, "status").exit_code == 5
    assert _invoke(inventory, transport, "nodes", "list").exit_code == 5


def test_nodes_show_of_a_node_with_a_changed_host_key_exits_5(
    inventory: Path, node_env: dict[str, str]
) -> None:
    transport = _transport(node_env, gpu02=HostKeyChanged("gpu02: HOST KEY CHANGED"))
    result = _invoke(inventory, transport, "nodes", "show", "gpu02")
    assert result.exit_code == 5, result.output
    assert "HOST KEY CHANGED" in result.stdout


def test_a_key_file_with_a_passphrase_is_an_auth_failure_of_its_node(tmp_path: Path) -> None:
    key = write_key(tmp_path / "id_key", "openssh", b"correct horse")
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        f"nodes:\n  - {{name: gpu01, host: 127.0.0.1, port: 1, user: ops, key_file: {key}}}\n"
    )
    state = tmp_path / "state"
    result = CliRunner().invoke(app, ["-i", str(inventory), "--state-dir", str(state), "status"])
    assert result.exit_code == 4, result.output  # the only node: nothing answered
    assert "Traceback" not in result.output and "TypeError" not in result.output
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("gpu01")]
    assert row.split()[1:3] == ["down", "(auth_failed)"]
    assert f"key_file {key} needs a passphrase" in result.stdout


def test_status_table_shows_nodes_gpus_and_memory(
    inventory: Path, node_env: dict[str, str]
) -> None:
    transport = _transport(node_env, gpu03=ConnectRefused("gpu03: refused"))
    result = _invoke(inventory, transport, "status")
    assert result.exit_code == 3
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "NODE",
        "STATE",
        "GPUS",
        "MODEL",
        "MEM",
        "GiB",
        "UTIL",
        "TEMP",
        "NOTES",
    ]
    assert lines[1].split()[:3] == ["gpu01", "ready", "2/2"]
    assert "0.0/159.3" in lines[1]
    assert lines[3].split()[:3] == ["gpu03", "down", "(refused)"]
    assert all(line == line.rstrip() for line in lines)


def test_status_yaml_parses_to_the_same_document_as_json(
    inventory: Path, node_env: dict[str, str]
) -> None:
    as_yaml = yaml.safe_load(
        _invoke(inventory, _transport(node_env), "status", "-o", "yaml").stdout
    )
    as_json = json.loads(_invoke(inventory, _transport(node_env), "status", "-o", "json").stdout)
    assert [n["name"] for n in as_yaml["nodes"]] == [n["name"] for n in as_json["nodes"]]
    assert as_yaml["summary"] == as_json["summary"]


def test_status_without_an_inventory_says_how_to_name_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["status"], env={"GPUCTL_INVENTORY": ""})
    assert result.exit_code == 2
    assert "error: no inventory given" in result.stderr
    assert "GPUCTL_INVENTORY" in result.stderr


def test_nodes_show_prints_one_node_and_its_gpus(inventory: Path, node_env: dict[str, str]) -> None:
    result = _invoke(inventory, _transport(node_env), "nodes", "show", "gpu01")
    assert result.exit_code == 0, result.output
    assert "driver" in result.stdout and "590.48.01" in result.stdout
    assert result.stdout.count("NVIDIA H100 80GB HBM3") == 2


def test_nodes_show_an_unknown_node_is_a_usage_error(
    inventory: Path, node_env: dict[str, str]
) -> None:
    result = _invoke(inventory, _transport(node_env), "nodes", "show", "gpu99")
    assert result.exit_code == 2
    assert "error: unknown node 'gpu99'" in result.stderr


def test_nodes_list_polls_only_the_named_nodes(inventory: Path, node_env: dict[str, str]) -> None:
    transport = _transport(node_env)
    result = _invoke(inventory, transport, "nodes", "list", "gpu02", "-o", "json")
    assert result.exit_code == 0
    assert [n["name"] for n in json.loads(result.stdout)["nodes"]] == ["gpu02"]
    assert [name for name, _ in transport.calls] == ["gpu02"]


def test_status_json_carries_the_fleet_numbers(inventory: Path, node_env: dict[str, str]) -> None:
    result = _invoke(inventory, _transport(node_env), "status", "-o", "json")
    assert result.exit_code == 0, result.output
    numbers = json.loads(result.stdout)["numbers"]
    assert numbers["utilization_pct"] == 0.0  # nothing allocated yet
    assert numbers["band"] == "idle"
    assert numbers["capacity_mib"] == 6 * 81559
    assert numbers["observed_util_pct"] == 0.0
    assert numbers["queue_waiting"] == 0
    assert numbers["failover_success_pct"] is None
    assert parse_rfc3339(numbers["now"]) > 0  # the numbers' instant, as every JSON time
    assert not (inventory.parent / "state").exists()  # a read-only look creates nothing


def test_status_table_ends_with_the_numbers(inventory: Path, node_env: dict[str, str]) -> None:
    result = _invoke(inventory, _transport(node_env), "status")
    lines = result.stdout.splitlines()
    # the share of GPU memory allocated, and its band in words (not "0% idle")
    assert lines[-2].startswith(
        "fleet: utilization 0% allocated (idle silicon, < 50%) · fragmentation"
    )
    assert lines[-1].startswith("jobs: queue wait p50 N/A")
    assert "· failover N/A (0 of 0), 0 drain moves ·" in lines[-1]
