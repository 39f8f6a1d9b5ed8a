"""A YAML document once read, and how to point at a place in it.

`Document` is one file's top-level mapping plus `KeyLines`, the line of every key and list item,
by location (a tuple of keys and list indexes, as in pydantic errors). `format_loc` writes a
location as a dotted field path (`nodes[3].port`); `error_at` and `Document.error` build a
`ConfigError` that names the file, the line and the field. The loader fills these in; loaders
that check more than pydantic can point their own errors at a line with them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuctl.errors import ConfigError

Loc = tuple[str | int, ...]

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class KeyLines:
    """Line numbers (1-based) of a document's keys and list items, by location.

    A location is a tuple of keys and list indexes, as in pydantic errors: `("nodes", 3, "port")`
    is the line of `port:` in the fourth node; `("nodes", 3)` the line where that node starts;
    `()` the line where the document starts.
    """

    __slots__ = ("_lines",)

    def __init__(self, lines: Mapping[Loc, int] | None = None) -> None:
        self._lines: dict[Loc, int] = dict(lines or {})

    def line(self, loc: Sequence[str | int] = ()) -> int | None:
        """The line of `loc`, or of its nearest ancestor the document has (a missing key's
        line is its parent mapping's)."""
        key = tuple(loc)
        while True:
            found = self._lines.get(key)
            if found is not None or not key:
                return found
            key = key[:-1]

    def exact(self, loc: Sequence[str | int]) -> int | None:
        """The line of `loc` itself, or None when the document does not have it."""
        return self._lines.get(tuple(loc))

    def __len__(self) -> int:
        return len(self._lines)

    def __repr__(self) -> str:
        return f"KeyLines({len(self._lines)} locations)"


def format_loc(loc: Sequence[str | int]) -> str:
    """`("nodes", 3, "port")` -> `nodes[3].port`; odd keys are quoted: `labels['a.b/c']`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def error_at(
    error: type[ConfigError],
    *,
    path: Path | str,
    lines: KeyLines,
    loc: Sequence[str | int],
    message: str,
    hint: str | None = None,
    field: str | None = None,
) -> ConfigError:
    """An error pointing at `loc` in a document: `path:line: field: message`."""
    return error(
        message,
        path=str(path),
        line=lines.line(loc),
        field=format_loc(loc) if field is None else field,
        hint=hint,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Document:
    """One YAML file, read: its top-level mapping and the lines of its keys."""

    path: Path
    data: dict[str, Any]
    lines: KeyLines

    def where(self, loc: Sequence[str | int] = ()) -> str:
        """`path:line` of `loc`, for records such as `NodeSpec.source`."""
        line = self.lines.line(loc)
        return str(self.path) if line is None else f"{self.path}:{line}"

    def error(
        self,
        loc: Sequence[str | int],
        message: str,
        *,
        hint: str | None = None,
        error: type[ConfigError] = ConfigError,
    ) -> ConfigError:
        return error_at(
            error, path=self.path, lines=self.lines, loc=loc, message=message, hint=hint
        )
