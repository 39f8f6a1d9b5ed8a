"""Node output is untrusted: the probe parser never raises and never lets control bytes through."""

from __future__ import annotations

import dataclasses
import unicodedata
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuctl.adapters.probe import MAX_PROBE_BYTES, parse_probe, parse_xid_line
from gpuctl.adapters.probe.script import frame_probe_output
from gpuctl.adapters.probe.text import MAX_STRING_CHARS, clean
from gpuctl.core.model import Observation

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"

GPU_CSV = (
    b"index, uuid, name, pci.bus_id, driver_version, memory.total [MiB], memory.used [MiB], "
    b"utilization.gpu [%], temperature.gpu, power.draw [W], power.limit [W], ecc.mode.current, "
    b"ecc.errors.corrected.volatile.total, ecc.errors.uncorrected.volatile.total\n"
    b"0, GPU-0a, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 590.48.01, 81559, 20480, 97, 61, "
    b"612.33, 700.00, Enabled, 12, 0\n"
    b"1, GPU-1b, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 590.48.01, 81559, 0, 0, 41, "
    b"69.85, 700.00, Enabled, 0, 3\n"
)
APPS_CSV = (
    b"gpu_uuid, pid, used_gpu_memory [MiB], process_name\n"
    b"GPU-0a, 4242, 10240, python\nGPU-0a, 4343, 10240, torchrun\n"
)
XID = (
    b"source=dmesg\n"
    b"[  811.100000] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, SM Warp Exception\n"
    b"[  912.200000] NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', GPU has fallen off the bus.\n"
)
FULL = frame_probe_output(
    [
        ("facts", b"hostname=n1\nclock_s=1784016758\ncpu_count=64\n", b"", 0),
        ("gpu", GPU_CSV, b"", 0),
        ("apps", APPS_CSV, b"", 0),
        ("version", b"DRIVER version      : 590.48.01\nCUDA Version        : 13.1\n", b"", 0),
        ("xid", XID, b"", 0),
    ],
    marker="5eed",
)

_BAD_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings_in(v)]
    return []


def assert_sane(obs: Observation) -> None:
    assert isinstance(obs, Observation)
    for text in strings_in(dataclasses.asdict(obs)):
        bad = [c for c in text if unicodedata.category(c) in _BAD_CATEGORIES]
        assert not bad, f"control characters {bad!r} in {text!r}"
    assert not any("gpuctl bug" in note for note in obs.notes), obs.notes


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096), st.one_of(st.none(), st.integers(-300, 300)))
def test_arbitrary_bytes_never_raise(data: bytes, code: int | None) -> None:
    obs = parse_probe(data, code)
    assert_sane(obs)
    assert not obs.nvml_ok  # random bytes carry no probe header


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [",", ", ", "\n", "[N/A]", "[Not Supported]", "N/A", "[GPU is lost]", "0", "81559",
             "-1", "1e309", "nan", "99999999999999999999999", "12.5 W", "index", "uuid",
             "memory.used [MiB]", "temperature.gpu", "Enabled", "Active", "\x1b[2J", "\x1b]0;x\x07",
             "\u202e", "\x00", "\xff", "\r", " "]
        ),
        max_size=80,
    ),
    st.sampled_from(["gpu", "gpu-health", "apps", "facts", "xid", "version"]),
)  # fmt: skip
def test_structured_garbage_in_any_section_never_raises(tokens: list[str], section: str) -> None:
    body = "".join(tokens).encode("utf-8", errors="surrogateescape")
    header = b"index, uuid, memory.used [MiB], temperature.gpu\n" if section == "gpu" else b""
    out = frame_probe_output([("gpu", GPU_CSV, b"", 0), (section, header + body, b"", 0)])
    assert_sane(parse_probe(out, 0))


def _values(obs: Observation) -> tuple[dict[int, dict[str, Any]], set[Any], set[Any]]:
    gpus = {g.index: dataclasses.asdict(g) for g in obs.gpus}
    return gpus, set(obs.processes), set(obs.xids)


def test_truncation_at_every_byte_never_invents_a_value() -> None:
    full_gpus, full_procs, full_xids = _values(parse_probe(FULL, 0))
    assert len(full_gpus) == 2 and len(full_procs) == 2 and len(full_xids) == 2
    for cut in range(len(FULL)):
        obs = parse_probe(FULL[:cut], None)
        assert_sane(obs)
        gpus, procs, xids = _values(obs)
        for index, fields in gpus.items():
            for name, value in fields.items():
                assert value is None or value == full_gpus[index][name], (cut, index, name)
        assert procs <= full_procs, cut
        assert xids <= full_xids, cut
        assert obs.notes, cut  # a cut-off probe always says so


def test_huge_output_is_read_only_up_to_the_limit_and_said() -> None:
    row = b"0, GPU-0a, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 590.48.01, 81559, 1, 2, 3, 4, 5\n"
    huge = frame_probe_output([("gpu", GPU_CSV + row * (MAX_PROBE_BYTES // len(row) + 10), b"", 0)])
    obs = parse_probe(huge, 0)
    assert_sane(obs)
    assert any("only the first" in n for n in obs.notes)
    assert len(obs.notes) <= 41
    one_line = parse_probe(b"@@gpuctl-probe 1 abcd\n" + b"x" * (MAX_PROBE_BYTES + 100), 0)
    assert_sane(one_line)
    assert not one_line.nvml_ok


def test_not_available_everywhere_gives_none_fields_and_no_noise() -> None:
    header = GPU_CSV.split(b"\n")[0]
    fields = header.count(b",") + 1
    row = b"0, " + b", ".join([b"[N/A]"] * (fields - 1))
    apps = b"gpu_uuid, pid, used_gpu_memory [MiB], process_name\n[N/A], 77, [N/A], [N/A]\n"
    obs = parse_probe(
        frame_probe_output([("gpu", header + b"\n" + row + b"\n", b"", 0), ("apps", apps, b"", 0)]),
        0,
    )
    assert obs.notes == ()
    (gpu,) = obs.gpus
    assert gpu.index == 0
    assert all(v is None for k, v in dataclasses.asdict(gpu).items() if k != "index")
    assert [(p.pid, p.gpu_uuid, p.used_mib, p.name) for p in obs.processes] == [
        (77, None, None, None)
    ]


def test_escape_sequences_and_invalid_utf8_are_stripped_from_strings() -> None:
    gpu = (
        b"index, uuid, name, memory.total [MiB]\n"
        b"0, GPU-\x1b]0;owned\x07aa, \x1b[31mNVIDIA\x1b[0m H100\xff\xfe \xe2\x80\xaeevil, 81559\n"
    )
    apps = b"gpu_uuid, pid, used_gpu_memory [MiB], process_name\nGPU-aa, 9, 5, py\x1b[2Jthon\x00\n"
    xid = b"source=dmesg\n[ 1.5] NVRM: Xid (PCI:0000:18:00): 79, \x1b[5mGPU\x07 has fallen\n"
    obs = parse_probe(
        frame_probe_output([("gpu", gpu, b"", 0), ("apps", apps, b"", 0), ("xid", xid, b"", 0)]),
        0,
    )
    assert_sane(obs)
    (g,) = obs.gpus
    assert g.uuid == "GPU-aa"
    assert g.model == "NVIDIA H100\ufffd\ufffd evil"
    assert obs.processes[0].name == "python"
    assert obs.xids[0].message == "GPU has fallen"


def test_a_forged_section_marker_in_a_process_name_is_just_text() -> None:
    apps = (
        b"gpu_uuid, pid, used_gpu_memory [MiB], process_name\n"
        b"GPU-0a, 5, 1, x\n@@anything end apps rc=0\n@@anything begin gpu\n"
    )
    obs = parse_probe(
        frame_probe_output([("gpu", GPU_CSV, b"", 0), ("apps", apps, b"", 0)], marker="f00d"), 0
    )
    assert len(obs.gpus) == 2
    assert [p.pid for p in obs.processes] == [5]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_xid_line_parser_never_raises(line: str) -> None:
    event = parse_xid_line(line)
    assert event is None or event.xid >= 0


def test_every_real_capture_file_survives_being_fed_whole_as_probe_output() -> None:
    for path in sorted(FIXTURES.glob("*/*")):
        obs = parse_probe(path.read_bytes(), 0)
        assert_sane(obs)
        assert not obs.nvml_ok


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.text(st.characters(max_codepoint=0x7F), max_size=300))
def test_clean_keeps_printable_text_and_drops_every_control_or_format_character(
    raw: str,
) -> None:
    out = clean(raw)
    assert len(out) <= MAX_STRING_CHARS
    assert not any(unicodedata.category(c) in {"Cc", "Cf", "Cs", "Zl", "Zp"} for c in out)
    if raw.isascii() and raw.isprintable():
        assert out == raw.strip()[:MAX_STRING_CHARS]
