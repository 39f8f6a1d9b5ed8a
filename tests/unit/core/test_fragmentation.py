"""The fragmentation measure on hand-computed cases (units: MiB per card unless said)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.core.placement.fit import Demand, NodeFree, Workload, fits, take
from gpuctl.core.placement.fragmentation import (
    HostRatio,
    WorkloadIndex,
    default_workload,
    fleet_fragmentation,
    host_ratio,
    host_stranded,
    node_stranded,
    whole_fillers,
    workload_from_counts,
)

GIB = 1024
CARD_80 = 80 * GIB


def card80(free: int, *, cpu: int | None = None, model: str | None = None) -> NodeFree:
    return NodeFree("n", (free,), (CARD_80,), cpu_free_milli=cpu, gpu_model=model)


def test_on_an_80gb_card_a_48gb_job_and_a_40gb_job_do_not_fit_together() -> None:
    job_48 = Demand(gpus=1, mib_per_card=48 * GIB)
    job_40 = Demand(gpus=1, mib_per_card=40 * GIB)
    after = take(card80(CARD_80), job_48, (0,))
    assert after.free == (32 * GIB,)
    assert not fits(after, job_40)
    # Against a workload of 40 GB jobs the 32 GB left over is stranded, all of it.
    workload = ((job_40, 1.0),)
    assert node_stranded(card80(CARD_80), workload) == 0
    assert node_stranded(after, workload) == 32 * GIB


def test_free_memory_on_cards_too_small_for_a_shape_is_stranded_the_rest_is_usable() -> None:
    node = NodeFree("n", (CARD_80, 30 * GIB), (CARD_80, CARD_80))
    slice_20 = Demand(gpus=1, mib_per_card=20 * GIB)
    whole = Demand(gpus=1, mib_per_card=CARD_80, whole=True)
    # slice_20 fits both cards: nothing stranded. A whole card fits only card 0: 30 GiB stranded.
    assert node_stranded(node, ((slice_20, 1.0),)) == 0
    assert node_stranded(node, ((whole, 1.0),)) == 30 * GIB
    assert node_stranded(node, ((slice_20, 0.5), (whole, 0.5))) == 15 * GIB


def test_a_shape_that_cannot_fit_the_node_strands_all_its_free_memory() -> None:
    two_cards = Demand(gpus=2, mib_per_card=CARD_80, whole=True)
    node = NodeFree("n", (CARD_80, 10 * GIB), (CARD_80, CARD_80))
    assert node_stranded(node, ((two_cards, 1.0),)) == 90 * GIB


def test_cpu_only_shapes_strand_every_free_card_unit() -> None:
    cpu_only = Demand(gpus=0, mib_per_card=0, cpu_milli=8000)
    assert node_stranded(card80(CARD_80, cpu=64000), ((cpu_only, 1.0),)) == CARD_80


def test_a_node_without_the_cpu_for_a_shape_strands_everything_for_it() -> None:
    shape = Demand(gpus=1, mib_per_card=10 * GIB, cpu_milli=8000)
    assert node_stranded(card80(CARD_80, cpu=8000), ((shape, 1.0),)) == 0
    assert node_stranded(card80(CARD_80, cpu=7999), ((shape, 1.0),)) == CARD_80


def test_a_card_model_the_shape_does_not_accept_strands_everything_for_it() -> None:
    shape = Demand(gpus=1, mib_per_card=10 * GIB, gpu_models=("A100",))
    assert node_stranded(card80(CARD_80, model="A100"), ((shape, 1.0),)) == 0
    assert node_stranded(card80(CARD_80, model="H100"), ((shape, 1.0),)) == CARD_80


def test_fleet_fragmentation_sums_nodes_and_reports_shares_of_free_and_capacity() -> None:
    workload = ((Demand(gpus=1, mib_per_card=40 * GIB), 1.0),)
    nodes = [
        NodeFree("a", (32 * GIB, CARD_80), (CARD_80, CARD_80)),  # 32 GiB stranded
        NodeFree("b", (0,), (CARD_80,)),  # full: nothing free
    ]
    report = fleet_fragmentation(nodes, workload)
    assert report.stranded_units == 32 * GIB
    assert report.free_units == 112 * GIB
    assert report.capacity_units == 240 * GIB
    assert report.pct_of_free == pytest.approx(100 * 32 / 112)
    assert report.pct_of_capacity == pytest.approx(100 * 32 / 240)
    assert [n.name for n in report.nodes] == ["a", "b"]
    assert report.nodes[1].pct_of_free is None  # nothing free: unknown, not 0 %


def test_an_empty_fleet_reports_unknown_percentages() -> None:
    report = fleet_fragmentation([], ())
    assert (report.pct_of_free, report.pct_of_capacity) == (None, None)


def test_the_workload_keeps_the_most_frequent_shapes_covering_95_percent() -> None:
    big = Demand(gpus=1, mib_per_card=1000, whole=True)
    half = Demand(gpus=1, mib_per_card=500)
    rare = Demand(gpus=1, mib_per_card=250)
    counts = [(big, 60), (half, 35), (rare, 5)]
    workload = workload_from_counts(counts)
    assert [d for d, _ in workload] == [big, half]
    assert [p for _, p in workload] == pytest.approx([60 / 95, 35 / 95])
    assert [d for d, _ in workload_from_counts(counts, coverage_pct=100)] == [big, half, rare]


def test_equal_counts_are_ordered_by_cpu_then_size_then_cards_descending() -> None:
    a = Demand(gpus=1, mib_per_card=500, cpu_milli=2000)
    b = Demand(gpus=1, mib_per_card=500, cpu_milli=4000)
    c = Demand(gpus=1, mib_per_card=800, cpu_milli=2000)
    workload = workload_from_counts([(a, 3), (b, 3), (c, 3), (a, 0)], coverage_pct=100)
    assert [d for d, _ in workload] == [b, c, a]


def test_no_observations_give_an_empty_workload_and_a_sane_default_exists() -> None:
    assert workload_from_counts([]) == ()
    default = default_workload(CARD_80)
    assert sum(p for _, p in default) == pytest.approx(1.0)
    assert all(d.gpus >= 1 for d, _ in default)


def test_host_stranding_counts_the_cards_the_host_cannot_feed() -> None:
    ratio = HostRatio(cpu_milli_per_unit=12.0, mem_mib_per_unit=0.0)  # 12 cores per 1000 units
    node = NodeFree("n", (1000,) * 8, (1000,) * 8, cpu_free_milli=48_000)
    assert host_stranded(node, ratio) == pytest.approx(4000)  # 48 cores feed 4 of 8 cards
    rich = NodeFree("n", (1000,) * 2, (1000,) * 2, cpu_free_milli=48_000)
    assert host_stranded(rich, ratio) == 0


def test_a_typical_whole_card_job_that_takes_every_free_card_feeds_them_all() -> None:
    # 10 cores a card on average: a 4-card, 32-core node feeds 3.2 of its cards at that rate,
    # but the typical 4-card job asks 30 cores and fits it whole.
    ratio = HostRatio(cpu_milli_per_unit=10.0, mem_mib_per_unit=0.0)
    quad = NodeFree("q", (1000,) * 4, (1000,) * 4, cpu_free_milli=32_000)
    four = Demand(gpus=4, mib_per_card=1000, whole=True, cpu_milli=30_000)
    hungry = Demand(gpus=4, mib_per_card=1000, whole=True, cpu_milli=36_000)
    two = Demand(gpus=2, mib_per_card=1000, whole=True, cpu_milli=8_000)
    assert host_stranded(quad, ratio) == pytest.approx(800)
    assert host_stranded(quad, ratio, {4: (four,)}) == 0
    assert host_stranded(quad, ratio, {4: (hungry,)}) == pytest.approx(800)  # does not fit
    assert host_stranded(quad, ratio, {2: (two,)}) == pytest.approx(800)  # takes only 2 of 4
    used = NodeFree("q", (1000, 1000, 1000, 500), (1000,) * 4, cpu_free_milli=32_000)
    assert host_stranded(used, ratio, {4: (four,)}) == pytest.approx(3500 - 3200)


def test_the_fillers_are_the_typical_whole_card_shapes_by_card_count() -> None:
    four = Demand(gpus=4, mib_per_card=1000, whole=True, cpu_milli=30_000)
    rare = Demand(gpus=4, mib_per_card=1000, whole=True, cpu_milli=2_000)
    one = Demand(gpus=1, mib_per_card=1000, whole=True, cpu_milli=8_000)
    part = Demand(gpus=1, mib_per_card=500, cpu_milli=4_000)
    workload = ((four, 0.3), (one, 0.4), (part, 0.28), (rare, 0.02))
    # the most frequent shapes that make up 95 % of the jobs: the 2 % one is not typical
    assert whole_fillers(workload) == {4: (four,), 1: (one,)}


def test_the_host_ratio_comes_from_the_card_using_shapes_only() -> None:
    workload = (
        (Demand(gpus=1, mib_per_card=1000, whole=True, cpu_milli=12_000, mem_mib=48_000), 0.5),
        (Demand(gpus=1, mib_per_card=500, cpu_milli=4_000, mem_mib=16_000), 0.25),
        (Demand(gpus=0, mib_per_card=0, cpu_milli=32_000), 0.25),  # CPU-only: feeds no card
    )
    ratio = host_ratio(workload)
    assert ratio.cpu_milli_per_unit == pytest.approx((6000 + 1000) / (500 + 125))
    assert ratio.mem_mib_per_unit == pytest.approx((24_000 + 4000) / (500 + 125))


shapes = st.builds(
    Demand,
    gpus=st.integers(0, 3),
    mib_per_card=st.sampled_from([100, 250, 400, 500, 1000]),
    whole=st.booleans(),
    cpu_milli=st.sampled_from([0, 1000, 4000, 8000]),
    mem_mib=st.sampled_from([0, 1024, 8192]),
    gpu_models=st.sampled_from([(), ("A",), ("A", "B")]),
)
workloads = st.lists(st.tuples(shapes, st.integers(1, 20)), min_size=1, max_size=6).map(
    lambda counts: workload_from_counts(counts, coverage_pct=100)
)
nodes = st.builds(
    lambda free, cpu, mem, model: NodeFree("n", tuple(free), (1000,) * len(free), cpu, mem, model),
    st.lists(st.sampled_from([0, 100, 250, 500, 600, 1000]), min_size=0, max_size=4),
    st.one_of(st.none(), st.integers(0, 16000)),
    st.one_of(st.none(), st.integers(0, 16000)),
    st.sampled_from([None, "A", "B", "C"]),
)


@settings(max_examples=200, deadline=None)
@given(nodes, workloads)
def test_the_fast_index_agrees_with_the_definition(node: NodeFree, workload: Workload) -> None:
    index = WorkloadIndex(workload)
    assert index.stranded(node) == pytest.approx(node_stranded(node, workload), abs=1e-9)
    assert index.stranded(node) == index.stranded(node)  # memoised, same answer
