"""The utilization band (docs/design.md): < 50% idle silicon, 60-80% target, > 80% over-committed,
and standard-tier admission stops at its upper edge while spot work may use the headroom. One
definition (`core.band`) behind the fleet numbers, placement and the words that describe it."""

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from gpuctl.core.band import TARGET_BAND, Band, BandName, band_of
from gpuctl.core.fleet.numbers import fleet_numbers, no_jobs
from gpuctl.core.model import FleetSnapshot
from gpuctl.core.placement import Card, FleetState, JobRequest, JobShape, PlacementNode, Settings
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.fragmentation import default_workload
from gpuctl.core.placement.model import Tier
from gpuctl.core.units import MemPerCard

CARD = 10_240  # MiB: ten cards make 100 GiB, so a percent is 1,024 MiB
EMPTY = FleetSnapshot(taken_at=0.0, nodes=())


def fleet(allocated: list[int], cards: int = 10) -> FleetState:
    """One node of `cards` 10 GiB cards, `allocated[i]` MiB granted on card i."""
    node = PlacementNode(
        "n1",
        tuple(
            Card(i, CARD, f"GPU-{i}", "H100", allocated[i] if i < len(allocated) else 0)
            for i in range(cards)
        ),
    )
    return FleetState(nodes=(node,), version="v")


def at_pct(pct_of_fleet: int) -> FleetState:
    """The fleet allocated at exactly `pct_of_fleet` % (whole cards, then a slice)."""
    mib = pct_of_fleet * 10 * CARD // 100
    full, rest = divmod(mib, CARD)
    return fleet([CARD] * full + ([rest] if rest else []))


def band(state: FleetState) -> BandName | None:
    return fleet_numbers(EMPTY, state, default_workload(CARD), no_jobs()).band


def test_a_fleet_allocated_at_85_percent_is_over_committed() -> None:
    numbers = fleet_numbers(EMPTY, at_pct(85), default_workload(CARD), no_jobs())
    assert (numbers.utilization_pct, numbers.band) == (85.0, BandName.OVER)
    assert numbers.to_dict()["band"] == "over"


def test_the_band_edges_are_the_designs() -> None:
    assert [band(at_pct(p)) for p in (0, 49, 50, 59, 60, 80, 81, 100)] == [
        BandName.IDLE,
        BandName.IDLE,
        BandName.LOW,
        BandName.LOW,
        BandName.TARGET,
        BandName.TARGET,
        BandName.OVER,
        BandName.OVER,
    ]
    assert band(FleetState(nodes=())) is None  # no capacity: no utilization, no band


@given(st.integers(0, 10 * CARD))
def test_any_fleet_is_over_committed_exactly_when_more_than_80_percent_is_allocated(
    mib: int,
) -> None:
    full, rest = divmod(mib, CARD)
    state = fleet([CARD] * full + [rest])
    share = Fraction(mib, 10 * CARD)
    expected = (
        BandName.OVER
        if share > Fraction(4, 5)
        else BandName.TARGET
        if share >= Fraction(3, 5)
        else BandName.LOW
        if share >= Fraction(1, 2)
        else BandName.IDLE
    )
    assert band(state) is expected is band_of(state.utilization())


def test_admission_of_standard_work_stops_at_the_bands_upper_edge() -> None:
    state = at_pct(76)
    to_81 = JobRequest("a", JobShape(1, MemPerCard.of_mib(5 * 1024)))  # a slice: 76% + 5%
    to_80 = JobRequest("b", JobShape(1, MemPerCard.of_mib(4 * 1024)))  # 76% + 4%
    (refused,) = plan(state, [to_81], Settings()).unplaced
    assert refused.reason.startswith("standard-tier admission stops at 80.0% of fleet GPU memory")
    assert plan(state, [to_80], Settings()).all_placed
    spot = JobRequest("c", JobShape(1, MemPerCard.of_mib(5 * 1024)), tier=Tier.SPOT)
    assert plan(state, [spot], Settings()).all_placed  # spot work may use the headroom


@given(full=st.integers(0, 9), partial=st.integers(0, CARD), ask=st.integers(1, CARD // 2))
def test_a_standard_job_is_admitted_exactly_while_the_fleet_stays_at_or_below_80_percent(
    full: int, partial: int, ask: int
) -> None:
    allocated = [CARD] * full + [partial]
    state = fleet(allocated, cards=11)  # at least one empty card: the job always fits a card
    capacity = 11 * CARD
    result = plan(state, [JobRequest("j", JobShape(1, MemPerCard.of_mib(ask)))], Settings())
    within = (sum(allocated) + ask) * 5 <= 4 * capacity
    assert result.all_placed is within


def test_the_default_placement_settings_take_the_band_and_the_failover_headroom() -> None:
    settings = Settings()
    assert settings.band_max == TARGET_BAND.upper
    assert settings.standard_limit == min(TARGET_BAND.upper, 1 - settings.headroom)
    assert settings.headroom == 0.15  # docs/design.md: 15% of fleet memory kept for failover


def test_the_words_say_the_edges_of_the_band_they_describe() -> None:
    assert TARGET_BAND.words(BandName.TARGET) == "in the 60-80% band"
    assert TARGET_BAND.words(BandName.OVER) == "over-committed, > 80%"
    assert Band(0.4, 0.7, 0.9).words(BandName.LOW) == "below the 70-90% band"
    assert TARGET_BAND.legend() == (
        "idle (< 50%), low (50-60%), target (60-80%), over (> 80%: failover cannot land)"
    )
