"""The `sbatch` options of a placement (`gpuctl place --emit sbatch`): the node, one task, the
GPU count with the type of the node's GRES, CPUs rounded up and host memory when asked."""

from __future__ import annotations

from gpuctl.core.fleet.scheduler import gres_type, sbatch_options
from gpuctl.core.placement.model import Allocation, JobShape
from gpuctl.core.placement.plan import Placed
from gpuctl.core.scheduler import SchedNode


def placed(cards: tuple[int, ...]) -> Placed:
    return Placed("train", Allocation("train", "gpu07", cards, 0, whole=True), (), 1.0, None, 1, "")


def test_the_gres_type_is_the_nodes_and_cpus_round_up() -> None:
    node = SchedNode("gpu07", gres="gpu:a100:8(S:0-1)")
    emitted = sbatch_options(
        placed((2, 5)), JobShape(gpus=2, cpu_milli=1500, host_mem_mib=2048), node
    )
    assert emitted.options == (
        "--job-name=train",
        "--nodelist=gpu07",
        "--nodes=1",
        "--ntasks=1",
        "--gres=gpu:a100:2",
        "--cpus-per-task=2",
        "--mem=2048M",
    )
    assert emitted.script_lines()[-1].startswith("# gpuctl placed train on gpu07, cards 2,5:")


def test_an_untyped_or_unknown_gres_asks_for_gpus_without_a_type() -> None:
    assert gres_type(SchedNode("a", gres="gpu:4")) is None
    assert gres_type(SchedNode("a", gres="gpu:h100:4,shard:h100:8")) == "h100"
    assert gres_type(None) is None
    emitted = sbatch_options(placed((0,)), JobShape(gpus=1), SchedNode("gpu07", gres="gpu:4"))
    assert emitted.options[-1] == "--gres=gpu:1"
    assert not any(o.startswith(("--mem", "--cpus")) for o in emitted.options)
