"""Loading the openb CSVs: good files, and bad ones named down to the file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.bench.openb import load_nodes, load_pods
from gpuctl.errors import ConfigError, ExitCode

FIXTURES = Path(__file__).parents[2] / "fixtures" / "openb"


def test_the_fixture_trace_loads() -> None:
    nodes = load_nodes(FIXTURES / "nodes.csv")
    pods = load_pods(FIXTURES / "pods.csv")
    assert [n.name for n in nodes] == ["node-a", "node-b", "node-c", "node-d"]
    assert sum(n.gpus for n in nodes) == 15
    assert len(pods) == 12
    assert pods[4].gpu_spec == "T4" and pods[5].num_gpu == 0 and pods[5].gpu_milli == 0


def test_a_non_integer_cell_names_file_line_and_column() -> None:
    with pytest.raises(ConfigError) as err:
        load_pods(FIXTURES / "bad_pods.csv")
    assert err.value.exit_code == ExitCode.USAGE
    assert err.value.message == (
        f"{FIXTURES / 'bad_pods.csv'}:3: cpu_milli: expected a non-negative integer, got 'two'"
    )


def test_a_missing_column_is_named() -> None:
    with pytest.raises(ConfigError, match=r"bad_nodes_header.csv:1: missing column\(s\) sn, model"):
        load_nodes(FIXTURES / "bad_nodes_header.csv")


def test_a_missing_file_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.csv: cannot read"):
        load_nodes(tmp_path / "nope.csv")


def test_an_empty_or_binary_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty file"):
        load_pods(empty)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(ConfigError, match=r"binary\.csv"):
        load_pods(binary)


def test_a_multi_gpu_pod_must_ask_for_whole_gpus(tmp_path: Path) -> None:
    bad = tmp_path / "pods.csv"
    bad.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,2,500\n")
    with pytest.raises(ConfigError, match=r"pods.csv:2: gpu_milli: a multi-GPU pod"):
        load_pods(bad)
