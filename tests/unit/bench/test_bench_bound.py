"""The upper bound of `gpuctl bench placement --bound`: sound against exact optima on small
instances (bound >= exact optimum >= what every policy reaches), and tighter than the plain
capacity where slices, CPU or memory cannot share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuctl.bench import bound
from gpuctl.bench.openb import OpenbNode, OpenbPod
from gpuctl.bench.protocol import gpu_capacity_milli, node_priority, target_workload
from gpuctl.bench.replay import Placement, replay, simulate
from gpuctl.bench.rng import NumpyRng
from gpuctl.bench.runner import bench_policy, run_bench

FIXTURES = Path(__file__).parents[2] / "fixtures" / "openb"
POLICIES = ("best-fit", "fgd", "gpuctl", "first-fit")


def node(
    name: str, gpus: int, cpu: int = 32_000, mem: int = 131_072, model: str = "T4"
) -> OpenbNode:
    return OpenbNode(name, cpu, mem, gpus, model)


def pod(
    name: str, gpus: int, milli: int, cpu: int = 1000, mem: int = 1024, spec: str = ""
) -> OpenbPod:
    return OpenbPod(name, cpu, mem, gpus, milli if gpus else 0, spec if gpus else "")


def test_two_slices_over_half_a_card_never_share_one() -> None:
    nodes = [node("a", 1), node("b", 1)]
    pods = [pod(f"p{i}", 1, 600) for i in range(3)]
    # The milli-GPU capacity alone allows 1800 of the 2000; only two of them fit, one per card.
    assert bound.allocation_bound(nodes, pods).milli == 1200
    assert bound.exact_allocation(nodes, pods) == 1200


def test_a_cards_holes_that_no_slice_fills_are_counted() -> None:
    # One card: two slices of 470 leave 60 that no slice here fills, and the 300 fits beside one
    # 470 only, so 940 at most. The dual-feasible cuts alone allow the whole card (1000).
    nodes = [node("a", 1)]
    pods = [pod("s300", 1, 300), pod("a470", 1, 470), pod("b470", 1, 470)]
    assert bound.exact_allocation(nodes, pods) == 940
    assert bound.allocation_bound(nodes, pods).milli == 940


def test_past_the_pattern_limit_a_type_gets_the_cuts_per_card(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bound, "PATTERN_LIMIT", 0)
    nodes = [node("a", 1)]
    pods = [pod("s300", 1, 300), pod("a470", 1, 470), pod("b470", 1, 470)]
    assert bound.allocation_bound(nodes, pods).milli == 1000
    # still: two slices of more than half a card never share one (a node of two cards)
    assert (
        bound.allocation_bound([node("a", 2)], [pod(f"p{i}", 1, 600) for i in range(3)]).milli
        == 1200
    )


def test_two_pods_over_half_a_node_cpu_never_share_it() -> None:
    nodes = [node("a", 4, cpu=16_000), node("b", 4, cpu=16_000)]
    pods = [pod(f"p{i}", 1, 1000, cpu=10_000) for i in range(3)]
    assert bound.allocation_bound(nodes, pods).milli == 2000
    assert bound.exact_allocation(nodes, pods) == 2000


def test_card_models_and_counts_limit_the_bound() -> None:
    nodes = [node("a", 2, model="T4"), node("b", 8, model="G2")]
    pods = [pod("big", 4, 1000, spec="T4"), pod("g2", 1, 1000, spec="G2"), pod("any", 2, 1000)]
    assert bound.allocation_bound(nodes, pods).milli == 3000
    assert bound.exact_allocation(nodes, pods) == 3000


NODE_KINDS = (
    (2, 104_000, 524_288, "T4"),
    (4, 32_000, 131_072, "V100M16"),
    (1, 8_000, 32_768, "V100M16"),
    (8, 96_000, 393_216, "G2"),
    (2, 16_000, 122_880, "P100"),
)
SLICES = (1000, 1000, 500, 250, 300, 600, 800, 460, 100)


def small_instance(seed: int) -> tuple[list[OpenbNode], list[OpenbPod]]:
    """Three to four openb-like nodes and openb-like pods asking 1.3 x their GPU."""
    rng = np.random.default_rng(seed)
    nodes = []
    for i in range(int(rng.integers(3, 5))):
        gpus, cpu, mem, model = NODE_KINDS[int(rng.integers(len(NODE_KINDS)))]
        nodes.append(OpenbNode(f"n{i}", cpu, mem, gpus, model))
    models = sorted({n.model for n in nodes})
    capacity = gpu_capacity_milli(nodes)
    pods: list[OpenbPod] = []
    asked = 0
    while asked < 1.3 * capacity:
        kind = rng.random()
        cpu = int(rng.choice([2000, 4000, 8000, 16_000, 24_000]))
        mem = int(rng.choice([4096, 16_384, 65_536]))
        spec = str(rng.choice(models)) if rng.random() < 0.2 else ""
        if kind < 0.1:
            p = pod(f"p{len(pods)}", 0, 0, cpu, mem)
        elif kind < 0.25:
            p = pod(f"p{len(pods)}", int(rng.choice([2, 4])), 1000, cpu, mem, spec)
        else:
            p = pod(f"p{len(pods)}", 1, int(rng.choice(SLICES)), cpu, mem, spec)
        pods.append(p)
        asked += p.gpu_request_milli
    return nodes, pods


def placements(
    nodes: list[OpenbNode], pods: list[OpenbPod], name: str, seed: int
) -> list[Placement]:
    """Where policy `name` puts each pod, in order, ties broken by the seed's node order."""
    policy, spec = bench_policy(name)
    rng = NumpyRng(seed)
    rng.discard(1)
    by_name = sorted(nodes, key=lambda n: n.name)
    prio = node_priority(by_name, rng)
    return simulate(
        by_name, pods, policy, target_workload(pods, spec), [prio[n.name] for n in by_name]
    )


def reached(nodes: list[OpenbNode], pods: list[OpenbPod], name: str, seed: int) -> int:
    placed = placements(nodes, pods, name, seed)
    return sum(
        p.gpu_request_milli for p, at in zip(pods, placed, strict=True) if at.node is not None
    )


@pytest.mark.parametrize("seed", range(8))
def test_the_bound_is_above_the_exact_optimum_which_is_above_every_policy(seed: int) -> None:
    nodes, pods = small_instance(seed)
    best = bound.exact_allocation(nodes, pods)
    upper = bound.allocation_bound(nodes, pods).milli
    assert upper >= best > 0
    for name in POLICIES:
        assert reached(nodes, pods, name, seed) <= best, name


def test_the_bound_is_below_the_plain_capacity_on_some_small_instances() -> None:
    tighter = 0
    for seed in range(8):
        nodes, pods = small_instance(seed)
        plain = min(gpu_capacity_milli(nodes), sum(p.gpu_request_milli for p in pods))
        tighter += bound.allocation_bound(nodes, pods).milli < plain
    assert tighter >= 2


def test_each_seeds_bound_is_at_or_above_every_policys_kpi() -> None:
    report = run_bench(
        FIXTURES / "nodes.csv", FIXTURES / "pods.csv", ["best-fit", "fgd", "default"],
        [1, 2, 3, 4], tune=1.3, with_bound=True,
    )  # fmt: skip
    assert report.bounds is not None
    compared = 0
    for s in report.summaries:
        for b, run in zip(report.bounds, s.runs, strict=True):
            assert (run.alloc_130 is None) == (b.alloc_130 is None)
            if run.alloc_130 is not None and b.alloc_130 is not None:
                assert run.alloc_130 <= b.alloc_130
                compared += 1
            assert run.alloc_end <= b.alloc_end
    assert compared


def test_the_column_prefix_stops_at_the_columns_last_event() -> None:
    pods = [pod(f"p{i}", 1, 500) for i in range(6)]  # 25% of 2000 each: columns 25, 50, ...
    assert bound.column_prefix(pods, 2000, 50) == tuple(pods[:2])
    assert bound.column_prefix(pods, 2000, 51) == tuple(pods[:2])  # the column beside it
    assert bound.column_prefix(pods, 2000, 130) is None


def test_in_trace_order_the_pods_arrive_as_listed_each_once() -> None:
    nodes = [node("a", 1)]
    pods = [pod("first", 1, 600), pod("second", 1, 500)]
    policy, _ = bench_policy("fgd")
    for seed in range(5):
        run = replay(nodes, pods, policy, NumpyRng(seed), seed=seed, order="trace")
        assert (run.pods, run.placed, run.alloc_end) == (2, 1, 60.0)


# --- the consolidation benchmark's packing ceiling ----------------------------------------------

WHOLE_AND_700S = [pod("w1", 1, 1000), pod("w2", 1, 1000), pod("a", 1, 700), pod("b", 1, 700)]
WHOLE_AND_700S.append(pod("c", 1, 300))


@pytest.mark.parametrize(
    ("cards", "pods", "must", "expected"),
    [
        # two slices of 600 that every run places: one card each, 400 milli lost on each, and the
        # third, optional, fits nowhere (exact optimum 1200 of 2000)
        ((2,), [pod(f"p{i}", 1, 600) for i in range(3)], 2, 60.0),
        # whole cards aside, the 700s hold a card each; one later 300 fills one hole of 300
        (
            (4,),
            WHOLE_AND_700S,
            4,
            92.5,
        ),
        # 470 + 470 leaves 60 on a card that no slice of the trace can fill (the empty third card
        # is not counted: the exact optimum is 1940 of 3000)
        ((2, 1), [pod("a", 1, 470), pod("b", 1, 470), pod("c", 1, 650), pod("d", 1, 350)], 4, 98.0),
    ],
)
def test_the_packing_ceiling_counts_every_hole_no_packing_of_the_slices_fills(
    cards: tuple[int, ...], pods: list[OpenbPod], must: int, expected: float
) -> None:
    nodes = [node(f"n{i}", c) for i, c in enumerate(cards)]
    capacity = gpu_capacity_milli(nodes)
    packing = bound.packing_ceiling(pods, must, capacity, sum(cards))
    exact = round(100 * bound.exact_allocation(nodes, pods) / capacity, 2)
    assert packing == expected
    assert exact <= packing < bench_ceiling(pods[:must], pods, capacity)


def bench_ceiling(placed: list[OpenbPod], arrivals: list[OpenbPod], capacity: int) -> float:
    from gpuctl.bench.consolidation import ceiling

    return ceiling(placed, arrivals, capacity)


def test_the_packing_ceiling_is_never_under_what_a_replay_reaches() -> None:
    # Random small fleets filled past capacity by each policy: the run's allocation at the end
    # (every pod before its first failure placed, by construction) never exceeds the ceiling.
    from gpuctl.bench.consolidation import run_one

    rng = np.random.default_rng(7)
    for trial in range(6):
        kinds = rng.choice(len(NODE_KINDS), size=3)
        nodes = tuple(node(f"n{i}", *NODE_KINDS[k]) for i, k in enumerate(kinds))
        sizes = (1000, 810, 650, 470, 320, 230, 110)
        pods = tuple(pod(f"p{i}", 1, int(rng.choice(sizes)), cpu=500, spec="") for i in range(12))
        for name in POLICIES:
            run = run_one(nodes, pods, name, trial, 0, 0.0)
            assert run.packing_ceiling_pct is not None
            assert max(v for v in run.curve if v is not None) <= run.packing_ceiling_pct


# --- the forced bound: the node-type LP with the pods before the first failure placed -----------


def first_failure(nodes: list[OpenbNode], pods: list[OpenbPod], name: str, seed: int) -> int:
    """The arrivals before the first pod that policy `name` finds no room for."""
    placed = placements(nodes, pods, name, seed)
    return next((i for i, at in enumerate(placed) if at.node is None), len(pods))


@pytest.mark.parametrize("seed", range(8))
def test_the_forced_bound_is_above_the_exact_optimum_with_the_same_pods_forced(seed: int) -> None:
    nodes, pods = small_instance(seed)
    for name in ("fgd", "gpuctl"):
        must = first_failure(nodes, pods, name, seed)
        best = bound.exact_allocation(nodes, pods, forced=must)
        assert (
            bound.forced_bound(nodes, pods, must).milli >= best >= reached(nodes, pods, name, seed)
        )
        assert best <= bound.exact_allocation(nodes, pods)


def test_the_forced_ceiling_is_never_under_a_replay_with_or_without_consolidation() -> None:
    # Openb-like small fleets (CPU-only, multi-GPU and model-bound pods among them), each policy
    # with no consolidation and with a pass every 3 arrivals: the allocation at x=130 never
    # exceeds the run's forced ceiling (its pods before its first failure placed).
    from gpuctl.bench.consolidation import run_one

    compared = moves = 0
    for seed in range(8):
        nodes, pods = small_instance(seed)
        for name in POLICIES:
            for every, pct in ((0, 0.0), (3, 50.0)):
                run = run_one(tuple(nodes), tuple(pods), name, seed, every, pct)
                if run.alloc_130 is None:
                    continue
                assert run.forced_ceiling_pct is not None
                assert run.alloc_130 <= run.forced_ceiling_pct, (seed, name, every)
                assert run.lowest_ceiling_pct <= run.forced_ceiling_pct
                compared += 1
                moves += run.moves
    assert compared >= 16 and moves > 0


@pytest.mark.parametrize("seed", range(8))
def test_the_kept_ceiling_is_above_every_placement_keeping_the_runs_pods(seed: int) -> None:
    # The kept ceiling of a run without consolidation forces the pods it placed (not only those
    # before its first failure): never under the exact optimum with those pods forced, which
    # is never under the run itself, and never over the packing ceiling of the same run.
    from gpuctl.bench.consolidation import kept_ceiling, run_one

    nodes, pods = small_instance(seed)
    capacity = gpu_capacity_milli(nodes)
    for name in ("fgd", "gpuctl"):
        run = run_one(tuple(nodes), tuple(pods), name, seed, 0, 0.0)
        if run.alloc_130 is None:
            continue
        kept = [p for p in run.prefix if p.name in run.placed_names]
        rest = [p for p in run.prefix if p.name not in run.placed_names]
        best = bound.exact_allocation(nodes, kept + rest, forced=len(kept))
        assert run.kept_ceiling_pct == kept_ceiling(nodes, run.prefix, run.placed_names)
        assert run.kept_ceiling_pct >= round(100 * best / capacity, 2) >= run.alloc_130
        assert run.packing_ceiling_pct is not None
        assert run.kept_ceiling_pct <= run.packing_ceiling_pct


def test_forcing_the_pods_before_the_first_failure_tightens_the_bound() -> None:
    # A slice of 600 arrives first and is placed by every run; the whole-card pod after it can
    # then go nowhere. allocation_bound may drop the slice for the whole card (1000).
    nodes = [node("a", 1)]
    pods = [pod("slice", 1, 600), pod("whole", 1, 1000)]
    assert bound.allocation_bound(nodes, pods).milli == 1000
    assert bound.forced_bound(nodes, pods, 1).milli == 600
    assert bound.exact_allocation(nodes, pods, forced=1) == 600


def test_the_forced_bound_counts_cpu_only_pods_multi_gpu_pods_and_card_models() -> None:
    capacity = 4000
    # A CPU-only pod placed before the first failure takes most of node a's CPU: no GPU pod
    # that needs 8 cores fits beside it, where the packing ceiling (slices only) sees 100%.
    nodes = [node("a", 2, cpu=16_000), node("b", 2, cpu=16_000)]
    pods = [pod("cpu", 0, 0, cpu=12_000), *(pod(f"g{i}", 1, 1000, cpu=8000) for i in range(4))]
    assert bound.forced_bound(nodes, pods, 1).milli == 2000
    assert bound.exact_allocation(nodes, pods, forced=1) == 2000
    assert bound.allocation_bound(nodes, pods).milli == 4000
    assert bound.packing_ceiling(pods, 1, capacity, 4) == 100.0
    # A two-card pod bound to the T4 node leaves it no card for the slices; those on node b
    # (V100) share its two cards: 2 x 700 cannot share one, so 2 x 700 + 2000 at most.
    nodes = [node("a", 2, model="T4"), node("b", 2, model="V100M16")]
    pods = [pod("pair", 2, 1000, spec="T4"), *(pod(f"s{i}", 1, 700) for i in range(4))]
    assert bound.forced_bound(nodes, pods, 1).milli == 3400
    assert bound.exact_allocation(nodes, pods, forced=1) == 3400


def test_no_placement_of_the_forced_pods_is_an_error() -> None:
    nodes = [node("a", 1, model="T4")]
    with pytest.raises(ValueError, match="forced pod"):
        bound.forced_bound(nodes, [pod("g2", 1, 500, spec="G2")], 1)
    with pytest.raises(ValueError, match="forced pod"):
        bound.exact_allocation(nodes, [pod("g2", 1, 500, spec="G2")], forced=1)
    with pytest.raises(ValueError, match="forced pod"):
        bound.forced_bound(nodes, [pod("a", 1, 600), pod("b", 1, 600)], 2)


def test_each_event_of_a_column_is_bounded_by_the_least_loss_at_its_first() -> None:
    # One card; two 600s (one is lost at 120 %), a 44, then five 2-milli pods: the events at
    # 124.6 .. 125.4 % make column 125. The best allocation after each is 646, 648 .. 654 (a
    # 600, the 44 and the 2s so far), mean 65.0 %; the last event's bound alone says 65.4.
    nodes = [node("a", 1)]
    pods = [pod("a", 1, 600), pod("b", 1, 600), pod("c", 1, 44)]
    pods += [pod(f"s{i}", 1, 2) for i in range(5)]
    assert list(bound.column_events(pods, 1000, 125) or ()) == [3, 4, 5, 6, 7]
    assert bound.allocation_bound(nodes, pods).milli == 654
    exact = [bound.exact_allocation(nodes, pods[: i + 1]) for i in range(3, 8)]
    assert exact == [646, 648, 650, 652, 654]
    assert bound.column_bound(nodes, pods, 125)[0] == 65.0
    for name in POLICIES:
        placed = placements(nodes, pods, name, 1)
        used = 0
        kpi = []
        for i, (p, at) in enumerate(zip(pods, placed, strict=True)):
            used += p.gpu_request_milli if at.node is not None else 0
            if i >= 3:
                kpi.append(round(100 * used / 1000, 2))
        assert round(sum(kpi) / len(kpi), 2) <= 65.0, name


def test_the_configuration_bound_sees_a_nodes_cpu_and_cards_together() -> None:
    # One node of two cards and 16 cores: the slices of 500 and 500 and 300 fit its cards, but
    # not its CPU together (4 + 4 + 10 cores), so it holds 500 + 500 at most. The node-type LP
    # pools the CPU and takes part of the 300 too.
    nodes = [node("a", 2, cpu=16_000, mem=65_536)]
    pods = [pod("a", 1, 500, cpu=4000), pod("b", 1, 500, cpu=4000), pod("c", 1, 300, cpu=10_000)]
    assert bound.exact_allocation(nodes, pods) == 1000
    assert bound.allocation_bound(nodes, pods).milli == 1200
    assert bound.configuration_bound(nodes, pods).milli == 1000


@pytest.mark.parametrize("seed", range(8))
def test_the_configuration_bound_lies_between_the_exact_optimum_and_the_node_type_bound(
    seed: int,
) -> None:
    nodes, pods = small_instance(seed)
    best = bound.exact_allocation(nodes, pods)
    assert best <= bound.configuration_bound(nodes, pods).milli
    assert bound.configuration_bound(nodes, pods).milli <= bound.allocation_bound(nodes, pods).milli
    # Cut short, the LP over the configurations found so far is below the optimum; the bound
    # returned is Farley's (the pods at their prices plus each node at its best configuration's
    # worth), which holds at every round.
    assert bound.configuration_bound(nodes, pods, rounds=2).milli >= best


@pytest.mark.parametrize("seed", range(4))
def test_the_configuration_plan_fills_nodes_with_what_fits_them_up_to_the_bound(seed: int) -> None:
    nodes, pods = small_instance(seed)
    plan = bound.configuration_plan(nodes, pods)
    types = {bound.node_class(n): 0 for n in nodes}
    for n in nodes:
        types[bound.node_class(n)] += 1
    asked: dict[bound.PodClass, int] = {}
    for p in pods:
        asked[bound.pod_class(p)] = asked.get(bound.pod_class(p), 0) + 1
    placed = 0.0
    for c in plan:
        cpu, mem, cards, model = c.node
        assert sum(k[0] * n for k, n in c.pods.items()) <= cpu
        assert sum(k[1] * n for k, n in c.pods.items()) <= mem
        assert sum(k[2] * n for k, n in c.pods.items() if k[3] >= 1000) <= cards
        assert all(not k[4] or model in k[4].split("|") for k in c.pods)
        placed += c.nodes * sum(k[2] * k[3] * n for k, n in c.pods.items())
    for t, count in types.items():
        assert sum(c.nodes for c in plan if c.node == t) <= count + 1e-6
    for k, count in asked.items():
        assert sum(c.nodes * c.pods.get(k, 0) for c in plan) <= count + 1e-6
    assert abs(placed - bound.configuration_bound(nodes, pods).milli) <= 1
