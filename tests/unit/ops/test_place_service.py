"""From a fleet snapshot to the state placement reads: capacity, ghost memory, schedulability."""

from pathlib import Path

import pytest

from gpuctl.core.fleet.view import fleet_state_from_snapshot
from gpuctl.core.model import (
    FleetSnapshot,
    GpuSnapshot,
    NodeFacts,
    NodeSnapshot,
    NodeState,
    Observation,
    Reach,
)
from gpuctl.core.placement import Allocation, JobRequest, JobShape, Settings
from gpuctl.core.units import MemPerCard
from gpuctl.errors import ExitCode, UsageError
from gpuctl.ops.place import load_snapshot, place

SNAPSHOT = Path(__file__).parents[2] / "fixtures" / "snapshots" / "fleet-5-nodes.json"


def test_a_saved_status_document_becomes_a_fleet_state_with_its_version() -> None:
    snap = load_snapshot(SNAPSHOT)
    state = fleet_state_from_snapshot(snap)
    assert state.version == snap.version
    gpu1 = state.node("gpu-01")
    assert (len(gpu1.cards), gpu1.cards[0].capacity_mib) == (8, 81559)
    assert gpu1.cards[0].model == "NVIDIA H100 80GB HBM3"
    assert (gpu1.cpu_milli, gpu1.host_mem_mib) == (128_000, 1_048_576)
    assert dict(gpu1.labels) == {"zone": "eu-1", "pool": "train"}
    assert gpu1.schedulable


def test_memory_in_use_by_unknown_processes_is_ghost_and_driver_overhead_is_not() -> None:
    state = fleet_state_from_snapshot(load_snapshot(SNAPSHOT))
    cards = state.node("gpu-02").cards
    assert cards[0].ghost_mib == 30000
    assert cards[1].ghost_mib == 0  # 12 MiB used: below the floor
    assert cards[0].free_mib == 81920 - 30000


def test_known_allocations_are_allocated_not_ghost() -> None:
    known = (Allocation(job="j", node="gpu-02", cards=(0,), mib_per_card=24000, cpu_milli=4000),)
    state = fleet_state_from_snapshot(load_snapshot(SNAPSHOT), known)
    card = state.node("gpu-02").cards[0]
    assert (card.allocated_mib, card.ghost_mib) == (24000, 6000)
    assert state.node("gpu-02").cpu_allocated_milli == 4000


@pytest.mark.parametrize(
    ("name", "reason"),
    [("gpu-03", "cordoned"), ("gpu-04", "unreachable (timeout)"), ("gpu-05", "health unknown")],
)
def test_nodes_that_cannot_take_work_are_unschedulable_with_the_reason(
    name: str, reason: str
) -> None:
    node = fleet_state_from_snapshot(load_snapshot(SNAPSHOT)).node(name)
    assert (node.schedulable, node.reason) == (False, reason)


def _node(gpu: GpuSnapshot, nvml_ok: bool = True) -> FleetSnapshot:
    obs = Observation(gpus=(gpu,), facts=NodeFacts(cpu_count=8), nvml_ok=nvml_ok)
    return FleetSnapshot(0.0, (NodeSnapshot("n", Reach.OK, NodeState.READY, observation=obs),))


def test_a_failed_gpu_query_makes_a_ready_node_unschedulable() -> None:
    snap = _node(GpuSnapshot(index=0, mem_total_mib=1000, mem_used_mib=0), nvml_ok=False)
    assert fleet_state_from_snapshot(snap).node("n").reason == "GPU query failed"


@pytest.mark.parametrize(
    "gpu",
    [
        GpuSnapshot(index=0, mem_total_mib=None, mem_used_mib=0),
        GpuSnapshot(index=0, mem_total_mib=1000, mem_used_mib=None),
        GpuSnapshot(index=0, mem_total_mib=1000, mem_used_mib=0, remapped_rows_failure=True),
        GpuSnapshot(index=0, mem_total_mib=1000, mem_used_mib=0, ecc_volatile_uncorrected=2),
    ],
    ids=["total-unknown", "used-unknown", "row-remap-failure", "uncorrected-ecc"],
)
def test_a_card_that_cannot_be_trusted_is_unhealthy(gpu: GpuSnapshot) -> None:
    assert not fleet_state_from_snapshot(_node(gpu)).node("n").cards[0].healthy


def test_place_runs_the_engine_on_the_snapshot() -> None:
    job = JobRequest("j", JobShape(4, MemPerCard.whole_card(), ("H100",)))
    p = place([job], Settings(), load_snapshot(SNAPSHOT))
    assert p.placed[0].node == "gpu-01"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", ":1: the snapshot is not JSON: Expecting property name"),
        ("[1, 2]", ": not a fleet snapshot (no 'nodes' list)"),
        ('{"nodes": [{"state": "ready"}]}', ": not a fleet snapshot: missing key 'name'"),
        ('{"nodes": [{"name": "a", "reach": "far"}]}', ": not a fleet snapshot: 'far' is not"),
    ],
)
def test_a_bad_snapshot_file_is_a_usage_error_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "snap.json"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        load_snapshot(path)
    assert str(err.value).startswith(f"{path}{message}")
    assert err.value.exit_code is ExitCode.USAGE


def test_a_missing_snapshot_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read the snapshot"):
        load_snapshot(tmp_path / "nope.json")
