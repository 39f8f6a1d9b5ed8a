"""Memory and CPU quantities: exact conversions, rounding up, loud on anything ambiguous."""

import pytest

from gpuctl.core.units import (
    MemPerCard,
    UnitError,
    format_mib,
    parse_cpu_milli,
    parse_mem_mib,
    parse_mem_per_card,
)


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("24GiB", 24 * 1024),
        ("24Gi", 24 * 1024),
        ("24G", 24 * 1024),  # a bare letter is binary, as in Slurm and Docker
        ("24gib", 24 * 1024),
        ("512MiB", 512),
        ("512M", 512),
        ("1.5GiB", 1536),
        ("1TiB", 1024 * 1024),
        ("80GB", 76294),  # 80e9 bytes = 76293.95 MiB, rounded up
        ("1GB", 954),  # 953.67 MiB, rounded up
        ("1MB", 1),  # 0.95 MiB rounds up to one
        ("1B", 1),
        ("1024KiB", 1),
        ("1025KiB", 2),
        (" 24 GiB ", 24 * 1024),
    ],
)
def test_memory_sizes_convert_exactly_to_mib_rounding_up(text: str, mib: int) -> None:
    assert parse_mem_mib(text) == mib


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("24", "needs a unit"),
        (24, "needs a unit"),
        ("24 parsecs", "unknown unit"),
        ("GiB", "not a memory size"),
        ("-1GiB", "not a memory size"),
        ("0GiB", "not a positive memory size"),
        ("", "not a memory size"),
    ],
)
def test_memory_sizes_without_a_clear_unit_are_refused(value: str | int, message: str) -> None:
    with pytest.raises(UnitError, match=message):
        parse_mem_mib(value)  # type: ignore[arg-type]


def test_a_card_memory_request_is_a_size_a_fraction_or_whole() -> None:
    assert parse_mem_per_card("24GiB") == MemPerCard.of_mib(24576)
    assert parse_mem_per_card("0.5") == MemPerCard.of_fraction(0.5)
    assert parse_mem_per_card(0.25) == MemPerCard.of_fraction(0.25)
    assert parse_mem_per_card(1) == MemPerCard.of_fraction(1.0)
    assert parse_mem_per_card("whole") == MemPerCard.whole_card()
    assert parse_mem_per_card("WHOLE") == MemPerCard.whole_card()


@pytest.mark.parametrize("value", ["1.5", 2, 0, "0", True, float("nan"), "half"])
def test_a_card_memory_request_outside_a_card_is_refused(value: object) -> None:
    with pytest.raises(UnitError):
        parse_mem_per_card(value)  # type: ignore[arg-type]


def test_a_fraction_takes_its_share_of_the_card_rounded_up() -> None:
    assert MemPerCard.of_fraction(0.5).mib_on(81559) == 40780
    assert MemPerCard.of_fraction(0.1).mib_on(81920) == 8192  # the decimal 0.1, not its float
    assert MemPerCard.whole_card().mib_on(46068) == 46068
    assert MemPerCard.of_mib(1000).mib_on(46068) == 1000


def test_card_memory_spells_itself_back() -> None:
    for mem in (MemPerCard.of_mib(24576), MemPerCard.of_fraction(0.5), MemPerCard.whole_card()):
        assert parse_mem_per_card(mem.text()) == mem


def test_card_memory_takes_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        MemPerCard(mib=10, whole=True)
    with pytest.raises(ValueError, match="exactly one"):
        MemPerCard()


@pytest.mark.parametrize(
    ("value", "milli"), [(4, 4000), (0.5, 500), ("2", 2000), ("500m", 500), ("0.25", 250)]
)
def test_cpu_amounts_are_milli_cores(value: str | float, milli: int) -> None:
    assert parse_cpu_milli(value) == milli


@pytest.mark.parametrize("value", ["four", "-1", -1, True, "5 cores"])
def test_bad_cpu_amounts_are_refused(value: object) -> None:
    with pytest.raises(UnitError):
        parse_cpu_milli(value)  # type: ignore[arg-type]


def test_memory_is_shown_in_gib_from_one_gib_up() -> None:
    assert format_mib(24576) == "24.0 GiB"
    assert format_mib(512) == "512 MiB"
    assert format_mib(None) == "N/A"
