"""The placement engine, one constraint at a time, on hand-built fleets."""

import pytest

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
    model_matches,
)
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.plan import Placed, Plan, Unplaced
from gpuctl.core.units import MemPerCard, parse_mem_mib
from gpuctl.errors import PlanError

GIB = 1024
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
OPEN = Settings(policy="best-fit", band_max=1.0, headroom=0.0)  # no band: tests of other rules
SLICES_ONLY = Settings(policy="best-fit", whole_card_over=1.0, band_max=1.0, headroom=0.0)


def node(
    name: str,
    cards: int = 1,
    cap: int = 80 * GIB,
    model: str = H100,
    used: tuple[int, ...] = (),
    ghost: tuple[int, ...] = (),
    **kw: object,
) -> PlacementNode:
    return PlacementNode(
        name=name,
        cards=tuple(
            Card(
                index=i,
                capacity_mib=cap,
                uuid=f"GPU-{name}-{i}",
                model=model,
                allocated_mib=used[i] if i < len(used) else 0,
                ghost_mib=ghost[i] if i < len(ghost) else 0,
            )
            for i in range(cards)
        ),
        **kw,  # type: ignore[arg-type]
    )


def fleet(*nodes: PlacementNode, allocations: tuple[Allocation, ...] = ()) -> FleetState:
    return FleetState(nodes=nodes, allocations=allocations, version="v1")


def job(
    name: str,
    gpus: int = 1,
    mem: MemPerCard | str = "whole",
    models: tuple[str, ...] = (),
    **kw: object,
) -> JobRequest:
    if isinstance(mem, str):
        mem = MemPerCard.whole_card() if mem == "whole" else MemPerCard.of_mib(parse_mem_mib(mem))
    return JobRequest(
        name=name,
        shape=JobShape(
            gpus=gpus,
            mem_per_card=mem,
            gpu_models=models,
            cpu_milli=int(kw.pop("cpu_milli", 0)),  # type: ignore[call-overload]
            host_mem_mib=int(kw.pop("host_mem_mib", 0)),  # type: ignore[call-overload]
        ),
        **kw,  # type: ignore[arg-type]
    )


def outcome(p: Plan, name: str) -> Placed | Unplaced:
    return next(o for o in p.jobs if o.job == name)


def placed(p: Plan, name: str) -> Placed:
    o = outcome(p, name)
    assert isinstance(o, Placed), f"{name} was not placed: {getattr(o, 'reason', '')}"
    return o


def unplaced(p: Plan, name: str) -> Unplaced:
    o = outcome(p, name)
    assert isinstance(o, Unplaced), f"{name} was placed on {getattr(o, 'node', '')}"
    return o


def constraints(o: Placed | Unplaced) -> dict[str, int]:
    return {r.constraint: r.count for r in o.rejections}


# --- per-card memory fit ------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [SLICES_ONLY, OPEN], ids=["slices", "default-shapes"])
def test_a_48gb_and_a_40gb_job_do_not_fit_together_on_an_80gb_card(settings: Settings) -> None:
    card_80gb = parse_mem_mib("80GB")
    state = fleet(node("gpu-1", cap=card_80gb))
    p = plan(state, [job("a-48gb", mem="48GB", priority=1), job("b-40gb", mem="40GB")], settings)
    assert placed(p, "a-48gb").node == "gpu-1"
    miss = unplaced(p, "b-40gb")
    assert constraints(miss) in ({"card_memory": 1}, {"empty_cards": 1})
    assert "no node can take 1 × 37.3 GiB" in miss.reason


def test_the_40gb_job_placed_first_leaves_no_room_for_the_48gb_one() -> None:
    state = fleet(node("gpu-1", cap=parse_mem_mib("80GB")))
    p = plan(state, [job("a-48gb", mem="48GB"), job("b-40gb", mem="40GB", priority=1)], SLICES_ONLY)
    assert placed(p, "b-40gb").allocation.mib_per_card == parse_mem_mib("40GB")
    assert "no card with 44.7 GiB free" in unplaced(p, "a-48gb").reason


def test_a_slice_fits_a_card_whose_free_memory_covers_it_exactly() -> None:
    state = fleet(node("gpu-1", used=(30 * GIB,)))
    p = plan(state, [job("fits", mem="50GiB")], SLICES_ONLY)
    assert placed(p, "fits").allocation.mib_per_card == 50 * GIB
    p = plan(state, [job("too-big", mem="51GiB")], SLICES_ONLY)
    assert constraints(unplaced(p, "too-big")) == {"card_memory": 1}


def test_ghost_memory_from_unknown_processes_is_not_free() -> None:
    state = fleet(node("gpu-1", ghost=(40 * GIB,)), node("gpu-2", ghost=(0,)))
    p = plan(state, [job("a", mem="48GiB"), job("b", mem="48GiB")], SLICES_ONLY)
    assert placed(p, "a").node == "gpu-2"
    miss = unplaced(p, "b")
    assert miss.rejections[0].nodes == ("gpu-1", "gpu-2")


def test_a_slice_goes_to_the_tightest_card_under_best_fit() -> None:
    state = fleet(node("gpu-1", cards=3, used=(0, 60 * GIB, 40 * GIB)))
    p = plan(state, [job("small", mem="16GiB")], SLICES_ONLY)
    assert placed(p, "small").cards == (1,)


# --- whole cards and multi-GPU jobs -------------------------------------------------------------


def test_a_whole_card_job_takes_only_an_empty_card() -> None:
    state = fleet(node("gpu-1", cards=2, used=(1 * GIB, 0)))
    p = plan(state, [job("whole")])
    assert placed(p, "whole").cards == (1,)
    assert placed(p, "whole").allocation.whole


def test_a_card_with_ghost_memory_is_not_empty() -> None:
    state = fleet(node("gpu-1", ghost=(512,)))
    assert constraints(unplaced(plan(state, [job("whole")]), "whole")) == {"empty_cards": 1}


def test_a_multi_gpu_job_takes_whole_cards_on_one_node() -> None:
    state = fleet(node("gpu-1", cards=2), node("gpu-2", cards=4))
    p = plan(state, [job("train", gpus=4, mem="10GiB")])
    got = placed(p, "train")
    assert (got.node, got.cards, got.allocation.whole) == ("gpu-2", (0, 1, 2, 3), True)
    assert "multi-GPU jobs take whole cards" in got.shape


def test_a_multi_gpu_job_is_never_split_across_nodes() -> None:
    state = fleet(node("gpu-1", cards=2, used=(GIB, 0)), node("gpu-2", cards=2, used=(0, GIB)))
    miss = unplaced(plan(state, [job("pair", gpus=2)]), "pair")
    assert constraints(miss) == {"empty_cards": 2}
    assert "fewer than 2 empty usable cards" in miss.reason


# --- job-shape policy ---------------------------------------------------------------------------


def test_a_job_over_the_whole_card_threshold_gets_a_whole_card() -> None:
    state = fleet(node("gpu-1"))
    at_half = Settings(whole_card_over=0.5, band_max=1.0, headroom=0.0)
    whole = placed(plan(state, [job("big", mem="48GiB")], at_half), "big")
    assert whole.allocation.whole
    assert "48.0 GiB is over 0.5 of a 80.0 GiB card" in whole.shape
    at_3q = Settings(whole_card_over=0.75, band_max=1.0, headroom=0.0)
    sliced = placed(plan(state, [job("big", mem="48GiB")], at_3q), "big")
    assert not sliced.allocation.whole
    assert sliced.allocation.mib_per_card == 48 * GIB


def test_a_fraction_is_a_share_of_the_card_it_lands_on() -> None:
    state = fleet(node("gpu-1", cap=40 * GIB))
    got = placed(plan(state, [job("half", mem=MemPerCard.of_fraction(0.5))]), "half")
    assert got.allocation.mib_per_card == 20 * GIB
    assert "0.5 of a 40.0 GiB card" in got.shape


def test_a_job_asking_more_than_a_card_holds_is_refused_for_card_size() -> None:
    state = fleet(node("gpu-1"))
    miss = unplaced(plan(state, [job("huge", mem="96GiB")]), "huge")
    assert constraints(miss) == {"card_size": 1}
    assert "cards smaller than 96.0 GiB" in miss.reason


# --- GPU model, labels, affinity ----------------------------------------------------------------


def test_a_model_constraint_skips_nodes_with_other_cards() -> None:
    state = fleet(node("a100", model=A100), node("h100", model=H100))
    p = plan(state, [job("train", models=("H100",))])
    assert placed(p, "train").node == "h100"
    assert constraints(placed(p, "train")) == {"gpu_model": 1}


def test_model_names_match_by_whole_words() -> None:
    assert model_matches("H100", H100)
    assert model_matches("h100 80gb", H100)
    assert model_matches("A100", A100)
    assert not model_matches("A10", A100)
    assert not model_matches("H100", None)


def test_the_reason_counts_each_failed_constraint_by_nodes() -> None:
    state = fleet(
        node("a-1", cards=2, model=A100),
        node("a-2", cards=2, model=A100),
        node("a-3", cards=2, model=A100),
        node("h-1", cards=2, used=(GIB, 0)),
        node("h-2", cards=1),
        node("h-3", cards=2, schedulable=False, reason="cordoned"),
    )
    miss = unplaced(plan(state, [job("pair", gpus=2, models=("H100",))]), "pair")
    assert miss.reason == (
        "no node can take 2 × whole cards of model H100: 3 nodes: no card of model H100; "
        "1 node: cordoned; 1 node: fewer than 2 usable cards; "
        "1 node: fewer than 2 empty usable cards"
    )


def test_node_affinity_needs_every_label() -> None:
    state = fleet(
        node("eu", labels={"zone": "eu-1", "pool": "train"}),
        node("us", labels={"zone": "us-1", "pool": "train"}),
        node("bare"),
    )
    req = (LabelRequirement("zone", ("eu-1", "eu-2")), LabelRequirement("pool"))
    p = plan(state, [job("j", node_affinity=req)])
    assert placed(p, "j").node == "eu"
    assert constraints(placed(p, "j")) == {"node_affinity": 2}


def test_node_anti_affinity_avoids_matching_nodes() -> None:
    state = fleet(node("a", labels={"maintenance": "soon"}), node("b", labels={"pool": "x"}))
    p = plan(state, [job("j", node_anti_affinity=(LabelRequirement("maintenance"),))])
    assert placed(p, "j").node == "b"
    assert outcome(p, "j").rejections[0].summary == "has label maintenance"


def test_job_anti_affinity_spreads_from_named_jobs() -> None:
    running = Allocation(job="db", node="a", cards=(0,), mib_per_card=80 * GIB, whole=True)
    state = fleet(
        node("a", cards=2, used=(80 * GIB, 0)), node("b", cards=2), allocations=(running,)
    )
    p = plan(state, [job("web", avoid_jobs=("db",))], Settings(policy="first-fit"))
    assert placed(p, "web").node == "b"
    assert outcome(p, "web").rejections[0].summary == "runs job db"


def test_job_anti_affinity_is_symmetric() -> None:
    running = Allocation(
        job="db", node="a", cards=(0,), mib_per_card=80 * GIB, whole=True, avoid_jobs=("web",)
    )
    state = fleet(
        node("a", cards=2, used=(80 * GIB, 0)), node("b", cards=2), allocations=(running,)
    )
    assert placed(plan(state, [job("web")], Settings(policy="first-fit")), "web").node == "b"


def test_a_group_spreads_its_replicas_over_nodes() -> None:
    state = fleet(node("a", cards=4), node("b", cards=4), node("c", cards=4))
    replicas = [job(f"web-{i}", mem="8GiB", group="web", avoid_groups=("web",)) for i in range(4)]
    p = plan(state, replicas)
    assert sorted(placed(p, f"web-{i}").node for i in range(3)) == ["a", "b", "c"]
    assert constraints(unplaced(p, "web-3")) == {"job_anti_affinity": 3}


# --- node state, health, host resources ---------------------------------------------------------


def test_unschedulable_nodes_are_skipped_with_their_reason() -> None:
    state = fleet(
        node("a", schedulable=False, reason="cordoned"),
        node("b", schedulable=False, reason="unreachable (timeout)"),
    )
    miss = unplaced(plan(state, [job("j")]), "j")
    assert {r.summary for r in miss.rejections} == {"cordoned", "unreachable (timeout)"}


def test_unhealthy_cards_are_never_used() -> None:
    sick = PlacementNode(
        name="a", cards=(Card(0, 80 * GIB, healthy=False), Card(1, 80 * GIB, healthy=True))
    )
    p = plan(fleet(sick), [job("one"), job("two")], OPEN)
    assert placed(p, "one").cards == (1,)
    assert constraints(unplaced(p, "two")) == {"empty_cards": 1}


def test_host_cpu_and_memory_limit_a_node() -> None:
    state = fleet(
        node("small", cpu_milli=8000, cpu_allocated_milli=6000, host_mem_mib=64 * GIB),
        node("roomy", cpu_milli=64000, host_mem_mib=64 * GIB, host_mem_allocated_mib=60 * GIB),
        node("big", cpu_milli=64000, host_mem_mib=512 * GIB),
    )
    p = plan(state, [job("j", cpu_milli=4000, host_mem_mib=8 * GIB)])
    assert placed(p, "j").node == "big"
    assert constraints(placed(p, "j")) == {"cpu": 1, "host_memory": 1}


def test_a_cpu_only_job_takes_no_card() -> None:
    p = plan(fleet(node("a", cpu_milli=4000)), [job("etl", gpus=0, cpu_milli=2000)])
    got = placed(p, "etl")
    assert got.cards == ()
    assert p.utilization_after == 0.0


# --- the band -----------------------------------------------------------------------------------


def test_standard_admission_stops_at_the_band_upper_edge() -> None:
    state = fleet(node("a", cards=10, cap=10 * GIB))  # 100 GiB, each whole card is 10%
    jobs = [job(f"j{i}") for i in range(9)]
    p = plan(state, jobs)
    assert len(p.placed) == 8
    assert p.utilization_after == pytest.approx(0.8)
    miss = unplaced(p, "j8")
    assert constraints(miss) == {"band": 1}
    assert miss.reason == (
        "standard-tier admission stops at 80.0% of fleet GPU memory (the failover headroom): "
        "utilization is 80.0%, this job would take it to 90.0%"
    )


def test_spot_work_may_use_the_headroom() -> None:
    state = fleet(node("a", cards=10, cap=10 * GIB, used=(10 * GIB,) * 8))
    p = plan(state, [job("std"), job("spot", tier=Tier.SPOT), job("spot-2", tier=Tier.SPOT)])
    assert "std" in {o.job for o in p.unplaced}
    assert {o.job for o in p.placed} == {"spot", "spot-2"}
    assert p.utilization_after == 1.0


def test_spot_stays_under_the_band_when_the_headroom_is_closed_to_it() -> None:
    state = fleet(node("a", cards=10, cap=10 * GIB, used=(10 * GIB,) * 8))
    p = plan(state, [job("spot", tier=Tier.SPOT)], Settings(spot_uses_headroom=False))
    assert "spot may not use the headroom" in unplaced(p, "spot").reason


def test_a_larger_headroom_lowers_the_standard_limit_below_the_band() -> None:
    settings = Settings(band_max=0.8, headroom=0.25)
    assert settings.standard_limit == 0.75
    state = fleet(node("a", cards=4, cap=10 * GIB, used=(10 * GIB,) * 2))  # 50%
    p = plan(state, [job("j")], settings)  # would be 75%: allowed
    assert placed(p, "j")
    p = plan(fleet(node("a", cards=4, cap=10 * GIB, used=(10 * GIB,) * 3)), [job("j")], settings)
    assert constraints(unplaced(p, "j")) == {"band": 1}


def test_the_band_counts_only_schedulable_capacity() -> None:
    state = fleet(
        node("a", cards=4, cap=10 * GIB, used=(10 * GIB,) * 3),
        node("gone", cards=4, cap=10 * GIB, schedulable=False, reason="down"),
    )
    assert state.utilization() == 0.75
    assert constraints(unplaced(plan(state, [job("j")]), "j")) == {"band": 1, "unschedulable": 1}


# --- order, ties, runner-up ---------------------------------------------------------------------


def test_higher_priority_jobs_are_placed_first() -> None:
    state = fleet(node("a", cards=1))
    p = plan(state, [job("aaa"), job("zzz", priority=5)], OPEN)
    assert [o.job for o in p.jobs] == ["zzz", "aaa"]
    assert placed(p, "zzz").node == "a"
    assert isinstance(outcome(p, "aaa"), Unplaced)


def test_at_equal_priority_standard_work_goes_before_spot() -> None:
    p = plan(fleet(node("a")), [job("a-spot", tier=Tier.SPOT), job("b-std")])
    assert [o.job for o in p.jobs] == ["b-std", "a-spot"]


def test_equal_scores_go_to_the_node_named_first_and_the_next_is_the_runner_up() -> None:
    state = fleet(node("gpu-c"), node("gpu-a"), node("gpu-b"))
    got = placed(plan(state, [job("j")], Settings(policy="first-fit")), "j")
    assert got.node == "gpu-a"
    assert got.runner_up is not None
    assert got.runner_up.node == "gpu-b"
    assert got.feasible_nodes == 3


def test_best_fit_prefers_the_fuller_node_and_first_fit_the_first_name() -> None:
    state = fleet(node("a", cards=2), node("b", cards=2, used=(0, 80 * GIB)))
    assert placed(plan(state, [job("j")], Settings(policy="best-fit")), "j").node == "b"
    assert placed(plan(state, [job("j")], Settings(policy="first-fit")), "j").node == "a"


def test_later_jobs_see_earlier_allocations() -> None:
    state = fleet(node("a", cards=2))
    p = plan(state, [job("a-first"), job("b-second"), job("c-third")], OPEN)
    assert [placed(p, n).cards for n in ("a-first", "b-second")] == [(0,), (1,)]
    assert constraints(unplaced(p, "c-third")) == {"empty_cards": 1}
    assert p.predicted[0].allocated_mib == (80 * GIB, 80 * GIB)


# --- bad requests -------------------------------------------------------------------------------


def test_two_jobs_with_one_name_are_refused() -> None:
    with pytest.raises(PlanError, match="repeated: j"):
        plan(fleet(node("a")), [job("j"), job("j")])


def test_a_job_that_already_has_an_allocation_is_not_placed_again() -> None:
    running = Allocation(job="j", node="a", cards=(0,), mib_per_card=80 * GIB, whole=True)
    state = fleet(node("a", cards=2, used=(80 * GIB,)), allocations=(running,))
    assert "already has an allocation on a" in unplaced(plan(state, [job("j")]), "j").reason


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(PlanError, match="unknown policy 'nope'"):
        plan(fleet(node("a")), [job("j")], Settings(policy="nope"))


def test_an_empty_fleet_places_nothing_and_says_so() -> None:
    assert unplaced(plan(fleet(), [job("j")]), "j").reason == "the fleet has no nodes"


def test_a_fraction_at_the_threshold_stays_a_slice_despite_rounding_up() -> None:
    state = fleet(node("gpu-1", cap=81559))  # half is 40779.5 MiB, asked as 40780
    got = placed(plan(state, [job("half", mem=MemPerCard.of_fraction(0.5))], OPEN), "half")
    assert (got.allocation.whole, got.allocation.mib_per_card) == (False, 40780)
    over = placed(plan(state, [job("more", mem=MemPerCard.of_fraction(0.6))], OPEN), "more")
    assert over.allocation.whole


def test_identical_nodes_are_told_apart_by_the_jobs_they_run() -> None:
    etl = Allocation(job="etl", node="a", cards=(), mib_per_card=0, cpu_milli=1000)
    state = fleet(
        node("a", cpu_milli=8000, cpu_allocated_milli=1000),
        node("b", cpu_milli=8000, cpu_allocated_milli=1000),
        allocations=(etl,),
    )
    p = plan(state, [job("web", avoid_jobs=("etl",))], Settings(policy="first-fit"))
    assert placed(p, "web").node == "b"
    assert constraints(placed(p, "web")) == {"job_anti_affinity": 1}


def test_a_fleet_state_refuses_two_nodes_of_one_name_or_two_cards_of_one_index() -> None:
    with pytest.raises(ValueError, match="card indexes of node n1 must be unique"):
        PlacementNode("n1", (Card(0, 1000), Card(0, 1000)))
    with pytest.raises(ValueError, match="node names in a fleet state must be unique"):
        FleetState((PlacementNode("n1"), PlacementNode("n1")))
