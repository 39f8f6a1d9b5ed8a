"""The data_parser gpuctl pins in Slurm's `--json` (`adapters.slurm._pin`), as `SlurmReader`
runs the commands on a scripted login node: none on 22.05 and 23.02, the newest one gpuctl
reads that the release ships from 23.11, none (and one note) on a release newer than gpuctl
knows, and a pin the command refuses dropped after one retry with plain `--json` (noted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import ExecResult
from gpuctl.adapters.slurm import SlurmCommands, SlurmReader
from gpuctl.core.model import NodeSpec, SlurmSource
from gpuctl.testing.fakes import FakeTransport

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
LOGIN = NodeSpec(name="login01", host="10.0.0.1")
SOURCE = SlurmSource(via="ssh", login=LOGIN, cluster="hpc1")
REFUSAL = (
    "squeue: error: data_parser_g_new: plugin v0.0.42 not found\n"
    "squeue: error: application/json output not supported by data_parser/v0.0.44\n"
)


class Login:
    """Slurm `release`'s commands on the login node; `refuse`: command lines that exit 1 with
    `stderr`. Answers 22.05's recorded shapes, or from 23.02 SchedMD's recorded 24.11 node (as
    gpu07) and the constructed v0.0.41 job running there."""

    def __init__(self, release: str, refuse: tuple[str, ...] = (), stderr: str = "") -> None:
        self.release, self.refuse, self.stderr = release, refuse, stderr
        if release.startswith("22."):
            self.nodes = (FIXTURES / "sinfo-22.05.8-debian12.json").read_text()
            self.jobs = (FIXTURES / "squeue-22.05.8-debian12.json").read_text()
            return
        nodes = json.loads((FIXTURES / "scontrol-nodes-24.11-v0.0.42-schedmd.json").read_text())
        nodes["nodes"][0]["name"] = "gpu07"
        jobs = json.loads((FIXTURES / "constructed-squeue-v0.0.41.json").read_text())
        jobs["jobs"] = [j for j in jobs["jobs"] if j["job_id"] == 4243]
        self.nodes, self.jobs = json.dumps(nodes), json.dumps(jobs)

    def __call__(self, spec: NodeSpec, command: str) -> ExecResult:
        if command in self.refuse:
            return ExecResult(1, b"", self.stderr.encode(), 0.01)
        if command == "sinfo --version":
            return ExecResult(0, f"slurm {self.release}\n".encode(), b"", 0.01)
        if command.startswith(("sinfo --json", "scontrol show nodes --json")):
            return ExecResult(0, self.nodes.encode(), b"", 0.01)
        if command.startswith("squeue --json"):
            return ExecResult(0, self.jobs.encode(), b"", 0.01)
        raise AssertionError(f"unscripted: {command}")


def reader(login: Login) -> tuple[SlurmReader, FakeTransport]:
    transport = FakeTransport({"login01": login})
    return SlurmReader(SlurmCommands(SOURCE, transport)), transport


def commands(transport: FakeTransport) -> list[str]:
    return [command for _, command in transport.calls]


def test_debian_22_05_is_read_with_plain_json() -> None:
    slurm, transport = reader(Login("22.05.8"))
    view = slurm.read(now=1.0)
    assert view.error is None and view.notes == ()
    assert commands(transport) == ["sinfo --version", "sinfo --json", "squeue --json"]


@pytest.mark.parametrize(
    ("release", "nodes", "jobs"),
    [
        ("23.02.7", "scontrol show nodes --json", "squeue --json"),
        ("23.11.4", "scontrol show nodes --json=v0.0.40", "squeue --json=v0.0.40"),
        ("24.05.2", "scontrol show nodes --json=v0.0.41", "squeue --json=v0.0.41"),
        ("24.11.3", "scontrol show nodes --json=v0.0.42", "squeue --json=v0.0.42"),
        ("25.05.1", "scontrol show nodes --json=v0.0.42", "squeue --json=v0.0.42"),
        ("25.11.2", "scontrol show nodes --json=v0.0.42", "squeue --json=v0.0.42"),
        ("26.05.0", "scontrol show nodes --json=v0.0.42", "squeue --json=v0.0.42"),
    ],
)
def test_each_release_is_pinned_to_the_newest_parser_gpuctl_reads(
    release: str, nodes: str, jobs: str
) -> None:
    slurm, transport = reader(Login(release))
    view = slurm.read(now=1.0)
    assert view.error is None and view.notes == ()
    assert [(j.job_id, j.node) for j in view.jobs] == [("4243", "gpu07")]
    assert commands(transport) == ["sinfo --version", nodes, jobs]


def test_24_11_reads_its_release_once_per_reader() -> None:
    slurm, transport = reader(Login("24.11.3"))
    slurm.read(now=1.0)
    slurm.read(now=2.0)
    assert [n.name for n in slurm.nodes()] == ["gpu07"]
    assert commands(transport) == [
        "sinfo --version",
        "scontrol show nodes --json=v0.0.42",
        "squeue --json=v0.0.42",
        "scontrol show nodes --json=v0.0.42",
        "squeue --json=v0.0.42",
        "scontrol show nodes --json=v0.0.42",
    ]


def test_a_release_newer_than_gpuctl_knows_is_read_unpinned_with_one_note() -> None:
    slurm, transport = reader(Login("27.05.1"))
    first, second = slurm.read(now=1.0), slurm.read(now=2.0)
    note = "Slurm 27.05 is newer than gpuctl knows: reading its default JSON"
    assert first.notes == second.notes == (note,)
    assert first.error is None and [j.job_id for j in first.jobs] == ["4243"]
    assert commands(transport) == [
        "sinfo --version",
        "scontrol show nodes --json",
        "squeue --json",
        "scontrol show nodes --json",
        "squeue --json",
    ]


def test_a_refused_pin_is_retried_once_plain_and_dropped_for_the_reader() -> None:
    login = Login("24.11.3", refuse=("squeue --json=v0.0.42",), stderr=REFUSAL)
    slurm, transport = reader(login)
    first, second = slurm.read(now=1.0), slurm.read(now=2.0)
    note = (
        "`squeue --json=v0.0.42` refused data_parser v0.0.42 (Slurm says: squeue: error: "
        "data_parser_g_new: plugin v0.0.42 not found): reading Slurm's default JSON"
    )
    assert first.error is None and [j.job_id for j in first.jobs] == ["4243"]
    assert first.notes == second.notes == (note,)
    assert commands(transport) == [
        "sinfo --version",
        "scontrol show nodes --json=v0.0.42",
        "squeue --json=v0.0.42",
        "squeue --json",
        "scontrol show nodes --json",
        "squeue --json",
    ]


def test_a_failure_that_does_not_name_the_parser_is_the_error_not_retried() -> None:
    login = Login(
        "24.11.3",
        refuse=("scontrol show nodes --json=v0.0.42",),
        stderr="slurm_load_node error: Unable to contact slurm controller (connect failure)\n",
    )
    slurm, transport = reader(login)
    view = slurm.read_or_error(now=1.0)
    assert view.error == (
        "`scontrol show nodes --json=v0.0.42` on login01 failed (exit 1): slurm_load_node "
        "error: Unable to contact slurm controller (connect failure)"
    )
    assert commands(transport) == ["sinfo --version", "scontrol show nodes --json=v0.0.42"]
