"""Properties of every plan, on generated fleets and job lists (hypothesis)."""

import dataclasses
import random
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuctl.core.placement import (
    Allocation,
    Card,
    FleetState,
    JobRequest,
    JobShape,
    LabelRequirement,
    PlacementNode,
    Settings,
    Tier,
)
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.plan import Placed, Plan, Unplaced, apply_plan, usage_of
from gpuctl.core.units import MemPerCard

GIB = 1024
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA L40S")
CAPACITIES = (16 * GIB, 40 * GIB, 80 * GIB)
NAMES = ("a", "b", "c", "d", "e", "f", "g", "h")


@st.composite
def cards(draw: st.DrawFn, count: int) -> tuple[Card, ...]:
    cap = draw(st.sampled_from(CAPACITIES))
    model = draw(st.sampled_from(MODELS))
    out = []
    for i in range(count):
        allocated = draw(st.sampled_from((0, 0, 0, cap // 4, cap // 2, cap)))
        ghost = draw(st.sampled_from((0, 0, 0, 1000, cap // 4)))
        healthy = draw(st.sampled_from((True, True, True, False)))
        out.append(Card(i, cap, f"GPU-{i}", model, allocated, min(ghost, cap), healthy))
    return tuple(out)


@st.composite
def nodes(draw: st.DrawFn, name: str) -> PlacementNode:
    schedulable = name == "a" or draw(st.sampled_from((True, True, True, False)))
    cpu = draw(st.sampled_from((None, 8000, 64000)))
    return PlacementNode(
        name=name,
        cards=draw(cards(draw(st.integers(0, 8)))),
        cpu_milli=cpu,
        cpu_allocated_milli=0 if cpu is None else draw(st.sampled_from((0, cpu // 2))),
        host_mem_mib=draw(st.sampled_from((None, 64 * GIB, 512 * GIB))),
        labels=draw(st.sampled_from(({}, {"zone": "eu"}, {"zone": "us"}, {"pool": "x"}))),
        schedulable=schedulable,
        reason=None if schedulable else "cordoned",
    )


@st.composite
def states(draw: st.DrawFn) -> FleetState:
    names = NAMES[: draw(st.integers(1, 5))]
    ns = tuple(draw(nodes(n)) for n in names)
    return FleetState(nodes=ns, version=draw(st.sampled_from(("v1", "v2"))))


mems = st.one_of(
    st.sampled_from((4 * GIB, 10 * GIB, 24 * GIB, 48 * GIB)).map(MemPerCard.of_mib),
    st.sampled_from((0.25, 0.5, 1.0)).map(MemPerCard.of_fraction),
    st.just(MemPerCard.whole_card()),
)


@st.composite
def jobs(draw: st.DrawFn) -> list[JobRequest]:
    count = draw(st.integers(1, 8))
    out = []
    for i in range(count):
        group = draw(st.sampled_from((None, "g1", "g2")))
        out.append(
            JobRequest(
                name=f"job-{i}",
                shape=JobShape(
                    gpus=draw(st.integers(0, 3)),
                    mem_per_card=draw(mems),
                    gpu_models=draw(st.sampled_from(((), (), (), ("H100",), ("A100", "L40S")))),
                    cpu_milli=draw(st.sampled_from((0, 2000, 16000))),
                    host_mem_mib=draw(st.sampled_from((0, 32 * GIB))),
                ),
                tier=draw(st.sampled_from(Tier)),
                priority=draw(st.integers(0, 2)),
                node_affinity=draw(st.sampled_from(((), (), (), (LabelRequirement("zone"),)))),
                node_anti_affinity=draw(
                    st.sampled_from(((), (), (), (LabelRequirement("zone", ("us",)),)))
                ),
                group=group,
                avoid_jobs=draw(st.sampled_from(((), (), ("job-0",), ("job-1", "job-2")))),
                avoid_groups=draw(st.sampled_from(((), (), ("g1",)))),
            )
        )
    return out


setting_choices = st.builds(
    Settings,
    policy=st.sampled_from(("first-fit", "best-fit")),
    whole_card_over=st.sampled_from((0.5, 0.75, 1.0)),
    band_max=st.sampled_from((0.6, 0.8, 1.0)),
    headroom=st.sampled_from((0.0, 0.15)),
    spot_uses_headroom=st.booleans(),
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(states(), jobs(), setting_choices)
def test_a_plan_never_exceeds_a_cards_or_a_nodes_capacity(
    state: FleetState, reqs: list[JobRequest], s: Settings
) -> None:
    after = apply_plan(state, plan(state, reqs, s))
    for before, now in zip(state.nodes, after.nodes, strict=True):
        for c0, c1 in zip(before.cards, now.cards, strict=True):
            added = c1.allocated_mib - c0.allocated_mib
            assert added <= c0.free_mib, f"{now.name} card {c1.index} overcommitted"
        if now.cpu_milli is not None:
            assert now.cpu_allocated_milli - before.cpu_allocated_milli <= (
                before.cpu_free_milli or 0
            )
        if now.host_mem_mib is not None:
            assert now.host_mem_allocated_mib <= now.host_mem_mib


@FAST
@given(states(), jobs(), setting_choices)
def test_a_plan_never_admits_work_past_its_tiers_band_limit(
    state: FleetState, reqs: list[JobRequest], s: Settings
) -> None:
    p = plan(state, reqs, s)
    total = state.capacity_mib()
    allocated = state.allocated_mib()
    for o in p.placed:
        a = o.allocation
        node = state.node(a.node)
        caps = {c.index: c.capacity_mib for c in node.cards}
        added = sum(caps[i] if a.whole else a.mib_per_card for i in a.cards)
        allocated += added
        if added:
            limit = s.limit_for(o.tier)
            assert Fraction(allocated) <= Fraction(repr(limit)) * total, o.job


@FAST
@given(states(), jobs(), setting_choices)
def test_a_whole_card_job_never_shares_a_card(
    state: FleetState, reqs: list[JobRequest], s: Settings
) -> None:
    p = plan(state, reqs, s)
    users: dict[tuple[str, int], list[Allocation]] = {}
    for o in p.placed:
        for i in o.cards:
            users.setdefault((o.node, i), []).append(o.allocation)
    for (node, i), allocs in users.items():
        if any(a.whole for a in allocs):
            assert len(allocs) == 1
            card = next(c for c in state.node(node).cards if c.index == i)
            assert card.empty, f"whole-card job on a used card {node}/{i}"


@FAST
@given(states(), jobs(), setting_choices, st.randoms(use_true_random=False))
def test_the_same_inputs_give_the_same_plan_whatever_their_order(
    state: FleetState, reqs: list[JobRequest], s: Settings, rnd: random.Random
) -> None:
    first = plan(state, reqs, s)
    shuffled_jobs = list(reqs)
    rnd.shuffle(shuffled_jobs)
    shuffled_nodes = list(state.nodes)
    rnd.shuffle(shuffled_nodes)
    again = plan(dataclasses.replace(state, nodes=tuple(shuffled_nodes)), shuffled_jobs, s)
    assert again == first


@FAST
@given(states(), jobs(), setting_choices)
def test_applying_a_plan_gives_the_state_the_plan_predicted(
    state: FleetState, reqs: list[JobRequest], s: Settings
) -> None:
    p = plan(state, reqs, s)
    after = apply_plan(state, p)
    assert usage_of(after, {u.node for u in p.predicted}) == p.predicted
    assert after.utilization() == p.utilization_after
    assert after.version == p.version_after
    untouched = {n.name for n in state.nodes} - {u.node for u in p.predicted}
    for name in untouched:
        assert after.node(name) == state.node(name)


@FAST
@given(states(), jobs(), setting_choices)
def test_every_unplaced_job_carries_a_reason_accounting_for_every_node(
    state: FleetState, reqs: list[JobRequest], s: Settings
) -> None:
    p: Plan = plan(state, reqs, s)
    assert len(p.jobs) == len(reqs)
    for o in p.jobs:
        rejected = sum(r.count for r in o.rejections)
        if isinstance(o, Unplaced):
            assert o.reason
            assert o.rejections
            assert rejected == len(state.nodes)
        else:
            assert isinstance(o, Placed)
            assert rejected + o.feasible_nodes == len(state.nodes)
