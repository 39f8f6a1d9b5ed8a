"""Pure helpers for untrusted node text: strip escapes, read numbers and flags without raising."""

from __future__ import annotations

import math
import re
import unicodedata

MAX_STRING_CHARS = 256

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), DCS/SOS/PM/APC (ESC P/X/^/_ ... ST),
# two-byte escapes (ESC + one char), and the 8-bit CSI/OSC introducers.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[ -~]?"
    r"|[\x9b\x9d][0-?]*[ -/]*[@-~]?"
)
# Control (Cc), format (Cf: bidi overrides, zero-width), surrogate, line/paragraph separators.
_DROP_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

# Values nvidia-smi prints for "no value": unknown, silently.
_NOT_AVAILABLE = frozenset(
    {
        "",
        "n/a",
        "[n/a]",
        "not supported",
        "[not supported]",
        "[requested functionality has been deprecated]",
        "[not found]",
        "-",
    }
)


def clean(text: str, limit: int = MAX_STRING_CHARS) -> str:
    """Untrusted text made safe to keep and display: no escape sequences, no control characters."""
    text = text[: limit * 4]
    if text.isascii() and text.isprintable():  # nearly every cell: nothing to strip out
        return text.strip()[:limit]
    text = _ESCAPES.sub("", text)
    kept = "".join(c for c in text if unicodedata.category(c) not in _DROP_CATEGORIES)
    return kept.strip()[:limit]


def quote_value(raw: str) -> str:
    """A short, clean rendering of a bad value for a note."""
    return repr(clean(raw, 40))


def is_not_available(raw: str) -> bool:
    return raw.strip().lower() in _NOT_AVAILABLE


def bracket_error(raw: str) -> str | None:
    """`[GPU is lost]`, `[Unknown Error]`, … : nvidia-smi's per-field errors (not plain N/A)."""
    s = raw.strip()
    if len(s) >= 2 and s[0] == "[" and s[-1] == "]" and not is_not_available(s):
        return clean(s, 80)
    return None


_NUMBER = re.compile(r"([-+]?[0-9]{1,18}(?:\.[0-9]{1,12})?)\s*([A-Za-z%]{1,4})?")


def split_unit(raw: str) -> tuple[float, str | None] | None:
    """`"81559 MiB"` -> (81559.0, "MiB"); `"41"` -> (41.0, None); anything else -> None."""
    match = _NUMBER.fullmatch(raw.strip())
    if match is None:
        return None
    value = float(match.group(1))
    if not math.isfinite(value):
        return None
    return value, match.group(2)


_TRUE = frozenset({"enabled", "yes", "active", "true", "on"})
_FALSE = frozenset({"disabled", "no", "not active", "false", "off"})


def parse_flag(raw: str) -> bool | None:
    """Enabled/Disabled, Yes/No, Active/Not Active -> bool; anything else -> None."""
    s = raw.strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    return None


def split_lines(text: str) -> list[str]:
    """Split on \\n only (str.splitlines would also split on \\x1c, \\x85, \\u2028, …)."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
