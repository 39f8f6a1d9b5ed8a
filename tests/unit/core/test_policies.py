"""Placement policies: first-fit, best-fit (the paper's formula), fgd and gpuctl (the default)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.core.placement import policies
from gpuctl.core.placement.fit import Demand, NodeFree, fits, fitting_cards
from gpuctl.core.placement.policies import BestFit, Fgd, FirstFit, Gpuctl, get_policy

SLICE_500 = Demand(gpus=1, mib_per_card=500)


def node(free: tuple[int, ...], cpu: int | None = None, name: str = "n") -> NodeFree:
    return NodeFree(name, free, (1000,) * len(free), cpu_free_milli=cpu)


def test_the_default_policy_is_gpuctl_and_default_is_its_alias() -> None:
    assert policies.DEFAULT_POLICY == "gpuctl"
    assert get_policy("default") is get_policy("gpuctl")
    assert set(policies.POLICIES) == {"first-fit", "best-fit", "fgd", "gpuctl"}


def test_an_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: best-fit, fgd, first-fit, gpuctl, default"):
        get_policy("tetris")


def test_best_fit_takes_the_fullest_card_that_fits() -> None:
    choice = BestFit().choose(node((1000, 600, 400, 550)), SLICE_500, ())
    assert choice is not None and choice.cards == (3,)


def test_best_fit_with_the_papers_scales_truncates_its_score() -> None:
    paper = BestFit(gpu_scale_units=8000, cpu_scale_milli=128_000, quantize=True)
    # cpu left 64000 - 4000 = 60000, gpu left 1500 - 500 = 1000:
    # s = 0.5 * 60000/128000 + 0.5 * 1000/8000 = 0.296875 -> 100 * (1 - s) = 70.3125 -> 70
    choice = paper.choose(node((1000, 500), cpu=64_000), Demand(1, 500, cpu_milli=4000), ())
    assert choice is not None and choice.score == 70.0 and choice.cards == (1,)


def test_fgd_avoids_the_sliver_that_best_fit_leaves() -> None:
    workload = ((SLICE_500, 1.0),)
    n = node((1000, 700))
    # best-fit packs the 700 card and leaves 200 no 500 slice can use; fgd keeps both usable.
    packed = BestFit().choose(n, SLICE_500, workload)
    assert packed is not None and packed.cards == (1,)
    choice = Fgd().choose(n, SLICE_500, workload)
    assert choice is not None and choice.cards == (0,)
    assert choice.score == 50.0  # no fragmentation added: sigmoid(0)


def test_fgd_scores_are_the_truncated_sigmoid_of_the_fragmentation_gain() -> None:
    workload = ((SLICE_500, 1.0),)
    choice = Fgd().choose(node((700,)), SLICE_500, workload)
    # 700 -> 200: stranded goes 0 -> 200 milli, a gain of -0.2 cards.
    expected = int(100 / (1 + math.exp(0.2)))
    assert choice is not None and choice.score == expected == 45
    unquantized = Fgd(quantize=False).choose(node((700,)), SLICE_500, workload)
    assert unquantized is not None and unquantized.score == pytest.approx(100 / (1 + math.exp(0.2)))


def test_whole_cards_are_the_lowest_indexed_free_ones_for_every_policy() -> None:
    demand = Demand(gpus=2, mib_per_card=1000, whole=True)
    n = node((300, 1000, 1000, 1000))
    for policy in (FirstFit(), BestFit(), Fgd(), Gpuctl()):
        choice = policy.choose(n, demand, ((demand, 1.0),))
        assert choice is not None and choice.cards == (1, 2), policy.name


def test_gpuctl_sends_a_cpu_only_job_where_it_strands_no_card_and_fgd_cannot_tell() -> None:
    gpu_job = Demand(gpus=1, mib_per_card=1000, whole=True, cpu_milli=12_000)
    workload = ((gpu_job, 0.9), (Demand(gpus=0, mib_per_card=0, cpu_milli=32_000), 0.1))
    cpu_job = Demand(gpus=0, mib_per_card=0, cpu_milli=32_000)
    eight_cards = node((1000,) * 8, cpu=96_000)  # 12 cores per card: 32 cores strand ~2.7 cards
    cpu_rich = node((1000,) * 2, cpu=104_000)  # 52 cores per card: nothing strands
    fgd = [Fgd().choose(n, cpu_job, workload) for n in (eight_cards, cpu_rich)]
    assert fgd[0] is not None and fgd[1] is not None and fgd[0].score == fgd[1].score == 50
    ours = [Gpuctl().choose(n, cpu_job, workload) for n in (eight_cards, cpu_rich)]
    assert ours[0] is not None and ours[1] is not None
    assert ours[1].score == 50 and ours[0].score < 50


def test_gpuctl_works_on_mib_cards_of_different_sizes() -> None:
    gib = 1024
    mixed = NodeFree("n", (80 * gib, 30 * gib, 24 * gib), (80 * gib, 40 * gib, 24 * gib))
    workload = ((Demand(1, 24 * gib), 0.5), (Demand(1, 40 * gib), 0.5))
    choice = Gpuctl().choose(mixed, Demand(1, 24 * gib), workload)
    assert choice is not None and len(choice.cards) == 1
    # 24 GiB fills the 24 GiB card and keeps the 80 GiB card whole for a 40 GiB job; on the
    # 40 GiB card it would leave 6 GiB that no job of the workload fits.
    assert choice.cards == (2,)
    assert Gpuctl().choose(mixed, Demand(1, 81 * gib), workload) is None


# Slices as openb has them: a few small ones, most of 300 to 810 milli.
SHARING = (
    (Demand(1, 100), 0.04),
    (Demand(1, 300), 0.3),
    (Demand(1, 400), 0.3),
    (Demand(1, 810), 0.36),
)


def test_gpuctl_takes_the_first_of_cards_alike_as_every_policy_does() -> None:
    n = node((400, 1000, 700, 1000, 1000))
    choice = Gpuctl().choose(n, Demand(1, 300), SHARING)  # 700 -> 400: a hole slices fit
    assert choice is not None and choice.cards == (2,)
    choice = Gpuctl().choose(node((1000,) * 4), Demand(1, 810), SHARING)
    assert choice is not None and choice.cards == (0,)


def test_a_hole_fewer_than_one_in_twenty_sharing_jobs_fit_is_dead() -> None:
    assert Gpuctl().dead_below(SHARING) == 300  # a hole under 300 fits only the 4 % of 100
    assert Gpuctl().dead_below(((Demand(1, 100), 0.1), *SHARING[1:])) == 100
    assert Gpuctl(dead_share=0.5).dead_below(SHARING) == 400
    assert Gpuctl().dead_below(((Demand(1, 1000, whole=True), 1.0),)) == 0  # nothing shares


def test_gpuctl_leaves_a_hole_that_jobs_fit_rather_than_one_almost_none_fit() -> None:
    # 400 on the card with 600 free leaves 200, which only the rare 100 slices fit; on the
    # empty card it leaves 600, which a 300 or 400 slice fits. FGD's measure, blind to which
    # holes get used, prefers the first (it counts 600 free as worse than 200).
    n = node((600, 1000))
    fgd = Fgd().choose(n, Demand(1, 400), SHARING)
    assert fgd is not None and fgd.cards == (0,)
    fgd_like = Gpuctl(dead_weight=0).choose(n, Demand(1, 400), SHARING)
    assert fgd_like is not None and fgd_like.cards == (0,)
    choice = Gpuctl().choose(n, Demand(1, 400), SHARING)
    assert choice is not None and choice.cards == (1,)
    # and a slice that fills a card leaves no hole at all: it goes there
    exact = Gpuctl().choose(node((400, 1000)), Demand(1, 400), SHARING)
    assert exact is not None and exact.cards == (0,)


demands = st.builds(
    Demand,
    gpus=st.integers(0, 3),
    mib_per_card=st.sampled_from([100, 250, 500, 750, 1000]),
    whole=st.booleans(),
    cpu_milli=st.sampled_from([0, 2000, 8000]),
)
free_nodes = st.builds(
    lambda free, cpu: node(tuple(free), cpu),
    st.lists(st.sampled_from([0, 100, 250, 500, 800, 1000]), min_size=1, max_size=8),
    st.one_of(st.none(), st.integers(0, 32_000)),
)


@settings(max_examples=150, deadline=None)
@given(free_nodes, demands, st.lists(demands, min_size=1, max_size=4))
def test_every_policy_answers_with_cards_that_fit_and_the_same_answer_twice(
    n: NodeFree, demand: Demand, shapes: list[Demand]
) -> None:
    workload = tuple((d, 1 / len(shapes)) for d in shapes)
    for policy in policies.POLICIES.values():
        choice = policy.choose(n, demand, workload)
        assert (choice is not None) == fits(n, demand), policy.name
        if choice is not None:
            assert len(choice.cards) == demand.gpus
            assert set(choice.cards) <= set(fitting_cards(n, demand))
            assert policy.choose(n, demand, workload) == choice
