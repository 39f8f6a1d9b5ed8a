"""Memory and CPU quantities as operators write them, converted to exact integers.

Memory becomes MiB, always rounded *up* (a request is never silently shrunk):

- IEC suffixes are binary: `KiB`, `MiB`, `GiB`, `TiB` (also `Ki`, `Mi`, `Gi`, `Ti`).
- SI suffixes with `B` are decimal, exactly: `KB` = 10^3, `MB` = 10^6, `GB` = 10^9, `TB` = 10^12
  bytes, so `80GB` is 76,294 MiB (not 81,920).
- A bare letter (`24G`, `512M`) is binary, as in Slurm's `--mem` and Docker's `--memory`.
- `B` or no suffix with a unit-less integer is not memory: `parse_mem_mib("24")` is an error (is it
  MiB? GiB?); say which.
- Suffixes are case-insensitive (`24gib` = `24GiB`); decimals are exact (`1.5GiB` = 1536 MiB).

A job's memory per card (`mem_per_gpu` in a job spec) is one of three kinds (`MemPerCard`): an
absolute amount (`24GiB`), a fraction of a card (`0.5`, in (0, 1]), or `whole` (whole cards).

CPU is milli-cores: `2` = 2000, `0.5` = 500, `"500m"` = 500.
"""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction

_MIB = 1 << 20
_UNITS: dict[str, int] = {
    "b": 1,
    "k": 1 << 10,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gi": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "ti": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_MEM = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]+)\s*$")
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*$")
_MILLI = re.compile(r"^\s*(\d+)\s*m\s*$")


class UnitError(ValueError):
    """A quantity could not be read. The message says what was expected."""


def parse_mem_mib(text: str | int | float) -> int:
    """`24GiB` -> 24576, `80GB` -> 76294, `512MiB` -> 512. Rounds up to whole MiB."""
    if isinstance(text, bool) or not isinstance(text, str) or _NUMBER.match(text):
        raise UnitError(f"{text!r} needs a unit: write e.g. 24GiB, 512MiB or 80GB")
    m = _MEM.match(text)
    if m is None:
        raise UnitError(f"{text!r} is not a memory size: write e.g. 24GiB, 512MiB or 80GB")
    number, suffix = m.groups()
    factor = _UNITS.get(suffix.lower())
    if factor is None:
        raise UnitError(
            f"{text!r}: unknown unit {suffix!r}; use KiB, MiB, GiB, TiB (binary), "
            "KB, MB, GB, TB (decimal) or K, M, G, T (binary)"
        )
    mib = math.ceil(Fraction(number) * factor / _MIB)
    if mib <= 0:
        raise UnitError(f"{text!r} is not a positive memory size")
    return mib


def parse_cpu_milli(value: str | int | float) -> int:
    """Cores as a number (`2`, `0.5`) or milli-cores as `500m`. Rounds up to whole milli-cores."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a CPU amount: write e.g. 4, 0.5 or 500m")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise UnitError(f"{value!r} is not a CPU amount: write e.g. 4, 0.5 or 500m")
        return math.ceil(_exact(value) * 1000)
    if (m := _MILLI.match(value)) is not None:
        return int(m.group(1))
    if (m := _NUMBER.match(value)) is not None:
        return math.ceil(Fraction(m.group(1)) * 1000)
    raise UnitError(f"{value!r} is not a CPU amount: write e.g. 4, 0.5 or 500m")


def _exact(value: float) -> Fraction:
    """The decimal a float was written as (`0.1` -> 1/10), not its binary approximation."""
    return Fraction(repr(float(value)))


@dataclasses.dataclass(frozen=True, slots=True)
class MemPerCard:
    """Memory per GPU: exactly one of `mib`, `fraction` (of a card, 0 < f <= 1) or `whole`."""

    mib: int | None = None
    fraction: float | None = None
    whole: bool = False

    def __post_init__(self) -> None:
        given = (self.mib is not None) + (self.fraction is not None) + self.whole
        if given != 1:
            raise ValueError("MemPerCard takes exactly one of mib, fraction or whole")
        if self.mib is not None and self.mib <= 0:
            raise ValueError("mib must be positive")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError("fraction must be in (0, 1]")

    @classmethod
    def of_mib(cls, mib: int) -> MemPerCard:
        return cls(mib=mib)

    @classmethod
    def of_fraction(cls, fraction: float) -> MemPerCard:
        return cls(fraction=fraction)

    @classmethod
    def whole_card(cls) -> MemPerCard:
        return cls(whole=True)

    def mib_on(self, capacity_mib: int) -> int:
        """MiB this request takes on a card of `capacity_mib` (a whole card takes all of it)."""
        if self.whole:
            return capacity_mib
        if self.fraction is not None:
            return math.ceil(_exact(self.fraction) * capacity_mib)
        assert self.mib is not None
        return self.mib

    def text(self) -> str:
        """The canonical spelling: `24576MiB`, `0.5`, `whole` (`parse_mem_per_card` reads it)."""
        if self.whole:
            return "whole"
        if self.fraction is not None:
            return repr(float(self.fraction))
        return f"{self.mib}MiB"


def parse_mem_per_card(value: str | int | float) -> MemPerCard:
    """`whole`, a fraction of a card in (0, 1] (`0.5`), or a memory size (`24GiB`)."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a memory request: write 24GiB, 0.5 or whole")
    if isinstance(value, str) and value.strip().lower() == "whole":
        return MemPerCard.whole_card()
    number: Fraction | None = None
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise UnitError(f"{value!r} is not a memory request: write 24GiB, 0.5 or whole")
        number = _exact(value)
    elif (m := _NUMBER.match(value)) is not None:
        number = Fraction(m.group(1))
    if number is not None:
        if 0 < number <= 1:
            return MemPerCard.of_fraction(float(number))
        raise UnitError(
            f"{value!r}: a bare number is a fraction of a card in (0, 1]; "
            "for an amount give a unit (e.g. 24GiB)"
        )
    return MemPerCard.of_mib(parse_mem_mib(value))


def format_mib(mib: int | None) -> str:
    """`24576` -> `24.0 GiB`, `512` -> `512 MiB`; None -> `N/A`."""
    if mib is None:
        return "N/A"
    if abs(mib) >= 1024:
        return f"{mib / 1024:.1f} GiB"
    return f"{mib} MiB"
