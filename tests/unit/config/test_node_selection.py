"""Which nodes a command means: names, hostlist ranges and kubectl-like label selectors over the
inventory; nothing matching, a typo'd name or a bad selector is a usage error (exit 2)."""

from __future__ import annotations

import pytest

from gpuctl.config.node_selection import parse_selector, select_nodes
from gpuctl.core.model import Inventory, NodeSpec
from gpuctl.errors import ExitCode, UsageError

LABELS = {
    "gpu01": {"pool": "train", "zone": "a"},
    "gpu02": {"pool": "train", "zone": "b"},
    "gpu03": {"pool": "infer", "zone": "a"},
    "gpu07": {"pool": "train"},
    "login01": {},
}
INVENTORY = Inventory(
    nodes=tuple(NodeSpec(name=n, host=n, labels=labels) for n, labels in LABELS.items())
)


def names(*patterns: str, selector: str | None = None) -> list[str]:
    return [n.name for n in select_nodes(INVENTORY, patterns, selector)]


def test_no_pattern_and_no_selector_is_every_node_in_inventory_order() -> None:
    assert names() == list(LABELS)


def test_ranges_keep_the_inventory_nodes_they_name() -> None:
    assert names("gpu[01-16]") == ["gpu01", "gpu02", "gpu03", "gpu07"]
    assert names("gpu[02,07]", "login01") == ["gpu02", "gpu07", "login01"]
    assert names("gpu01,gpu03") == ["gpu01", "gpu03"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("pool=train", ["gpu01", "gpu02", "gpu07"]),
        ("pool==train", ["gpu01", "gpu02", "gpu07"]),
        ("pool=train,zone!=b", ["gpu01", "gpu07"]),  # != matches a missing key, as kubectl's
        ("zone", ["gpu01", "gpu02", "gpu03"]),
        ("!zone", ["gpu07", "login01"]),
        (" pool = infer ", ["gpu03"]),
    ],
)
def test_label_selectors_match_like_kubectl(selector: str, expected: list[str]) -> None:
    assert names(selector=selector) == expected


def test_a_range_and_a_selector_both_apply() -> None:
    assert names("gpu[01-03]", selector="zone=a") == ["gpu01", "gpu03"]


@pytest.mark.parametrize(
    ("patterns", "selector", "message"),
    [
        (("gpu09",), None, "unknown node 'gpu09'"),
        (("gpu01,gpu09",), None, "unknown node 'gpu09'"),
        (("gpu[10-12]",), None, "no node of the inventory matches gpu[10-12]"),
        ((), "pool=nope", "no node of the inventory matches -l pool=nope"),
        (("gpu03",), "pool=train", "no node of the inventory matches gpu03 -l pool=train"),
        (("gpu[3-1]",), None, "bad range [3-1]: 3 is after 1"),
        ((), "pool=train,", "bad label selector 'pool=train,': cannot read ''"),
        ((), "!pool=a", "bad label selector '!pool=a': cannot read '!pool=a'"),
        ((), "", "empty label selector"),
    ],
)
def test_nothing_matching_or_bad_input_is_one_usage_error(
    patterns: tuple[str, ...], selector: str | None, message: str
) -> None:
    with pytest.raises(UsageError) as info:
        select_nodes(INVENTORY, patterns, selector)
    assert str(info.value) == message
    assert info.value.exit_code == ExitCode.USAGE


def test_a_selector_reads_as_its_requirements() -> None:
    assert [str(r) for r in parse_selector("pool=train,zone!=b,gpu,!spot")] == [
        "pool=train",
        "zone!=b",
        "gpu",
        "!spot",
    ]
