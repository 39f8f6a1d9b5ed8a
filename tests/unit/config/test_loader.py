"""The shared YAML loader: lines kept, hostile YAML refused, pydantic errors made readable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from gpuctl.config.document import KeyLines, error_at, format_loc
from gpuctl.config.loader import (
    load_document,
    load_model,
    parse_yaml,
    validate_data,
)
from gpuctl.errors import ConfigError, ExitCode, JobSpecError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Node(_Strict):
    name: str
    host: str | None = None
    port: int = Field(22, ge=1, le=65535)
    gpus: int | None = Field(None, ge=0)
    timeout_s: float = Field(5.0, gt=0, allow_inf_nan=False)
    transport: Literal["ssh", "local"] = "ssh"
    labels: dict[str, str] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    jump_port: Annotated[int, Field(ge=1, le=65535)] | None = None


class Fleet(_Strict):
    nodes: list[Node]


def _error(text: str, model: type[BaseModel] = Fleet) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        doc = parse_yaml(text, path="fleet.yaml", kind="test")
        validate_data(doc.data, model, path=doc.path, lines=doc.lines)
    return info.value


def _line(text: str) -> str:
    err = _error(text)
    return str(err) if err.hint is None else f"{err} | hint: {err.hint}"


# --- lines -------------------------------------------------------------------------------------


def test_lines_of_keys_and_list_items_are_recorded() -> None:
    doc = parse_yaml(
        "# comment\nnodes:\n  - name: a\n    port: 22\n\n  - name: b\n    labels:\n      x: y\n",
        path="f.yaml",
        kind="test",
    )
    assert doc.data == {"nodes": [{"name": "a", "port": 22}, {"name": "b", "labels": {"x": "y"}}]}
    assert doc.lines.line(()) == 2
    assert doc.lines.line(("nodes",)) == 2
    assert doc.lines.line(("nodes", 0)) == 3
    assert doc.lines.line(("nodes", 0, "port")) == 4
    assert doc.lines.line(("nodes", 1)) == 6
    assert doc.lines.line(("nodes", 1, "labels", "x")) == 8
    # a location the document lacks falls back to its nearest ancestor
    assert doc.lines.line(("nodes", 1, "host")) == 6
    assert doc.lines.exact(("nodes", 1, "host")) is None
    assert doc.where(("nodes", 1)) == "f.yaml:6"


def test_keys_stay_strings_as_written() -> None:
    doc = parse_yaml("on: 1\n22: x\nnull: y\n", path="f.yaml", kind="test")
    assert doc.data == {"on": 1, "22": "x", "null": "y"}


def test_merge_keys_are_expanded_and_explicit_keys_win() -> None:
    doc = parse_yaml(
        "base: &b {port: 2222, user: ops}\nnode:\n  <<: *b\n  port: 22\n", path="f", kind="test"
    )
    assert doc.data["node"] == {"port": 22, "user": "ops"}
    assert doc.lines.line(("node", "user")) == 1  # where the merged key was written


def test_format_loc_renders_dotted_paths() -> None:
    assert format_loc(("nodes", 3, "port")) == "nodes[3].port"
    assert format_loc(("labels", "gpuctl.io/pool")) == "labels['gpuctl.io/pool']"
    assert format_loc(()) == ""


def test_error_at_points_semantic_errors_at_a_line() -> None:
    lines = KeyLines({(): 1, ("nodes",): 1, ("nodes", 1): 4, ("nodes", 1, "name"): 4})
    err = error_at(
        JobSpecError, path="a.yaml", lines=lines, loc=("nodes", 1, "name"), message="taken"
    )
    assert isinstance(err, JobSpecError)
    assert str(err) == "a.yaml:4: nodes[1].name: taken"
    assert (err.path, err.line, err.field) == ("a.yaml", 4, "nodes[1].name")


# --- pydantic errors -----------------------------------------------------------------------------


def test_unknown_key_names_the_closest_valid_key() -> None:
    err = _error("nodes:\n  - name: a\n    hots: x\n")
    assert str(err) == "fleet.yaml:3: nodes[0].hots: unknown key 'hots'"
    assert err.hint == "did you mean 'host'?"
    assert (err.path, err.line, err.field) == ("fleet.yaml", 3, "nodes[0].hots")
    assert err.exit_code == ExitCode.USAGE


def test_unknown_key_without_a_close_match_lists_the_valid_keys() -> None:
    assert _line("zzz: 1\nnodes: []\n") == (
        "fleet.yaml:1: zzz: unknown key 'zzz' | hint: valid keys: nodes"
    )


def test_missing_key_points_at_its_parent_mapping() -> None:
    assert _line("nodes:\n  - name: a\n  - host: b\n") == (
        "fleet.yaml:3: nodes[1]: missing required key 'name'"
    )


def test_an_unknown_key_beside_a_missing_one_is_reported_first_with_its_hint() -> None:
    # `other:` for `nodes:`: the typo explains the missing key, so it is the error shown.
    assert _line("# nothing\nother: 1\n") == (
        "fleet.yaml:2: other: unknown key 'other' | hint: valid keys: nodes"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("70000", "must be an integer between 1 and 65535 (got 70000)"),
        ("0", "must be an integer between 1 and 65535 (got 0)"),
        ("'22'", "must be an integer between 1 and 65535 (got '22')"),
        ("true", "must be an integer between 1 and 65535 (got true)"),
        ("2.5", "must be an integer between 1 and 65535 (got 2.5)"),
    ],
)
def test_bad_port_says_what_a_port_is(value: str, message: str) -> None:
    assert _line(f"nodes:\n  - name: a\n    port: {value}\n") == (
        f"fleet.yaml:3: nodes[0].port: {message}"
    )


def test_constraints_inside_annotated_aliases_are_reported() -> None:
    assert _line("nodes:\n  - name: a\n    jump_port: -1\n") == (
        "fleet.yaml:3: nodes[0].jump_port: must be an integer between 1 and 65535 (got -1)"
    )


def test_other_value_errors_are_plain_english() -> None:
    head = "nodes:\n  - name: a\n    "
    assert _line(head + "gpus: -1\n") == (
        "fleet.yaml:3: nodes[0].gpus: must be an integer of 0 or more (got -1)"
    )
    assert _line(head + "timeout_s: 0\n") == (
        "fleet.yaml:3: nodes[0].timeout_s: must be a number greater than 0 (got 0)"
    )
    assert _line(head + "timeout_s: .inf\n") == (
        "fleet.yaml:3: nodes[0].timeout_s: must be a finite number greater than 0 (got inf)"
    )
    assert _line(head + "transport: ftp\n") == (
        "fleet.yaml:3: nodes[0].transport: must be 'ssh' or 'local' (got 'ftp')"
    )
    assert _line(head + "labels: {rack: 1}\n") == (
        "fleet.yaml:3: nodes[0].labels.rack: must be a string (got 1)"
        " | hint: quote the value to make it a string"
    )
    assert _line(head + "tags: a\n") == "fleet.yaml:3: nodes[0].tags: must be a list (got 'a')"
    assert _line(head + "tags:\n      - a\n      - [b]\n") == (
        "fleet.yaml:5: nodes[0].tags[1]: must be a string (got a list)"
    )
    assert _line("nodes: {a: 1}\n") == "fleet.yaml:1: nodes: must be a list (got a mapping)"


def test_the_error_reported_is_the_first_in_the_file() -> None:
    # pydantic checks `name` before `port`; the reader fixes the file top to bottom
    text = "nodes:\n  - port: 0\n    labels: {a: 1}\n    name: 7\n"
    assert (
        _line(text) == "fleet.yaml:2: nodes[0].port: must be an integer between 1 and 65535 (got 0)"
    )


def test_error_class_passed_in_is_raised() -> None:
    doc = parse_yaml("nodes: 1\n", path="j.yaml", kind="job spec", error=JobSpecError)
    with pytest.raises(JobSpecError, match=r"^j\.yaml:1: nodes: must be a list \(got 1\)$"):
        validate_data(doc.data, Fleet, path=doc.path, lines=doc.lines, error=JobSpecError)


# --- hostile or broken YAML ------------------------------------------------------------------


TOP = "expected a mapping of keys at the top of the test file"
CYCLE = "an alias refers to a value that contains it"
EMPTY = "fleet.yaml: the test file is empty: expected a mapping of keys"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "nodes:\n  - name: a\n    name: b\n",
            "3: nodes[0].name: duplicate key 'name' (first at line 2)",
        ),
        ("", EMPTY),
        ("# only a comment\n", EMPTY),
        ("- a\n- b\n", f"1: {TOP}, found a list"),
        ("just text\n", f"1: {TOP}, found a single value"),
        ("a: &a [*a]\n", f"1: a[0]: {CYCLE}"),
        ("a: &a\n  b: *a\n", f"1: a.b: {CYCLE}"),
        ("a: &a {<<: *a}\n", f"1: a: {CYCLE}"),
        ("nodes: !foo [1]\n", "1: nodes: unsupported YAML tag '!foo'"),
        (
            "x: !!python/object:os.system a\n",
            "1: x: unsupported YAML tag '!!python/object:os.system'",
        ),
        ("nodes: !!set {a: null}\n", "1: nodes: unsupported YAML tag '!!set'"),
        ("? [a]\n: 1\n", "1: a key must be a plain string, not a list"),
        ("a: 1\n<<: [1]\n", "2: a merge key (<<) takes a mapping or a list of mappings"),
        ("nodes: " + "1" * 5000 + "\n", "1: nodes: cannot read this value"),
        (
            "a: []\n---\na: []\n",
            "2: invalid YAML at column 1: "
            "expected a single document in the stream, but found another document",
        ),
        ("nodes: *x\n", "1: invalid YAML at column 8: found undefined alias 'x'"),
        ("nodes: \x07\n", "1: invalid YAML: character U+0007 is not allowed"),
        ("a: é\nb: é\nc: \x07\n", "3: invalid YAML: character U+0007 is not allowed"),
        ("a: [" * 70 + "]" * 70 + "\n", "1: nested deeper than 64 levels"),
    ],
)
def test_hostile_or_broken_yaml_is_one_clear_error(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, path="fleet.yaml", kind="test")
    assert str(info.value) == (expected if expected == EMPTY else f"fleet.yaml:{expected}")


def test_syntax_error_gives_line_column_and_an_indentation_hint() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("nodes:\n  - name: a\n   port: 2\n", path="f.yaml", kind="test")
    # the problem's wording is libyaml's (PyYAML's own parser words it differently)
    assert str(info.value).startswith("f.yaml:3: invalid YAML at column 4: ")
    assert info.value.line == 3
    assert info.value.hint == "check the indentation of this line and the lines above it"


def test_an_unclosed_quote_points_at_where_it_opens() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml('nodes:\n  - name: "gpu01\n    host: x\n', path="f.yaml", kind="test")
    assert str(info.value) == "f.yaml:2: invalid YAML at column 11: a quoted string is never closed"


def test_alias_bomb_is_refused_before_it_expands() -> None:
    rows = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        rows.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    with pytest.raises(ConfigError) as info:
        parse_yaml("\n".join(rows) + "\n", path="bomb.yaml", kind="test")
    assert "more than 100,000 values once aliases are expanded (an alias bomb?)" in str(info.value)
    assert str(info.value).startswith("bomb.yaml:")


def test_deeply_nested_flow_collections_are_refused_without_a_traceback() -> None:
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: " + "[" * 20000 + "]" * 20000 + "\n", path="deep.yaml", kind="test")
    assert str(info.value).endswith(": nested deeper than 64 levels")


# --- files -------------------------------------------------------------------------------------


def test_load_model_reads_and_validates_a_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("nodes:\n  - name: a\n    port: 2222\n    labels: {rack: r1}\n")
    fleet = load_model(path, Fleet, kind="fleet")
    assert fleet == Fleet(nodes=[Node(name="a", port=2222, labels={"rack": "r1"})])


def test_files_that_cannot_be_read_are_one_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: fleet file not found$"):
        load_document(missing, kind="fleet")
    with pytest.raises(ConfigError, match=r": expected a fleet file, found a folder$"):
        load_document(tmp_path, kind="fleet")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"a: 1\nb: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"bin\.yaml:2: not UTF-8 text$"):
        load_document(binary, kind="fleet")


def test_files_over_the_size_limit_are_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * 2000 + "\n")
    with pytest.raises(ConfigError, match=r"big\.yaml: the fleet file is larger than 1,000 bytes$"):
        load_document(big, kind="fleet", max_bytes=1000)
    huge = tmp_path / "huge.yaml"
    huge.write_text("a: " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match=r"huge\.yaml: the fleet file is larger than 1 MiB$"):
        load_document(huge, kind="fleet")


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbfnodes: []\n")
    assert load_document(path, kind="fleet").data == {"nodes": []}


def test_pure_python_yaml_gives_the_same_document_and_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without libyaml the loader falls back to PyYAML's own parser: same data, lines, limits."""
    import yaml

    from gpuctl.config import loader

    text = "base: &b {port: 2}\nnodes:\n  - <<: *b\n    name: a\n    labels: {on: yes}\n"
    fast = parse_yaml(text, path="f", kind="test")
    monkeypatch.setattr(loader, "_Loader", yaml.SafeLoader)
    monkeypatch.setattr(loader, "_BYTE_POSITIONS", False)
    slow = parse_yaml(text, path="f", kind="test")
    assert (
        slow.data
        == fast.data
        == {
            "base": {"port": 2},
            "nodes": [{"name": "a", "labels": {"on": True}, "port": 2}],
        }
    )
    assert all(
        slow.lines.exact(loc) == fast.lines.exact(loc)
        for loc in [("nodes", 0), ("nodes", 0, "labels", "on"), ("nodes", 0, "port")]
    )
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: " + "[" * 5000 + "]" * 5000 + "\n", path="deep.yaml", kind="test")
    assert str(info.value) == "deep.yaml: invalid YAML: nested deeper than 64 levels"
    with pytest.raises(ConfigError, match=r"^f:3: invalid YAML: character U\+0007 is not allowed$"):
        parse_yaml("a: é\nb: é\nc: \x07\n", path="f", kind="test")
