"""Slurm's JSON across releases (tests/fixtures/slurm/, README there says which are recorded):
22.05's `sinfo`/`squeue --json`, 24.11's node (data_parser v0.0.42), and constructed v0.0.4x
shapes. A field gpuctl cannot read is a note naming the command, the node or job and the field;
only a document that is not Slurm's JSON at all is an error, naming the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuctl.adapters.slurm import (
    SlurmParseError,
    SlurmReader,
    document,
    parse_jobs,
    parse_nodes,
    version_of,
)
from gpuctl.core.fleet.scheduler import allocations, cordons
from gpuctl.core.model import SlurmSource
from gpuctl.core.scheduler import SchedJob, SchedNode, SchedQueued, SchedulerView

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def nodes_of(
    name: str, command: str = "scontrol show nodes --json"
) -> tuple[list[SchedNode], str | None, list[str]]:
    items, release, notes = document((FIXTURES / name).read_text(), command, "nodes")
    return list(parse_nodes(items, command, notes)), release, notes


def jobs_of(name: str) -> tuple[list[SchedJob], list[str]]:
    items, _, notes = document((FIXTURES / name).read_text(), "squeue --json", "jobs")
    return list(parse_jobs(items, "squeue --json", notes)), notes


def test_debian_22_05_sinfo_gives_the_drain_with_its_reason_user_and_time() -> None:
    nodes, release, notes = nodes_of("sinfo-22.05.8-debian12.json", "sinfo --json")
    assert release == "22.05.8"
    assert notes == []
    by = {n.name: n for n in nodes}
    drained = by["lab-01"]
    assert (drained.state, drained.flags, drained.state_text) == ("IDLE", ("DRAIN",), "IDLE+DRAIN")
    assert (drained.reason, drained.reason_by, drained.reason_at) == (
        "ecc test",
        "root",
        1796183547,
    )
    assert drained.drained and not drained.draining and not drained.down
    assert by["lab-02"].state == "ALLOCATED" and not by["lab-02"].drained
    assert drained.gres == "gpu:h100:4"
    assert drained.partitions == ("gpu",)
    assert drained.features == ("lab", "h100")
    assert (drained.address, drained.hostname) == ("127.0.0.1", "vm")


def test_debian_22_05_squeue_gives_each_jobs_card_indexes() -> None:
    jobs, notes = jobs_of("squeue-22.05.8-debian12.json")
    assert notes == []
    assert [(j.job_id, j.node, j.cards, j.user, j.name) for j in jobs] == [
        ("1", "lab-02", (0,), "gpuctl-slurm", "wrap"),
        ("2", "lab-02", (1, 2), "gpuctl-slurm", "train"),
    ]


def test_a_24_11_node_reads_numbers_as_objects_and_state_as_an_array() -> None:
    nodes, _, notes = nodes_of("scontrol-nodes-24.11-v0.0.42-schedmd.json")
    assert notes == []
    (node,) = nodes
    assert (node.name, node.state, node.flags) == ("host1", "IDLE", ())
    assert node.reason is None and node.reason_by is None
    assert node.reason_at is None  # Slurm's 0: never set
    assert node.gres == "gpu:fake1:1(S:0),gpu:fake2:1(S:0)"
    assert node.partitions == ("debug",)
    assert node.features == ()


def test_newer_node_shapes_read_and_unreadable_fields_become_notes() -> None:
    nodes, release, notes = nodes_of("constructed-scontrol-nodes-v0.0.40-drain.json")
    assert release == "23.11.4"
    by = {n.name: n for n in nodes}
    assert by["gpu05"].state_text == "MIXED+DRAIN"
    assert by["gpu05"].draining  # drained, jobs still running
    assert (by["gpu05"].reason_by, by["gpu05"].reason_at) == ("gpuctl", 1722009900)
    assert by["gpu05"].features == ("h100", "ib")
    assert by["gpu06"].down and by["gpu06"].reason_at is None
    assert by["gpu07"].state == "IDLE" and by["gpu07"].reason_at is None
    assert notes == [
        "`scontrol show nodes --json`: node gpu07: field reason_changed_at: expected a number, "
        "got str",
        "`scontrol show nodes --json`: node #3: no name: left out",
    ]


def test_newer_job_shapes_give_cards_per_node_and_notes_for_garbage() -> None:
    jobs, notes = jobs_of("constructed-squeue-v0.0.41.json")
    assert [(j.job_id, j.node, j.cards) for j in jobs] == [
        ("4242", "gpu05", (0, 1)),
        ("4242", "gpu06", (2, 3)),
        ("4243", "gpu07", (0, 1, 4)),
    ]
    assert notes == [
        "`squeue --json`: job 4245: field gres_detail: unreadable index 'zero' in "
        "'gpu:h100:1(IDX:zero)'"
    ]


def test_output_that_is_not_slurms_json_is_one_line_naming_the_command() -> None:
    with pytest.raises(SlurmParseError) as err:
        document((FIXTURES / "constructed-not-json.txt").read_text(), "squeue --json", "jobs")
    assert err.value.message == "`squeue --json`: not JSON (Expecting value at line 1)"
    with pytest.raises(SlurmParseError, match=r"^`sinfo --json`: no `nodes` list in its JSON$"):
        document('{"sinfo": []}', "sinfo --json", "nodes")


def test_versions_read_from_sinfo_version() -> None:
    assert version_of("slurm 22.05.8\n") == (22, 5, 8)
    assert version_of("slurm-wlm 24.11.0\n") == (24, 11, 0)
    assert version_of("garbage") is None


def test_slurm_jobs_are_whole_card_allocations_owned_by_slurm_and_drains_are_cordons() -> None:
    nodes, _, _ = nodes_of("sinfo-22.05.8-debian12.json", "sinfo --json")
    jobs, _ = jobs_of("squeue-22.05.8-debian12.json")
    view = SchedulerView(nodes=tuple(nodes), jobs=tuple(jobs))
    assert [(a.job, a.node, a.cards, a.whole, a.owner) for a in allocations(view)] == [
        ("slurm:1", "lab-02", (0,), True, "slurm"),
        ("slurm:2", "lab-02", (1, 2), True, "slurm"),
    ]
    (cordon,) = cordons(view).values()
    assert (cordon.node, cordon.reason, cordon.operator, cordon.source) == (
        "lab-01",
        "Slurm IDLE+DRAIN: ecc test",
        "root",
        "slurm",
    )
    assert SchedulerView.from_dict(view.to_dict()) == view


class ScriptedSlurm:
    """Slurm's commands as `SlurmReader` runs them, answered from text (22.05's shapes)."""

    def __init__(self, squeue: str) -> None:
        self.source = SlurmSource(cluster="hpc1")
        self.answers = {
            "sinfo --version": "slurm 22.05.8\n",
            "sinfo --json": (FIXTURES / "sinfo-22.05.8-debian12.json").read_text(),
            "squeue --json": squeue,
        }

    def run(self, argv: list[str], **_: object) -> str:
        return self.answers[" ".join(argv)]


def test_the_view_keeps_jobs_holding_cards_and_gpuctls_and_only_counts_the_rest() -> None:
    recorded = json.loads((FIXTURES / "squeue-22.05.8-debian12.json").read_text())
    held = recorded["jobs"]  # on cards of lab-02: kept, whoever submitted them
    pending = dict(held[0], job_state="PENDING", gres_detail=[], nodes="", state_reason="Priority")
    theirs = [
        dict(pending, job_id=1000 + i, standard_output=f"/home/bob/slurm-{1000 + i}.out")
        for i in range(5000)
    ]
    ours = dict(pending, job_id=42, standard_output="/home/alice/.gpuctl/slurm/train-1/output.log")
    squeue = json.dumps(dict(recorded, jobs=[*held, *theirs, ours]))
    view = SlurmReader(ScriptedSlurm(squeue)).read(now=1.0)  # type: ignore[arg-type]
    assert [(j.job_id, j.cards) for j in view.jobs] == [("1", (0,)), ("2", (1, 2))]
    assert view.queue == (SchedQueued("42", "PENDING", "Priority", 0, None),)
    assert view.queue_others == 5000
    doc = view.to_dict()
    assert len(json.dumps(doc)) < 16_000  # what each published poll carries, whatever queues
    assert SchedulerView.from_dict(json.loads(json.dumps(doc))) == view
