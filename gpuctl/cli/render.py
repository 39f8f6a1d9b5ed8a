"""Rendering helpers shared by commands: JSON/YAML documents, escape-safe text, the error line."""

from __future__ import annotations

import enum
import json
import re
import sys
from typing import Any

import typer

from gpuctl.core.timefmt import machine_times
from gpuctl.errors import UsageError

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


class Output(enum.StrEnum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"


OUTPUT_OPTION = typer.Option(
    Output.TABLE,
    "-o",
    "--output",
    help="Output format: table, wide, json or yaml.",
    case_sensitive=False,
)


def safe(text: object) -> str:
    """Node output is untrusted: strip terminal escape sequences and control characters."""
    return _ESCAPES.sub("", str(text))


def emit_document(doc: Any, fmt: Output) -> None:
    """Print exactly one JSON or YAML document on stdout; its times (keys `at`, `*_at`, `since`,
    `*_since`) as RFC 3339 UTC strings, durations (`*_s`) as numbers of seconds."""
    doc = machine_times(doc)
    if fmt is Output.JSON:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, allow_nan=False) + "\n")
    elif fmt is Output.YAML:
        import yaml

        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    else:  # pragma: no cover - callers render tables themselves
        raise UsageError(f"output format {fmt.value} is not a document format")
    sys.stdout.flush()


def fmt_opt(value: object, suffix: str = "", none: str = "N/A") -> str:
    return none if value is None else f"{value}{suffix}"
