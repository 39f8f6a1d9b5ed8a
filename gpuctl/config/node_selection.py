"""Which nodes of the inventory a command means: hostlist patterns (`gpu[01-16]`, `lab-01 lab-03`)
and a label selector (`-l pool=train,zone!=b`, as kubectl's equality-based selectors), both
optional, both applied (a node must match a pattern and every requirement of the selector).

A plain name must be in the inventory (a typo is an error, not an empty match); a range keeps the
inventory's nodes among the names it expands to. Nothing matching at all is an error: a command
never acts on an empty set in silence. Nodes come in inventory order, each once.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from gpuctl.config.hostlist import HostlistError, expand, fold
from gpuctl.core.model import Inventory, NodeSpec
from gpuctl.errors import UsageError

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")
_REQUIREMENT = re.compile(r"^\s*(!?)\s*([^=!\s]+)\s*(?:(==|=|!=)\s*(\S*)\s*)?$")
_HINT = (
    "a selector is key=value, key!=value, key or !key, separated by commas: -l pool=train,zone!=b"
)


@dataclasses.dataclass(frozen=True, slots=True)
class Requirement:
    """One term of a label selector: `op` is `=`, `!=`, `exists` or `absent`."""

    key: str
    op: str
    value: str = ""

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "absent":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        return labels.get(self.key) != self.value  # kubectl: != also matches a missing key

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "absent":
            return f"!{self.key}"
        return f"{self.key}{self.op}{self.value}"


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """`pool=train,zone!=b` -> two requirements. Raises UsageError (exit 2) naming the term."""
    terms = text.split(",")
    if not text.strip():
        raise UsageError("empty label selector", hint=_HINT)
    out: list[Requirement] = []
    for term in terms:
        match = _REQUIREMENT.match(term)
        if match is None or (match.group(1) and match.group(3)):
            raise UsageError(
                f"bad label selector {text!r}: cannot read {term.strip()!r}", hint=_HINT
            )
        bang, key, op, value = match.groups()
        if not _KEY.match(key):
            raise UsageError(
                f"bad label selector {text!r}: {key!r} is not a label key (1-63 letters, "
                "digits, '.', '_', '/' or '-', starting with a letter or digit)",
                hint=_HINT,
            )
        if op is None:
            out.append(Requirement(key, "absent" if bang else "exists"))
        else:
            out.append(Requirement(key, "!=" if op == "!=" else "=", value))
    return tuple(out)


def select_nodes(
    inventory: Inventory, patterns: Sequence[str] = (), selector: str | None = None
) -> tuple[NodeSpec, ...]:
    """The inventory's nodes named by `patterns` (all when there are none) that match `selector`
    (every node when None). Raises UsageError (exit 2) on a bad pattern or selector, an unknown
    plain name, or when no node matches."""
    requirements = parse_selector(selector) if selector is not None else ()
    by_name = inventory.by_name()
    wanted: set[str] | None = None
    if patterns:
        wanted = set()
        for pattern in patterns:
            wanted.update(_names_of(pattern, by_name))
    nodes = tuple(
        n
        for n in inventory.nodes
        if (wanted is None or n.name in wanted)
        and all(r.matches(dict(n.labels)) for r in requirements)
    )
    if not nodes:
        what = []
        if patterns:
            what.append(" ".join(patterns))
        if requirements:
            what.append("-l " + ",".join(str(r) for r in requirements))
        raise UsageError(
            f"no node of the inventory matches {' '.join(what)}",
            hint=f"the inventory has {len(by_name)} node(s); see `gpuctl inventory list`",
        )
    return nodes


def _names_of(pattern: str, by_name: dict[str, NodeSpec]) -> list[str]:
    try:
        names = expand(pattern)
    except HostlistError as exc:
        raise UsageError(str(exc), hint="a node list is names and ranges: gpu[01-04,07]") from None
    if "[" not in pattern:  # names written out: each must be there
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise UsageError(
                f"unknown node {unknown[0]!r}",
                hint=f"the inventory has {len(by_name)} node(s); see `gpuctl inventory list`",
            )
        return list(names)
    found = [n for n in names if n in by_name]
    if not found:
        raise UsageError(
            f"no node of the inventory matches {fold(names)}",
            hint=f"the inventory has {len(by_name)} node(s); see `gpuctl inventory list`",
        )
    return found
