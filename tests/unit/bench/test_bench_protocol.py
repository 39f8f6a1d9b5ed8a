"""The FGD paper's protocol: arrival order, the tune, the node priority, the target workload."""

from __future__ import annotations

from typing import Any

from gpuctl.bench.openb import OpenbNode, OpenbPod
from gpuctl.bench.protocol import (
    FULL_WORKLOAD,
    arrival_sequence,
    node_priority,
    pod_demand,
    target_workload,
)
from gpuctl.bench.rng import NumpyRng


class ScriptedRng:
    """Draws from a script: `intn` answers in order; shuffle and perm leave things as they are."""

    def __init__(self, picks: list[int]) -> None:
        self.picks = picks
        self.discarded = 0

    def discard(self, n: int) -> None:
        self.discarded += n

    def intn(self, n: int) -> int:
        pick = self.picks.pop(0)
        assert 0 <= pick < n
        return pick

    def shuffle(self, items: list[Any]) -> None:
        items.reverse()

    def perm(self, n: int) -> list[int]:
        return list(range(n))[::-1]


def pod(
    name: str, num_gpu: int = 1, milli: int = 1000, cpu: int = 1000, spec: str = ""
) -> OpenbPod:
    return OpenbPod(name, cpu, 1024, num_gpu, milli if num_gpu else 0, spec)


def test_tune_up_appends_clones_and_stops_at_the_first_per_gpu_overshoot() -> None:
    pods = [pod("b", milli=500), pod("a", num_gpu=2)]  # 2500 milli in all
    rng = ScriptedRng([0, 1, 0, 1])  # a (2x1000), b (500), a, b
    # target 5000: +a -> 4500, +b -> 5000, then a: 5000 + 1000 (per GPU) > 5000: stop.
    out = arrival_sequence(pods, rng, 5000)
    assert [p.name for p in out] == ["b", "a", "a-tuned-0", "b-tuned-1"]
    assert rng.picks == [1]  # the overshooting draw was the last one
    assert rng.discarded == 1


def test_the_tune_up_check_uses_the_per_gpu_milli_so_a_multi_gpu_clone_can_overshoot() -> None:
    pods = [pod("a", num_gpu=8)]  # 8000 milli
    out = arrival_sequence(pods, ScriptedRng([0, 0]), 9000)  # 8000 + 1000 <= 9000: accepted
    assert sum(p.gpu_request_milli for p in out) == 16000


def test_tune_down_removes_random_positions_of_the_shuffled_list() -> None:
    pods = [pod("a"), pod("b"), pod("c"), pod("d")]  # shuffled (reversed): d c b a
    out = arrival_sequence(pods, ScriptedRng([1, 0]), 2000)  # drop c, then d
    assert [p.name for p in out] == ["b", "a"]


def test_node_priority_is_a_permutation_drawn_after_ten_background_draws() -> None:
    nodes = [OpenbNode(n, 1000, 1024, 1, "T4") for n in ("n2", "n1", "n3")]
    rng = ScriptedRng([])
    prio = node_priority(nodes, rng)
    assert prio == {"n1": 2, "n2": 1, "n3": 0}
    assert rng.discarded == 10


def test_the_target_workload_counts_shapes_without_memory_and_keeps_95_percent() -> None:
    pods = [pod(f"p{i}", milli=500) for i in range(19)] + [pod("rare", milli=250)]
    workload = target_workload(pods)
    assert [(d.mib_per_card, p) for d, p in workload] == [(500, 1.0)]
    assert all(d.mem_mib == 0 for d, _ in workload)
    full = target_workload(pods, FULL_WORKLOAD)
    assert [d.mib_per_card for d, _ in full] == [500, 250]
    assert all(d.mem_mib == 1024 for d, _ in full)


def test_a_pod_of_a_whole_gpu_takes_whole_cards_and_its_spec_becomes_models() -> None:
    d = pod_demand(pod("a", num_gpu=1, milli=1000, spec="T4||V100M16"))
    assert (d.whole, d.gpus, d.mib_per_card, d.gpu_models) == (True, 1, 1000, ("T4", "V100M16"))
    assert pod_demand(pod("b", milli=500)).whole is False


def test_numpy_randomness_is_repeatable_per_seed() -> None:
    pods = [pod(f"p{i:02}", milli=100 * (i % 9 + 1)) for i in range(30)]
    one = arrival_sequence(pods, NumpyRng(7), 20_000)
    two = arrival_sequence(pods, NumpyRng(7), 20_000)
    other = arrival_sequence(pods, NumpyRng(8), 20_000)
    assert one == two
    assert one != other
