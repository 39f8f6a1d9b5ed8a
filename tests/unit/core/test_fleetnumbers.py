"""The five numbers as one value: fragmentation % is stranded / free × 100 over schedulable
nodes against the target workload (docs/design.md), checked against the definition itself
(`core.placement.fragmentation.node_stranded`) on hand-built fleets; the value's document is the one
`gpuctl status -o json` prints and playbook conditions name."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuctl.core.band import BandName
from gpuctl.core.fleet.numbers import FleetNumbers, fleet_numbers, no_jobs
from gpuctl.core.model import FleetSnapshot
from gpuctl.core.placement import Card, FleetState, PlacementNode
from gpuctl.core.placement.fit import Demand, NodeFree, Workload
from gpuctl.core.placement.fragmentation import default_workload, node_stranded
from gpuctl.core.playbook.expr import FLEET_NAMES

GIB = 1024
CARD = 80 * GIB
EMPTY = FleetSnapshot(taken_at=0.0, nodes=())
ONE_40 = ((Demand(1, 40 * GIB), 1.0),)  # every job: one 40 GiB slice


def node(
    name: str,
    allocated: list[int],
    *,
    ghost: list[int] | None = None,
    unhealthy: tuple[int, ...] = (),
    schedulable: bool = True,
    cap: int = CARD,
) -> PlacementNode:
    ghost = ghost or [0] * len(allocated)
    cards = tuple(
        Card(i, cap, f"GPU-{name}-{i}", "H100", a, g, i not in unhealthy)
        for i, (a, g) in enumerate(zip(allocated, ghost, strict=True))
    )
    return PlacementNode(name, cards, schedulable=schedulable)


def numbers(*nodes: PlacementNode, workload: Workload = ONE_40) -> FleetNumbers:
    return fleet_numbers(EMPTY, FleetState(nodes=nodes), workload, no_jobs())


def definition(nodes: tuple[PlacementNode, ...], workload: Workload) -> tuple[float, int]:
    """Stranded and free MiB over schedulable nodes, from the definition card by card."""
    stranded, free = 0.0, 0
    for n in nodes:
        if not n.schedulable:
            continue
        frees = tuple(
            max(0, c.capacity_mib - c.allocated_mib - c.ghost_mib) if c.healthy else 0
            for c in n.cards
        )
        caps = tuple(c.capacity_mib for c in n.cards)
        stranded += node_stranded(NodeFree(n.name, frees, caps, gpu_model="H100"), workload)
        free += sum(frees)
    return stranded, free


def test_free_memory_only_on_cards_too_small_for_every_job_is_all_stranded() -> None:
    n = numbers(node("a", [60 * GIB] * 8))  # 20 GiB free per card, jobs want 40
    assert (n.fragmentation_pct, n.stranded_gib) == (100.0, 160.0)


def test_fragmentation_is_stranded_over_free_on_a_hand_built_fleet() -> None:
    a = node("a", [0, 60 * GIB, 70 * GIB, CARD])  # free 80 + 20 + 10 + 0: 30 stranded
    b = node("b", [50 * GIB, CARD])  # free 30 + 0: 30 stranded
    n = numbers(a, b)
    assert n.stranded_gib == 60.0
    assert n.fragmentation_pct == round(100 * 60 / 140, 2) == 42.86


def test_nodes_that_take_no_work_and_unhealthy_cards_are_left_out() -> None:
    counted = node("a", [0, 60 * GIB])  # free 80 + 20 (stranded)
    cordoned = node("b", [60 * GIB] * 4, schedulable=False)
    broken = node("c", [0, 0], unhealthy=(1,))  # its healthy card is empty: nothing stranded
    n = numbers(counted, cordoned, broken)
    assert n.fragmentation_pct == round(100 * 20 / (100 + 80), 2)
    assert n.capacity_mib == 3 * CARD  # the cordoned node and the broken card hold none


def test_an_empty_fleet_is_not_fragmented_and_a_full_one_has_nothing_to_measure() -> None:
    eight = [0] * 8  # the default workload's largest job takes 8 whole cards
    empty = numbers(node("a", eight), node("b", eight), workload=default_workload(CARD))
    assert (empty.fragmentation_pct, empty.stranded_gib) == (0.0, 0.0)
    full = numbers(node("a", [CARD] * 8), workload=default_workload(CARD))
    assert (full.fragmentation_pct, full.stranded_gib) == (None, 0.0)  # nothing free: no %


cards = st.tuples(
    st.integers(0, CARD),  # allocated
    st.integers(0, 20 * GIB),  # ghost
    st.booleans(),  # healthy
)
nodes = st.lists(
    st.tuples(st.lists(cards, min_size=1, max_size=8), st.booleans()), min_size=1, max_size=5
)
demands = st.lists(
    st.tuples(
        st.builds(
            Demand,
            gpus=st.integers(0, 8),
            mib_per_card=st.integers(1, CARD),
            whole=st.booleans(),
        ),
        st.integers(1, 10),
    ),
    min_size=1,
    max_size=4,
)


@given(nodes, demands)
def test_fragmentation_is_stranded_over_free_times_100_on_any_fleet(
    made: list[tuple[list[tuple[int, int, bool]], bool]], weighted: list[tuple[Demand, int]]
) -> None:
    built = tuple(
        PlacementNode(
            f"n{i}",
            tuple(Card(j, CARD, None, "H100", a, g, h) for j, (a, g, h) in enumerate(cs)),
            schedulable=sched,
        )
        for i, (cs, sched) in enumerate(made)
    )
    total = sum(w for _, w in weighted)
    workload = tuple((d, w / total) for d, w in weighted)
    n = numbers(*built, workload=workload)
    stranded, free = definition(built, workload)
    if free == 0:
        assert n.fragmentation_pct is None
    else:
        assert n.fragmentation_pct is not None
        assert 0.0 <= n.fragmentation_pct <= 100.0
        assert n.fragmentation_pct == pytest.approx(100 * stranded / free, abs=0.006)
    assert n.stranded_gib == pytest.approx(stranded / GIB, abs=0.006)


def test_the_document_has_the_names_of_gpuctl_status_and_of_playbook_conditions() -> None:
    n = numbers(node("a", [60 * GIB, 0]))
    doc = n.to_dict()
    assert list(doc)[:7] == [
        "utilization_pct",
        "band",
        "allocated_mib",
        "capacity_mib",
        "observed_util_pct",
        "fragmentation_pct",
        "stranded_gib",
    ]
    assert set(doc) <= set(FLEET_NAMES)
    assert doc["band"] == "idle" and n.band is BandName.IDLE
    assert FleetNumbers.from_dict(json.loads(json.dumps(doc))) == n
    store_only = n.without_poll()  # metrics --from-store: no poll, the job figures only
    assert list(store_only.to_dict().values())[:7] == [None] * 7
    assert store_only.jobs == n.jobs
