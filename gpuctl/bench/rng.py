"""Seeded randomness for the replay.

The FGD artifact draws everything from one Go `math/rand` stream. A bit-exact port is not needed to
compare means over seeds: `NumpyRng` draws the same *kinds* of numbers, in the same order, from
numpy's PCG64. Any object with these four methods can be plugged in (for example a Go port, to
compare single seeds with the artifact).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Rng(Protocol):
    def discard(self, n: int) -> None:
        """Draw and drop `n` numbers (the artifact's incidental draws)."""

    def intn(self, n: int) -> int:
        """Uniform in [0, n)."""

    def shuffle(self, items: list[Any]) -> None:
        """Shuffle in place."""

    def perm(self, n: int) -> list[int]:
        """A random permutation of range(n)."""


class NumpyRng:
    def __init__(self, seed: int) -> None:
        self._gen = np.random.Generator(np.random.PCG64(seed))

    def discard(self, n: int) -> None:
        self._gen.integers(0, 2**63 - 1, size=n)

    def intn(self, n: int) -> int:
        return int(self._gen.integers(0, n))

    def shuffle(self, items: list[Any]) -> None:
        order = self._gen.permutation(len(items))
        items[:] = [items[i] for i in order]

    def perm(self, n: int) -> list[int]:
        return [int(i) for i in self._gen.permutation(n)]
