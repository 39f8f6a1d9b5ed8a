"""Pydantic validation errors as one line each: file, line, field, plain English, closest key.

`convert_validation_error` picks the error that comes first in the file (an unknown key before
the missing key it was probably meant to be) and turns it into one `ConfigError` pointing at its
line. `describe_error` writes the message: the expected type with its bounds, the value found,
and for an unknown key the closest valid key of the model at that place.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import annotated_types
import pydantic

from gpuctl.config.document import KeyLines, Loc, error_at
from gpuctl.errors import ConfigError


def convert_validation_error(
    exc: pydantic.ValidationError,
    model: type[pydantic.BaseModel],
    *,
    path: Path | str,
    lines: KeyLines,
    error: type[ConfigError] = ConfigError,
) -> ConfigError:
    errors = exc.errors(include_url=False)

    def rank(item: tuple[int, Any]) -> tuple[float, int]:
        i, err = item
        line = float(_err_line(err, lines) or 0)
        if err["type"] == "missing":
            # `resource:` for `resources:` is both an unknown and a missing key: the unknown key,
            # with its "did you mean", is the better explanation, so it comes first.
            parent = tuple(err["loc"][:-1])
            typos = [
                _err_line(e, lines) or 0
                for e in errors
                if e["type"] == "extra_forbidden" and tuple(e["loc"][:-1]) == parent
            ]
            if typos:
                line = min(typos) + 0.5
        return line, i

    first = min(enumerate(errors), key=rank)[1]
    loc: Loc = tuple(first["loc"])
    message, hint = describe_error(first, model)
    if first["type"] == "missing":
        loc = loc[:-1]
    elif loc and loc[-1] == "[key]":
        loc = loc[:-1]
        message = f"key {message}"
    return error_at(error, path=path, lines=lines, loc=loc, message=message, hint=hint)


def _err_line(err: Mapping[str, Any], lines: KeyLines) -> int | None:
    loc = tuple(err["loc"])
    return lines.line(loc[:-1] if err["type"] == "missing" else loc)


_INT = {"int_type", "int_parsing", "int_from_float", "int_parsing_size"}
_FLOAT = {"float_type", "float_parsing", "finite_number"}
_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_SIMPLE = {
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "string_unicode": "must be a string",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "set_type": "must be a list",
    "frozen_set_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "dataclass_type": "must be a mapping",
    "none_required": "must be empty (null)",
}


def describe_error(
    err: Mapping[str, Any], model: type[pydantic.BaseModel]
) -> tuple[str, str | None]:
    """A plain-English message and an optional hint for one pydantic error."""
    typ = str(err["type"])
    loc = tuple(err["loc"])
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    value = err.get("input")
    if typ == "extra_forbidden":
        key = str(loc[-1])
        return f"unknown key {key!r}", _closest_key(key, _valid_keys(model, loc[:-1]))
    if typ == "missing":
        return f"missing required key {str(loc[-1])!r}", None
    if typ in _INT or typ in _FLOAT or typ in _RANGE:
        target, meta = _target(model, loc)
        if target is int or target is float:
            noun = "an integer" if target is int else "a number"
        else:
            noun = "an integer" if typ in _INT else "a number"
        if typ == "finite_number":
            noun = "a finite number"
        return f"must be {noun}{_bounds(meta)} (got {_show(value)})", None
    if typ in _SIMPLE:
        hint = None
        if typ == "string_type" and isinstance(value, bool | int | float):
            hint = "quote the value to make it a string"
        return f"{_SIMPLE[typ]} (got {_show(value)})", hint
    if typ in {"literal_error", "enum"}:
        return f"must be {ctx.get('expected')} (got {_show(value)})", None
    if typ == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')} (got {_show(value)})", None
    if typ in {"string_too_short", "too_short"}:
        if ctx.get("min_length") == 1:
            return "must not be empty", None
        unit = "characters" if typ == "string_too_short" else "items"
        return f"must have at least {ctx.get('min_length')} {unit}", None
    if typ in {"string_too_long", "too_long"}:
        unit = "characters" if typ == "string_too_long" else "items"
        return f"must have at most {ctx.get('max_length')} {unit}", None
    msg = str(err.get("msg", typ))
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :], None
    return msg, None


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _closest_key(key: str, valid: Sequence[str]) -> str | None:
    if not valid:
        return None
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(key.lower(), valid, n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]!r}?"
    return "valid keys: " + ", ".join(valid)


# --- finding the model field behind an error location -------------------------------------------


def _unwrap(tp: Any, meta: list[Any]) -> Any:
    """Strip Annotated (keeping its metadata) and Optional."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp, *extra = typing.get_args(tp)
            for item in extra:  # Field(ge=...) inside Annotated carries its constraints
                meta.extend(getattr(item, "metadata", None) or [item])
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _target(model: type[pydantic.BaseModel], loc: Sequence[str | int]) -> tuple[Any, list[Any]]:
    """The type at `loc` under `model` and the constraints on it; (None, []) when unknown."""
    tp: Any = model
    meta: list[Any] = []
    for part in loc:
        meta = []
        tp = _unwrap(tp, meta)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel) and isinstance(part, str):
            field = _field(tp, part)
            if field is None:
                return None, []
            tp = field.annotation
            meta = list(field.metadata)
        elif origin in (list, tuple, set, frozenset, Sequence) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif origin in (dict, Mapping):
            tp = typing.get_args(tp)[1]
        else:
            return None, []
    tp = _unwrap(tp, meta)
    return tp, meta


def _field(model: type[pydantic.BaseModel], key: str) -> pydantic.fields.FieldInfo | None:
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _valid_keys(model: type[pydantic.BaseModel], loc: Sequence[str | int]) -> list[str]:
    tp, _ = _target(model, loc)
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        return [f.alias or name for name, f in tp.model_fields.items()]
    return []


def _bounds(meta: Sequence[Any]) -> str:
    lo: object = None
    hi: object = None
    lo_strict = hi_strict = False
    for m in meta:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo, lo_strict = m.gt, True
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi, hi_strict = m.lt, True
    if lo is not None and hi is not None and not lo_strict and not hi_strict:
        return f" between {lo} and {hi}"
    parts = []
    if lo is not None:
        parts.append(f"greater than {lo}" if lo_strict else f"of {lo} or more")
    if hi is not None:
        parts.append(f"less than {hi}" if hi_strict else f"of {hi} or less")
    return (" " + " and ".join(parts)) if parts else ""
