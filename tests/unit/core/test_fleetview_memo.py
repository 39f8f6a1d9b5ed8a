"""PlacementMemo: reusing a node's placement view from the poll before is invisible: whatever
changes between polls, the view is the one built from scratch."""

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.core.fleet.view import PlacementMemo, fleet_state_from_snapshot
from gpuctl.core.model import (
    FleetSnapshot,
    GpuSnapshot,
    NodeFacts,
    NodeSnapshot,
    NodeState,
    Observation,
    Reach,
)
from gpuctl.core.placement.model import Allocation

MIB = 81_559
GPU_FIELDS = [f.name for f in dataclasses.fields(GpuSnapshot) if f.name != "index"]


def gpu(i: int, used: int = 0) -> GpuSnapshot:
    return GpuSnapshot(
        index=i,
        uuid=f"GPU-{i}",
        model="H100",
        mem_total_mib=MIB,
        mem_used_mib=used,
        util_pct=10,
        temp_c=40,
        ecc_volatile_uncorrected=0,
    )


def node(name: str, gpus: tuple[GpuSnapshot, ...]) -> NodeSnapshot:
    obs = Observation(gpus=gpus, facts=NodeFacts(hostname=name, cpu_count=64))
    return NodeSnapshot(name, Reach.OK, NodeState.READY, observation=obs, labels={"zone": "a"})


def fleet() -> FleetSnapshot:
    return FleetSnapshot(
        taken_at=0.0,
        nodes=tuple(node(f"n{k}", tuple(gpu(i, 1000 * i) for i in range(4))) for k in range(3)),
    )


def values_for(field: str) -> st.SearchStrategy[object]:
    """A value of the field's own type, or None (unknown)."""
    kind = {f.name: str(f.type) for f in dataclasses.fields(GpuSnapshot)}[field]
    if "bool" in kind:
        base: st.SearchStrategy[object] = st.booleans()
    elif "float" in kind:
        base = st.floats(min_value=0, max_value=1000)
    elif "int" in kind:
        base = st.integers(min_value=0, max_value=2 * MIB)
    else:
        base = st.text(max_size=6)
    return st.one_of(st.none(), base)


GPU_CHANGES = st.sampled_from(GPU_FIELDS).flatmap(lambda f: st.tuples(st.just(f), values_for(f)))
CHANGES = st.one_of(
    st.tuples(st.just("gpu"), st.integers(0, 2), st.integers(0, 3), GPU_CHANGES),
    st.tuples(st.just("reach"), st.integers(0, 2), st.sampled_from(list(Reach))),
    st.tuples(st.just("state"), st.integers(0, 2), st.sampled_from(list(NodeState))),
    st.tuples(st.just("label"), st.integers(0, 2), st.text(max_size=3)),
    st.tuples(st.just("nvml"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("cpu"), st.integers(0, 2), st.integers(0, 256)),
    st.tuples(st.just("alloc"), st.integers(0, 2), st.integers(0, 3), st.integers(0, MIB)),
)


def apply(
    snap: FleetSnapshot, allocs: list[Allocation], change: tuple[object, ...]
) -> FleetSnapshot:
    what, k = change[0], change[1]
    assert isinstance(k, int)
    nodes = list(snap.nodes)
    n = nodes[k]
    obs = n.observation
    if what == "gpu" and obs is not None:
        i, (field, value) = change[2], change[3]  # type: ignore[misc]
        assert isinstance(i, int) and isinstance(field, str)
        gpus = list(obs.gpus)
        if i < len(gpus):
            gpus[i] = dataclasses.replace(gpus[i], **{field: value})
        n = dataclasses.replace(n, observation=dataclasses.replace(obs, gpus=tuple(gpus)))
    elif what == "reach":
        n = dataclasses.replace(n, reach=change[2])
    elif what == "state":
        n = dataclasses.replace(n, state=change[2])
    elif what == "label":
        n = dataclasses.replace(n, labels={"zone": change[2]})
    elif what == "nvml" and obs is not None:
        n = dataclasses.replace(n, observation=dataclasses.replace(obs, nvml_ok=change[2]))
    elif what == "cpu" and obs is not None:
        facts = dataclasses.replace(obs.facts, cpu_count=change[2])
        n = dataclasses.replace(n, observation=dataclasses.replace(obs, facts=facts))
    elif what == "alloc":
        card, mib = change[2], change[3]
        assert isinstance(card, int) and isinstance(mib, int)
        allocs.append(Allocation(f"job-{len(allocs)}", n.name, (card,), mib, False))
    nodes[k] = n
    return dataclasses.replace(snap, nodes=tuple(nodes))


@settings(max_examples=200, deadline=None)
@given(st.lists(CHANGES, min_size=1, max_size=12))
def test_the_memo_always_gives_the_view_built_from_scratch(
    changes: list[tuple[object, ...]],
) -> None:
    memo = PlacementMemo()
    snap = fleet()
    allocs: list[Allocation] = []
    for change in changes:
        snap = apply(snap, allocs, change)
        kept = fleet_state_from_snapshot(snap, allocs, memo=memo)
        fresh = fleet_state_from_snapshot(snap, allocs)
        assert kept == fresh


def test_a_node_whose_memory_did_not_move_is_not_built_again() -> None:
    memo = PlacementMemo()
    snap = fleet()
    first = fleet_state_from_snapshot(snap, memo=memo)
    assert memo.reused == 0
    # utilization and temperature change everywhere, memory on one GPU of one node
    nodes = []
    for k, n in enumerate(snap.nodes):
        assert n.observation is not None
        gpus = tuple(
            dataclasses.replace(
                g, util_pct=99, temp_c=80, mem_used_mib=(g.mem_used_mib or 0) + (k == 1 and i == 0)
            )
            for i, g in enumerate(n.observation.gpus)
        )
        nodes.append(
            dataclasses.replace(n, observation=dataclasses.replace(n.observation, gpus=gpus))
        )
    second = fleet_state_from_snapshot(dataclasses.replace(snap, nodes=tuple(nodes)), memo=memo)
    assert memo.reused == 2
    assert second.nodes[0] is first.nodes[0]
    assert second.nodes[1] is not first.nodes[1]


ALTERNATIVES: dict[str, list[object]] = {
    "bool": [None, True, False],
    "float": [None, 0.0, 350.5],
    "int": [None, 0, 1, 2 * MIB],
    "str": [None, "", "GPU-other", "A100"],
}


def alternatives(field: str) -> list[object]:
    kind = {f.name: str(f.type) for f in dataclasses.fields(GpuSnapshot)}[field]
    return next(v for k, v in ALTERNATIVES.items() if k in kind)


def test_every_gpu_field_alone_either_changes_nothing_or_is_seen() -> None:
    for field in GPU_FIELDS:
        for value in alternatives(field):
            memo = PlacementMemo()
            snap = fleet()
            fleet_state_from_snapshot(snap, memo=memo)
            changed = apply(snap, [], ("gpu", 1, 2, (field, value)))
            kept = fleet_state_from_snapshot(changed, memo=memo)
            assert kept == fleet_state_from_snapshot(changed), (field, value)


@settings(max_examples=100, deadline=None)
@given(st.lists(CHANGES, min_size=1, max_size=8))
def test_a_nodes_totals_are_the_sums_of_its_cards(changes: list[tuple[object, ...]]) -> None:
    snap = fleet()
    allocs: list[Allocation] = []
    for change in changes:
        snap = apply(snap, allocs, change)
    for n in fleet_state_from_snapshot(snap, allocs).nodes:
        t = n.totals()
        healthy = [c for c in n.cards if c.healthy]
        assert t.capacity_mib == sum(c.capacity_mib for c in healthy)
        assert t.allocated_mib == sum(min(c.allocated_mib, c.capacity_mib) for c in healthy)
        assert t.free_mib == sum(c.free_mib for c in n.cards)
        assert t.empty_cards == sum(1 for c in n.cards if c.empty)
        assert t.free.free == tuple(c.free_mib for c in n.cards)
        assert t.free.capacity == tuple(c.capacity_mib for c in n.cards)
        models = {c.model for c in n.cards}
        assert t.free.gpu_model == (models.pop() if len(models) == 1 else None)


def test_cards_are_in_index_order_whatever_order_the_gpus_came_in() -> None:
    listed = (gpu(2, 5000), gpu(0), gpu(1, 70_000))
    state = fleet_state_from_snapshot(FleetSnapshot(taken_at=0.0, nodes=(node("n0", listed),)))
    cards = state.nodes[0].cards
    assert [(c.index, c.ghost_mib) for c in cards] == [(0, 0), (1, 70_000), (2, 5000)]
