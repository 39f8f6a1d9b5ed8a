"""Hostlist ranges, `gpu[01-16]` and `rack[1-2]-gpu[01-04]`: expanded and folded by ClusterShell's
NodeSet, the one module of gpuctl that imports ClusterShell.

`expand` checks what it is given first (balanced brackets, items `N`, `N-M` or `N-M/STEP`, low
before high, at most `limit` names, counted before anything is expanded) so that a mistake reads
as one line naming the range; `fold` writes a list of names back as the shortest hostlist
(`gpu[01-04,07]`). NodeSet runs without node groups (`@name` is not looked up in any file).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

MAX_EXPANSION = 10_000  # names one value may expand to

_ITEM = re.compile(r"^(\d{1,9})(?:-(\d{1,9})(?:/(\d{1,9}))?)?$")
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_PLAIN = re.compile(r"^[^\[\],!&^@\s]*$")


class HostlistError(ValueError):
    """A value that is not a valid hostlist; the message is one line naming it."""


def expand(text: str, *, limit: int = MAX_EXPANSION) -> tuple[str, ...]:
    """`gpu[01-03]` -> gpu01, gpu02, gpu03; `r[1-2]-n[1-2]` -> r1-n1, r1-n2, r2-n1, r2-n2;
    `a,b[1-2]` -> a, b1, b2; a plain name -> itself. The width of a bound as written sets the zero
    padding; names come sorted as NodeSet sorts them (by prefix, then numerically), each once.
    Raises HostlistError."""
    if _PLAIN.match(text):
        return (text,)
    _check(text, limit)
    try:
        names = tuple(NodeSet(text, resolver=RESOLVER_NOGROUP))
    except NodeSetException as exc:
        raise HostlistError(f"bad hostlist {text!r}: {_reason(exc)}") from None
    if not names:
        raise HostlistError(f"the hostlist {text!r} names no node")
    return names


def fold(names: Iterable[str]) -> str:
    """The names as one hostlist, ranges folded: gpu01, gpu02, gpu03, gpu07 -> `gpu[01-03,07]`
    (an empty list: the empty string)."""
    listed = list(names)
    if not listed:
        return ""
    try:
        return str(NodeSet.fromlist(listed, resolver=RESOLVER_NOGROUP))
    except NodeSetException:  # a name NodeSet cannot read: leave the list as it is
        return ",".join(listed)


def _check(text: str, limit: int) -> None:
    depth = 0
    for ch in text:
        depth += 1 if ch == "[" else -1 if ch == "]" else 0
        if depth not in (0, 1):
            raise HostlistError(f"unbalanced '[' and ']' in {text!r}")
    if depth:
        raise HostlistError(f"unbalanced '[' and ']' in {text!r}")
    total = 0
    for part in re.split(r",(?![^\[]*\])", text):  # the commas outside brackets
        count = 1
        for body in _BRACKET.findall(part):
            count *= _count(body)
        total += count
        if total > limit:
            raise HostlistError(f"{text!r} expands to more than {limit:,} names")


def _count(body: str) -> int:
    """How many values `[body]` holds (an upper bound when items overlap)."""
    n = 0
    for item in body.split(","):
        match = _ITEM.match(item)
        if match is None:
            raise HostlistError(
                f"bad range [{body}]: each item must be N, N-M or N-M/STEP (got {item!r})"
            )
        lo_text, hi_text, step = match.group(1), match.group(2), match.group(3)
        lo, hi = int(lo_text), int(hi_text or lo_text)
        if hi < lo:
            raise HostlistError(f"bad range [{body}]: {lo_text} is after {hi_text}")
        if hi_text and len(lo_text) != len(hi_text) and lo_text[:1] == "0" and len(lo_text) > 1:
            raise HostlistError(
                f"bad range [{body}]: {lo_text} and {hi_text} must have the same zero padding"
            )
        if step is not None and int(step) < 1:
            raise HostlistError(f"bad range [{body}]: the step must be 1 or more")
        n += (hi - lo) // int(step or 1) + 1
    return n


def _reason(exc: NodeSetException) -> str:
    text = str(exc).replace('"', "'").strip()
    return " ".join(text.split()) or type(exc).__name__
