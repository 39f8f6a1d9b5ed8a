"""Cordons mirrored in Slurm (`gpuctl.ops.slurm.SlurmDrains`), over a login node whose Slurm
commands are scripted: a drain gpuctl sets says `gpuctl: <why>`, an operator's own drain is
never overwritten nor resumed, and a node Slurm does not manage is left alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuctl.adapters.protocols import ExecResult
from gpuctl.adapters.slurm import SlurmError
from gpuctl.core.jobs.model import Cordon
from gpuctl.core.model import Inventory, NodeSpec, SlurmSource
from gpuctl.core.scheduler import SchedNode, SchedulerView
from gpuctl.ops.slurm import SlurmDrains, slurm_drains_due, slurm_reason
from gpuctl.testing.fakes import FakeTransport

LOGIN = NodeSpec(name="login01", host="10.0.0.1")
SOURCE = SlurmSource(via="ssh", login=LOGIN, cluster="hpc1")


def node(name: str, state: list[str], reason: str | None = None, by: str | None = None) -> Any:
    return {"name": name, "state": state, "reason": reason or "", "reason_set_by_user": by}


class Cluster:
    """`sinfo --version`, `scontrol show nodes --json` (23.11's v0.0.40 pinned) and `scontrol
    update` on the login."""

    def __init__(self, *nodes: Any) -> None:
        self.nodes = list(nodes)
        self.updates: list[str] = []

    def __call__(self, spec: NodeSpec, command: str) -> ExecResult:
        assert spec.name == "login01"
        if command == "sinfo --version":
            out = "slurm 23.11.4\n"
        elif command == "scontrol show nodes --json=v0.0.40":
            out = json.dumps({"nodes": self.nodes, "meta": {"slurm": {"release": "23.11.4"}}})
        elif command.startswith("scontrol update "):
            self.updates.append(command)
            out = ""
        else:
            raise AssertionError(f"unscripted: {command}")
        return ExecResult(0, out.encode(), b"", 0.01)


def drains(cluster: Cluster) -> tuple[SlurmDrains, FakeTransport]:
    transport = FakeTransport({"login01": cluster})
    inventory = Inventory(
        (
            NodeSpec(name="gpu01", host="10.0.1.1", slurm=SOURCE),
            NodeSpec(name="gpu02", host="10.0.1.2", slurm=SOURCE),
            NodeSpec(name="box", host="10.0.9.9"),
        ),
        slurm=SOURCE,
    )
    return SlurmDrains(inventory, lambda: transport), transport


def test_a_cordon_drains_the_slurm_node_with_gpuctls_reason_quoted() -> None:
    cluster = Cluster(node("gpu01", ["IDLE"]))
    service, transport = drains(cluster)
    assert service.drain("gpu01", "ECC on GPU 1; it's bad") == "gpu01 drained in Slurm"
    assert cluster.updates == [
        "scontrol update nodename=gpu01 state=DRAIN 'reason=gpuctl: ECC on GPU 1; it'\"'\"'s bad'"
    ]
    assert transport.closed


def test_an_operators_drain_is_neither_overwritten_nor_resumed() -> None:
    cluster = Cluster(node("gpu01", ["IDLE", "DRAIN"], "bad fan", "root"))
    service, _ = drains(cluster)
    assert service.drain("gpu01", "maintenance") == (
        "Slurm keeps gpu01's own drain (IDLE+DRAIN by root: bad fan)"
    )
    with pytest.raises(SlurmError) as refused:
        service.resume("gpu01")
    assert refused.value.message == (
        "gpu01 is drained in Slurm by someone else (IDLE+DRAIN by root: bad fan): gpuctl "
        "resumes only its own drains"
    )
    assert "state=RESUME" in (refused.value.hint or "")
    assert cluster.updates == []


def test_uncordon_resumes_only_gpuctls_own_drain() -> None:
    cluster = Cluster(
        node("gpu01", ["IDLE", "DRAIN"], "gpuctl: disk check", "root"), node("gpu02", ["IDLE"])
    )
    service, _ = drains(cluster)
    assert service.resume("gpu01") == "gpu01 resumed in Slurm"
    assert service.resume("gpu02") is None  # not drained: nothing to resume
    assert cluster.updates == ["scontrol update nodename=gpu01 state=RESUME"]


def test_a_node_slurm_does_not_manage_never_reaches_slurm() -> None:
    cluster = Cluster()
    service, transport = drains(cluster)
    assert service.drain("box", "x") is None
    assert service.resume("box") is None
    assert transport.calls == []


def test_the_reason_is_one_printable_line_and_says_gpuctl() -> None:
    assert slurm_reason("ECC\non GPU 1\x1b[31m") == "gpuctl: ECC on GPU 1 [31m"
    assert len(slurm_reason("x" * 500)) == 200


def test_the_loop_drains_in_slurm_only_its_health_cordons_slurm_does_not_drain() -> None:
    inventory = Inventory(
        (
            NodeSpec(name="gpu01", host="a", slurm=SOURCE),
            NodeSpec(name="gpu02", host="b", slurm=SOURCE),
            NodeSpec(name="gpu03", host="c", slurm=SOURCE),
            NodeSpec(name="box", host="d"),
        )
    )
    view = SchedulerView(
        nodes=(
            SchedNode("gpu01", "IDLE"),
            SchedNode("gpu02", "IDLE", ("DRAIN",), reason="bad fan"),
            SchedNode("gpu03", "IDLE"),
        )
    )
    cordons = [
        Cordon("gpu01", "ECC", "gpuctl", "health", 1.0),
        Cordon("gpu02", "ECC", "gpuctl", "health", 1.0),  # Slurm drains it already
        Cordon("gpu03", "disk", "alice", "operator", 1.0),  # the operator's path drains it
        Cordon("box", "ECC", "gpuctl", "health", 1.0),  # not Slurm's
    ]
    assert [c.node for c in slurm_drains_due(cordons, view, inventory)] == ["gpu01"]
    assert slurm_drains_due(cordons, SchedulerView(error="down"), inventory) == []
