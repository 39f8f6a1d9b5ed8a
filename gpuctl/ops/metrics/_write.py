"""Writing exposition text fast: a run of samples of one family at a time, with no Python code
run per sample. Pure.

A 1,000-node × 8-GPU fleet has about 200,000 per-node, per-GPU and per-job samples;
prometheus_client's generator takes seconds over them, one f-string per sample about 100 ms
(`benchmarks/metrics_scrape.py`). Here a run's lines are a template, `prefix label-text suffix %a`
per sample, made in C once and kept while the run's label texts stay the same (they rarely
change); an exposition fills each run's template with its values in one `%` (C again), and keeps
a run's text while its values stay the same too. Everything is bytes: one join at the end, no
encoding of the whole page (a HELP text with a non-ASCII character made the whole text
UCS-2 before). The text is the Prometheus text format 0.0.4; `promtool check metrics` passes on
it (tests run it).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import re
from collections.abc import Iterable, Sequence

MIB = 1 << 20
LABELS_KEPT = 1 << 18  # label texts kept from one exposition to the next: they rarely change

Value = int | float | None


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@functools.lru_cache(maxsize=LABELS_KEPT)
def escape(value: str | int, limit: int = 128) -> str:
    """A label value as the text format quotes it. Values from node output are untrusted: no
    control characters, bounded length."""
    text = str(value)
    if len(text) <= limit and text.isascii() and text.isprintable():  # the usual case, fast
        if '"' not in text and "\\" not in text:
            return text
    else:
        text = _CONTROL.sub("", text)[:limit]  # newlines too: nothing left to escape there
    return text.replace("\\", "\\\\").replace('"', '\\"')


def label_text(pairs: Iterable[tuple[str, object]]) -> str:
    """`k1="v1",k2="v2"` (no braces)."""
    return ",".join(f'{k}="{escape(v)}"' for k, v in pairs)


def flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


@functools.lru_cache(maxsize=256)
def _header(name: str, help_text: str, kind: str) -> bytes:
    help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n".encode()


def header(name: str, help_text: str, kind: str, out: list[bytes]) -> None:
    """A family's HELP and TYPE lines (a counter's `name` ends in `_total`)."""
    out.append(_header(name, help_text, kind))


@dataclasses.dataclass(frozen=True, slots=True)
class _Run:
    """A run of samples of the last exposition: its label texts, their lines' template, the text
    it was written with, and its values when they were all ints (else none). Replaced whole,
    never changed: two expositions built at once each see one consistent run."""

    texts: tuple[str, ...]
    template: bytes
    values: tuple[Value, ...] = ()
    text: bytes = b""


# (prefix, suffix) -> that run, kept while its label texts stay the same (they rarely change; a
# run whose labels changed, a job that came or went, makes its template again), and its text
# while its values stay the same too (ECC, remapped rows, limits, flags: most columns of a card).
# About two expositions' size is kept.
_RUNS: dict[tuple[str, str], _Run] = {}
_RUNS_KEPT = 1024  # runs are named by the code's families: far fewer


def _template(prefix: str, suffix: str, texts: tuple[str, ...]) -> bytes:
    """`prefix text suffix %a\n` for each text, `%` escaped: made in C, with NUL as the value's
    place (label texts hold no control characters: `escape` removes them)."""
    lines = prefix + (suffix + "\0\n" + prefix).join(texts) + suffix + "\0\n"
    return lines.replace("%", "%%").replace("\0", "%a").encode()


def _lines(
    prefix: str, suffix: str, texts: Sequence[str], values: Sequence[Value], out: list[bytes]
) -> None:
    """`prefix texts[i] suffix values[i]` per sample, None: no sample (the hot path: no Python
    code runs per sample). `%a` writes an int or a float as `str` does (its repr), a flag as
    1/0 through `flag` or `column`."""
    if len(texts) != len(values):
        raise ValueError(f"{prefix}: {len(texts)} label texts for {len(values)} values")
    if None in values:
        keep = list(map(operator.is_not, values, itertools.repeat(None)))
        texts, values = (
            list(itertools.compress(texts, keep)),
            list(itertools.compress(values, keep)),
        )
    if not values:
        return
    slot, key, row = (prefix, suffix), tuple(texts), tuple(values)
    run = _RUNS.get(slot)
    if run is None or run.texts != key:
        if len(_RUNS) >= _RUNS_KEPT:
            _RUNS.clear()
        template = _template(prefix, suffix, key)
    elif run.values == row and _ints(row):
        out.append(run.text)
        return
    else:
        template = run.template
    text = template % row
    _RUNS[slot] = _Run(key, template, row if _ints(row) else (), text)
    out.append(text)


def _ints(row: tuple[Value, ...]) -> bool:
    """Equal ints print the same; equal numbers may not (1 and 1.0, -0.0 and 0.0)."""
    return set(map(type, row)) == {int}


def samples(name: str, heads: Sequence[str], values: Sequence[Value], out: list[bytes]) -> None:
    """`heads[i]` is a sample's `{labels} ` (its trailing space included); None: no sample.
    Values are ints or floats (a flag through `flag`): both print as Prometheus reads them."""
    _lines(name, "", heads, values, out)


def labelled(
    name: str, bases: Sequence[str], values: Sequence[Value], out: list[bytes], extra: str = ""
) -> None:
    """Samples `name{base,extra} value`."""
    _lines(name + "{", ("," + extra if extra else "") + "} ", bases, values, out)


def family(
    name: str,
    help_text: str,
    kind: str,
    bases: Sequence[str],
    values: Sequence[Value],
    out: list[bytes],
) -> None:
    """A family's HELP and TYPE lines and its samples `name{base} value`."""
    header(name, help_text, kind, out)
    labelled(name, bases, values, out)


_FLAG = {True: 1, False: 0}


def column(items: Sequence[object], attr: str, unit: str = "") -> list[Value]:
    """`attr` of each item (None stays None): as is, a flag as 0/1 (`flag`), MiB as bytes
    (`mib`), a percentage as a ratio (`pct`). In C where it can be: 8,000 GPUs × 25 columns."""
    values = map(operator.attrgetter(attr), items)
    if unit == "flag":
        return list(map(_FLAG.get, values))
    if unit == "mib":
        return [None if v is None else v * MIB for v in values]
    if unit == "pct":
        return [None if v is None else v / 100 for v in values]
    return list(values)


def verdict_columns(
    name: str,
    bases: Sequence[str],
    verdicts: Sequence[object],
    kinds: Sequence[object],
    label: str,
    out: list[bytes],
) -> None:
    """`name{base,label="kind"} 1` for the kind each base has, 0 for the others, one run of
    samples per kind in `kinds` order (enums by their value); a base whose verdict is None has
    none."""
    if None in verdicts:
        keep = list(map(operator.is_not, verdicts, itertools.repeat(None)))
        bases, verdicts = (
            list(itertools.compress(bases, keep)),
            list(itertools.compress(verdicts, keep)),
        )
    for kind in kinds:
        text = getattr(kind, "value", kind)
        ones = list(map(int, map(operator.eq, verdicts, itertools.repeat(kind))))
        labelled(name, bases, ones, out, f'{label}="{text}"')
