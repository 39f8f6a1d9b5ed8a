"""The YAML loader every gpuctl file format uses: line numbers kept, loud on bad input.

`load_document` reads one YAML file into a `Document`: plain data (a dict at the top) plus
`KeyLines`, the line of every key and list item. It refuses files over `MAX_FILE_BYTES`, duplicate
keys, anchor/alias bombs (more than `MAX_VALUES` values once aliases are expanded), nesting deeper
than `MAX_DEPTH`, recursive aliases, non-standard tags and top levels that are not a mapping.
Mapping keys are always strings, exactly as written (`on:` is the key "on", not True).

`validate_data` validates that data with a pydantic v2 model (configured `extra="forbid"`,
`frozen=True`) and turns the first error in the file into one `ConfigError` (or the subclass
passed in); `gpuctl.config.validation_errors` writes its message. `load_model` does both.
Loaders that check more than pydantic can (duplicates across files, references between sections)
point their own errors at a line with `Document.error` / `gpuctl.config.document.error_at`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from gpuctl.config.document import Document, KeyLines, Loc, format_loc
from gpuctl.config.validation_errors import convert_validation_error
from gpuctl.errors import ConfigError

# libyaml parses about 20 times faster than pure Python and caps nesting itself; both compose
# the same nodes, and `_Builder` does the rest.
try:
    from yaml import CSafeLoader as _Loader

    _BYTE_POSITIONS = True  # libyaml reports reader errors at byte offsets
except ImportError:  # pragma: no cover - PyYAML built without libyaml: same results, slower
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

    _BYTE_POSITIONS = False

M = TypeVar("M", bound=pydantic.BaseModel)

MAX_FILE_BYTES = 1 << 20  # 1 MiB: far beyond any hand-written inventory, job spec or playbook
MAX_VALUES = 100_000  # values after alias expansion: stops "billion laughs" documents
MAX_DEPTH = 64

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


# --- reading and parsing -------------------------------------------------------------------------


def load_document(
    path: Path,
    *,
    kind: str,
    error: type[ConfigError] = ConfigError,
    max_bytes: int = MAX_FILE_BYTES,
) -> Document:
    """Read and parse one YAML file. `kind` names it in messages ("inventory", "job spec")."""
    text = read_text(path, kind=kind, error=error, max_bytes=max_bytes)
    return parse_yaml(text, path=path, kind=kind, error=error)


def read_text(
    path: Path,
    *,
    kind: str,
    error: type[ConfigError] = ConfigError,
    max_bytes: int = MAX_FILE_BYTES,
) -> str:
    where = str(path)
    try:
        with path.open("rb") as fh:
            raw = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{kind} file not found", path=where) from None
    except IsADirectoryError:
        raise error(f"expected a {kind} file, found a folder", path=where) from None
    except OSError as exc:
        raise error(f"cannot read the {kind} file: {exc.strerror or exc}", path=where) from None
    if len(raw) > max_bytes:
        raise error(f"the {kind} file is larger than {_size(max_bytes)}", path=where)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error("not UTF-8 text", path=where, line=line) from None


def parse_yaml(
    text: str, *, path: Path | str, kind: str, error: type[ConfigError] = ConfigError
) -> Document:
    """Parse YAML text (named `path` in messages) into a `Document`."""
    where = str(path)
    try:
        data, lines = _parse(text, where, kind, error)
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, text, where, error) from None
    except yaml.reader.ReaderError as exc:
        if _BYTE_POSITIONS:
            line = text.encode()[: exc.position].count(b"\n") + 1
        else:
            line = text.count("\n", 0, exc.position) + 1
        message = f"invalid YAML: character U+{_codepoint(exc.character):04X} is not allowed"
        raise error(message, path=where, line=line) from None
    except yaml.YAMLError as exc:  # pragma: no cover - every PyYAML error above is marked
        raise error(f"invalid YAML: {exc}", path=where) from None
    except RecursionError:
        raise error(f"invalid YAML: nested deeper than {MAX_DEPTH} levels", path=where) from None
    return Document(path=Path(path), data=data, lines=KeyLines(lines))


def _parse(
    text: str, where: str, kind: str, error: type[ConfigError]
) -> tuple[dict[str, Any], dict[Loc, int]]:
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise error(f"the {kind} file is empty: expected a mapping of keys", path=where)
        if not isinstance(root, MappingNode):
            raise error(
                f"expected a mapping of keys at the top of the {kind} file, "
                f"found {_node_kind(root)}",
                path=where,
                line=_line(root),
            )
        builder = _Builder(loader, where, error)
        data = builder.build(root, (), 0)
        return data, builder.lines
    finally:
        loader.dispose()


_INDENT = ("expected <block end>", "mapping values are not allowed", "did not find expected")
_ALIAS = re.compile(r"\*([^\s,\[\]{}]+)")


def _syntax_error(
    exc: yaml.MarkedYAMLError, text: str, where: str, error: type[ConfigError]
) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    problem = ", ".join(p for p in (exc.context, exc.problem) if p and not p.startswith("while "))
    hint = None
    if any(s in problem for s in _INDENT):
        hint = "check the indentation of this line and the lines above it"
    if exc.context == "while scanning a quoted scalar" and exc.context_mark is not None:
        mark, problem = exc.context_mark, "a quoted string is never closed"
    if "maximum nesting depth" in problem:  # libyaml's own cap, past ours
        problem = f"nested deeper than {MAX_DEPTH} levels"
    if mark is None:  # pragma: no cover - PyYAML marks its parse errors
        return error(f"invalid YAML: {problem}", path=where, hint=hint)
    if problem.startswith("found undefined alias"):  # libyaml does not name it
        rows = text.splitlines()
        alias = _ALIAS.match(rows[mark.line][mark.column :]) if mark.line < len(rows) else None
        problem = f"found undefined alias {alias.group(1)!r}" if alias else problem
    message = f"invalid YAML at column {mark.column + 1}: {problem or 'unreadable'}"
    return error(message, path=where, line=mark.line + 1, hint=hint)


def _codepoint(character: object) -> int:
    return character if isinstance(character, int) else ord(str(character)[:1] or "\0")


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org") else tag


class _Builder:
    """Turns composed nodes into dicts, lists and scalars, recording lines and enforcing limits."""

    def __init__(self, loader: _Loader, where: str, error: type[ConfigError]) -> None:
        self.loader = loader
        self.where = where
        self.error = error
        self.lines: dict[Loc, int] = {}
        self.values = 0
        self.open: set[int] = set()  # collections being built: an alias back into one is a cycle

    def fail(self, node: Node, loc: Loc, message: str) -> ConfigError:
        return self.error(message, path=self.where, line=_line(node), field=format_loc(loc))

    def check(self, node: Node, loc: Loc, depth: int, n: int = 1) -> None:
        self.values += n
        if self.values > MAX_VALUES:
            message = f"more than {MAX_VALUES:,} values once aliases are expanded (an alias bomb?)"
            raise self.fail(node, loc, message)
        if depth > MAX_DEPTH:  # no field: its path would be as long as the nesting
            raise self.fail(node, (), f"nested deeper than {MAX_DEPTH} levels")
        if id(node) in self.open:
            raise self.fail(node, loc, "an alias refers to a value that contains it")
        if (isinstance(node, MappingNode) and node.tag != _MAP_TAG) or (
            isinstance(node, SequenceNode) and node.tag != _SEQ_TAG
        ):
            raise self.fail(node, loc, f"unsupported YAML tag {_short_tag(node.tag)!r}")

    def build(self, node: Node, loc: Loc, depth: int) -> Any:
        self.check(node, loc, depth)
        self.lines.setdefault(loc, _line(node))
        if isinstance(node, ScalarNode):
            return self.scalar(node, loc)
        self.open.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return [self.build(item, (*loc, i), depth + 1) for i, item in enumerate(node.value)]
            out: dict[str, Any] = {}
            for key, (key_node, value) in self.entries(node, loc, depth).items():
                key_loc = (*loc, key)
                self.lines[key_loc] = _line(key_node)
                out[key] = self.build(value, key_loc, depth + 1)
            return out
        finally:
            self.open.discard(id(node))

    def entries(self, node: Node, loc: Loc, depth: int) -> dict[str, tuple[Node, Node]]:
        """Keys of a mapping as written, then keys merged in with `<<:` (explicit keys win)."""
        explicit: dict[str, tuple[Node, Node]] = {}
        merged: dict[str, tuple[Node, Node]] = {}
        for key_node, value in node.value:
            self.check(key_node, loc, depth)
            if key_node.tag == _MERGE_TAG:
                items = value.value if isinstance(value, SequenceNode) else [value]
                for source in items:
                    if not isinstance(source, MappingNode):
                        message = "a merge key (<<) takes a mapping or a list of mappings"
                        raise self.fail(source, loc, message)
                    self.check(source, loc, depth + 1)
                    for k, item in self.entries(source, loc, depth + 1).items():
                        merged.setdefault(k, item)
                continue
            if not isinstance(key_node, ScalarNode):
                message = f"a key must be a plain string, not {_node_kind(key_node)}"
                raise self.fail(key_node, loc, message)
            key = str(key_node.value)
            if key in explicit:
                first = _line(explicit[key][0])
                message = f"duplicate key {key!r} (first at line {first})"
                raise self.fail(key_node, (*loc, key), message)
            explicit[key] = (key_node, value)
        for k, item in merged.items():
            explicit.setdefault(k, item)
        return explicit

    def scalar(self, node: ScalarNode, loc: Loc) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            problem = exc.problem or "cannot read this value"
            if "could not determine a constructor" in problem:
                problem = f"unsupported YAML tag {_short_tag(node.tag)!r}"
            raise self.fail(node, loc, problem) from None
        except (ValueError, OverflowError):  # e.g. an integer with more digits than Python reads
            raise self.fail(node, loc, "cannot read this value") from None


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _node_kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return "a single value"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


# --- validation ----------------------------------------------------------------------------------


def load_model(
    path: Path,
    model: type[M],
    *,
    kind: str,
    error: type[ConfigError] = ConfigError,
    max_bytes: int = MAX_FILE_BYTES,
) -> M:
    """Read one YAML file and validate it with `model`; every problem is one `error`."""
    doc = load_document(path, kind=kind, error=error, max_bytes=max_bytes)
    return validate_data(doc.data, model, path=doc.path, lines=doc.lines, error=error)


def validate_data(
    data: Any,
    model: type[M],
    *,
    path: Path | str,
    lines: KeyLines,
    error: type[ConfigError] = ConfigError,
) -> M:
    """Validate with `model`; the error that comes first in the file becomes one `error`."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise convert_validation_error(exc, model, path=path, lines=lines, error=error) from None
