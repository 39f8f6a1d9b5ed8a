"""Hostlist ranges through gpuctl's own functions (ClusterShell's NodeSet underneath): expansion
keeps zero padding and takes several ranges per name; folding writes the shortest list back;
bad ranges give one line naming them, and a huge range is refused before anything expands."""

from __future__ import annotations

import pytest

from gpuctl.config.hostlist import HostlistError, expand, fold


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu01", ("gpu01",)),
        ("gpu[01-03]", ("gpu01", "gpu02", "gpu03")),
        ("gpu[1-3]", ("gpu1", "gpu2", "gpu3")),
        ("gpu[08-11]", ("gpu08", "gpu09", "gpu10", "gpu11")),
        ("gpu[9-11]", ("gpu9", "gpu10", "gpu11")),
        ("n[1-3,7,10-12]", ("n1", "n2", "n3", "n7", "n10", "n11", "n12")),
        ("rack1-[001-002].lan", ("rack1-001.lan", "rack1-002.lan")),
        ("[1-2]x", ("1x", "2x")),
        ("10.0.1.[1-3]", ("10.0.1.1", "10.0.1.2", "10.0.1.3")),
        ("gpu[5]", ("gpu5",)),
        ("fe80::1", ("fe80::1",)),
        (
            "rack[1-2]-gpu[01-02]",
            ("rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"),
        ),
        ("gpu[1-3,2]", ("gpu1", "gpu2", "gpu3")),  # a name listed twice counts once
        ("gpu[1-7/3]", ("gpu1", "gpu4", "gpu7")),
        ("a[1-2],b01", ("a1", "a2", "b01")),
    ],
)
def test_ranges_expand_keeping_zero_padding(text: str, expected: tuple[str, ...]) -> None:
    assert expand(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu[]", "bad range []: each item must be N, N-M or N-M/STEP (got '')"),
        ("gpu[1,,2]", "bad range [1,,2]: each item must be N, N-M or N-M/STEP (got '')"),
        ("gpu[a-b]", "bad range [a-b]: each item must be N, N-M or N-M/STEP (got 'a-b')"),
        ("gpu[3-1]", "bad range [3-1]: 3 is after 1"),
        ("gpu[01-3]", "bad range [01-3]: 01 and 3 must have the same zero padding"),
        ("gpu]1-2[", "unbalanced '[' and ']' in 'gpu]1-2['"),
        ("gpu[1-2", "unbalanced '[' and ']' in 'gpu[1-2'"),
        ("gpu[[1]]", "unbalanced '[' and ']' in 'gpu[[1]]'"),
        ("gpu[1-10001]", "'gpu[1-10001]' expands to more than 10,000 names"),
        ("r[1-200]-g[1-51]", "'r[1-200]-g[1-51]' expands to more than 10,000 names"),
        ("a[1-5000],b[1-5001]", "'a[1-5000],b[1-5001]' expands to more than 10,000 names"),
    ],
)
def test_bad_ranges_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand(text)
    assert str(info.value) == message


def test_a_huge_range_is_refused_without_expanding_it() -> None:
    with pytest.raises(HostlistError, match="more than 10,000 names"):
        expand("gpu[0-999999999]-n[0-999999999]")


@pytest.mark.parametrize(
    ("names", "folded"),
    [
        (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
        (["gpu07", "gpu01", "gpu02"], "gpu[01-02,07]"),
        (["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"], "rack[1-2]-gpu[01-02]"),
        (["lab-01", "lab-02", "solo"], "lab-[01-02],solo"),
        ([], ""),
    ],
)
def test_node_lists_fold_to_the_shortest_hostlist(names: list[str], folded: str) -> None:
    assert fold(names) == folded
    if names:
        assert sorted(expand(folded)) == sorted(names)
