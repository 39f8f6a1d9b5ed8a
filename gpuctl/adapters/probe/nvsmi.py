"""Parse what `probe_command()` printed into an `Observation`. Pure: no I/O, never raises.

Node output is untrusted: at most `MAX_PROBE_BYTES` are read, every string is cleaned of escape
sequences and control characters, `[N/A]`/`[Not Supported]` become `None`, and every problem
becomes a one-line note instead of an exception.
"""

from __future__ import annotations

import dataclasses
import math
import re

from gpuctl.adapters.probe import script
from gpuctl.adapters.probe.csvq import (
    MAX_GPU_ROWS,
    Notes,
    Row,
    first_value,
    parse_apps_csv,
    parse_gpu_rows,
    read_csv,
    rows_by_index,
)
from gpuctl.adapters.probe.text import clean, split_lines
from gpuctl.core.model import GpuProcess, GpuSnapshot, NodeFacts, Observation, XidEvent, pci_key

MAX_PROBE_BYTES = 4 << 20
MAX_SECTION_LINES = 20_000
MAX_XIDS = 200

_MARKER = re.compile(r"[0-9A-Za-z]{4,64}")
_TIMEOUT_CODES = frozenset({124, 137})


@dataclasses.dataclass(slots=True)
class Section:
    name: str
    stdout: list[str] = dataclasses.field(default_factory=list)
    stderr: list[str] = dataclasses.field(default_factory=list)
    rc: int | str | None = None  # None: the end marker never came
    overflow: bool = False

    @property
    def text(self) -> str:
        return "\n".join(self.stdout)

    def first_error_line(self) -> str:
        for line in (*self.stderr, *self.stdout):
            if line.strip():
                return clean(line, 160)
        return ""


def split_sections(text: str, notes: Notes) -> tuple[dict[str, Section], bool] | None:
    """The probe's framed sections by name, and whether the `done` line came; None: no header."""
    lines = split_lines(text)
    marker = None
    start = 0
    for i, line in enumerate(lines[:200]):
        if line.startswith(script.HEADER_PREFIX):
            parts = line[len(script.HEADER_PREFIX) :].split(" ")
            if len(parts) == 2 and _MARKER.fullmatch(parts[1]):
                if parts[0] != script.PROBE_VERSION:
                    notes.add(
                        f"probe output is version {clean(parts[0], 8)!r}, expected "
                        f"{script.PROBE_VERSION}"
                    )
                marker, start = parts[1], i + 1
                break
    if marker is None:
        return None
    tag = f"@@{marker} "
    sections: dict[str, Section] = {}
    current: Section | None = None
    into_stderr = False
    done = False
    for line in lines[start:]:
        if line.startswith(tag):
            words = line[len(tag) :].split(" ")
            if words[0] == "begin" and len(words) == 2:
                if current is not None:
                    _cut(current, notes)
                current = Section(words[1][:32])
                sections[current.name] = current  # a retried section replaces the first try
                into_stderr = False
            elif words[0] == "stderr" and current is not None:
                into_stderr = True
            elif words[0] == "end" and current is not None and len(words) == 3:
                code = words[2].removeprefix("rc=")
                current.rc = (
                    int(code) if code.isascii() and code.isdigit() and len(code) < 4 else code
                )
                current = None
            elif words[0] == "done":
                done = True
                break
            continue
        if current is None:
            continue
        target = current.stderr if into_stderr else current.stdout
        if len(target) < MAX_SECTION_LINES:
            target.append(line)
        elif not current.overflow:
            current.overflow = True
            notes.add(
                f"probe section {current.name!r} has more than {MAX_SECTION_LINES} lines; "
                "the rest ignored"
            )
    if current is not None:
        _cut(current, notes)
    return sections, done


def _cut(section: Section, notes: Notes) -> None:
    """A section without its end marker: its last line may be partial, so it is dropped."""
    notes.add(f"probe output was cut off in section {section.name!r}")
    target = section.stderr if section.stderr else section.stdout
    if target:
        target.pop()


def failure_note(what: str, section: Section) -> str:
    rc = section.rc
    if rc in _TIMEOUT_CODES:
        return f"{what} timed out on the node (nvidia-smi hung: driver or GPU stuck?)"
    if rc == 127:
        return f"{what} failed: nvidia-smi not found on the node's PATH"
    if rc == 126:
        return f"{what} failed: nvidia-smi is not executable"
    if rc == "skip":
        return f"{what} skipped (an earlier nvidia-smi call timed out or was not found)"
    if rc is None:
        return f"{what}: output cut off before the command finished"
    detail = section.first_error_line().rstrip(".")
    shown = clean(str(rc), 8)
    return f"{what} failed (exit {shown})" + (f": {detail}" if detail else "")


# --- small pure parsers for each piece ------------------------------------------------------

_VERSION_LINE = re.compile(r"\s*(DRIVER version|CUDA Version)\s*:\s*(\S+)\s*", re.IGNORECASE)
_BANNER_DRIVER = re.compile(r"Driver Version:\s*(\S+)")
_BANNER_CUDA = re.compile(r"CUDA Version:\s*(\S+)")
_VERSION_TEXT = re.compile(r"[0-9][0-9A-Za-z.\-]{0,31}")


def _version(raw: str | None) -> str | None:
    if raw is None:
        return None
    return raw if _VERSION_TEXT.fullmatch(raw) else None


def parse_versions(text: str) -> tuple[str | None, str | None]:
    """`nvidia-smi --version` output, or the plain banner -> (driver version, CUDA version)."""
    driver = cuda = None
    for line in split_lines(text)[:200]:
        match = _VERSION_LINE.fullmatch(line)
        if match is not None:
            if match.group(1).lower().startswith("driver"):
                driver = driver or _version(match.group(2))
            else:
                cuda = cuda or _version(match.group(2))
            continue
        banner_driver = _BANNER_DRIVER.search(line)
        if banner_driver is not None:
            driver = driver or _version(banner_driver.group(1))
        banner_cuda = _BANNER_CUDA.search(line)
        if banner_cuda is not None:
            cuda = cuda or _version(banner_cuda.group(1))
    return driver, cuda


_MEMINFO = re.compile(r"(MemTotal|MemAvailable):\s*([0-9]{1,15})\s*kB")


def parse_facts(text: str, notes: Notes) -> NodeFacts:
    """The facts section: `key=value` lines plus /proc/meminfo's MemTotal/MemAvailable."""
    hostname: str | None = None
    clock_s: float | None = None
    cpu_count: int | None = None
    mem: dict[str, int] = {}
    for line in split_lines(text)[:100]:
        key, sep, value = line.partition("=")
        if sep:
            value = value.strip()
            if key == "hostname":
                hostname = clean(value, 253) or None
            elif key == "clock_s":
                clock_s = _float_or_note(value, "clock_s", notes, low=1.0, high=1e11)
            elif key == "cpu_count":
                number = _float_or_note(value, "cpu_count", notes, low=1, high=1 << 20)
                cpu_count = int(number) if number is not None and number.is_integer() else None
            continue
        match = _MEMINFO.fullmatch(line.strip())
        if match is not None:
            mem[match.group(1)] = int(match.group(2)) // 1024
    return NodeFacts(
        hostname=hostname,
        clock_s=clock_s,
        cpu_count=cpu_count,
        host_mem_total_mib=mem.get("MemTotal"),
        host_mem_available_mib=mem.get("MemAvailable"),
    )


def _float_or_note(raw: str, name: str, notes: Notes, *, low: float, high: float) -> float | None:
    if not raw:
        return None
    try:
        value = float(raw[:32])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        notes.add(f"node facts: {name}: {clean(raw, 40)!r} is not a valid value")
        return None
    return value


_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\):"
    r"\s*([0-9]{1,6})(?:,\s*(.*))?"
)
_LOG_TIME = re.compile(r"\s*\[([^\]]{1,64})\]")


def parse_xid_line(line: str) -> XidEvent | None:
    """`[  123.456789] NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.`"""
    match = _XID.search(line[:2048])
    if match is None:
        return None
    stamp = _LOG_TIME.match(line)
    return XidEvent(
        xid=int(match.group(2)),
        pci_bus_id=match.group(1),
        message=clean(match.group(3) or ""),
        at=clean(stamp.group(1), 64) if stamp else None,
    )


def parse_xid_lines(lines: list[str]) -> tuple[XidEvent, ...]:
    events = [e for e in (parse_xid_line(ln) for ln in lines) if e is not None]
    return tuple(events[-MAX_XIDS:])


def same_pci_device(a: str | None, b: str | None) -> bool:
    """`00000000:18:00.0` (nvidia-smi) and `0000:18:00` (kernel log) name the same device."""
    left = pci_key(a)
    return left is not None and left == pci_key(b)


# --- the whole probe --------------------------------------------------------------------------


def parse_probe(stdout: bytes, exit_code: int | None) -> Observation:
    """One probe's stdout and exit status -> Observation. Never raises."""
    notes = Notes()
    try:
        return _parse(stdout, exit_code, notes)
    except Exception as exc:  # a parser bug must not take the gather down: report it as data
        notes.add(f"probe output could not be parsed ({type(exc).__name__}); this is a gpuctl bug")
        return Observation(notes=notes.result(), nvml_ok=False)


def _parse(stdout: bytes, exit_code: int | None, notes: Notes) -> Observation:
    data = bytes(stdout)
    if len(data) > MAX_PROBE_BYTES:
        notes.add(f"probe output is {len(data)} bytes; only the first {MAX_PROBE_BYTES} were read")
        cut = data.rfind(b"\n", 0, MAX_PROBE_BYTES)
        data = data[: cut if cut >= 0 else MAX_PROBE_BYTES]
    if exit_code is None:
        notes.add("probe did not finish on the node (no exit status)")
    elif exit_code != 0:
        notes.add(f"probe exited with status {exit_code}")
    text = data.decode("utf-8", errors="replace")
    split = split_sections(text, notes)
    if split is None:
        first = next((ln for ln in split_lines(text)[:5] if ln.strip()), "")
        what = f": {clean(first, 80)!r}" if first else " (no output)"
        notes.add(f"probe output has no gpuctl header{what}")
        notes.promote(len(notes.items) - 1)
        return Observation(notes=notes.result(), nvml_ok=False)
    sections, done = split
    if not done:
        notes.add("probe output ends early (no final marker)")

    facts = (
        parse_facts(sections[script.SECTION_FACTS].text, notes)
        if script.SECTION_FACTS in sections
        else NodeFacts()
    )

    gpus: tuple[GpuSnapshot, ...] = ()
    nvml_ok = False
    first_gpu_note = len(notes.items)
    driver_from_query: str | None = None
    gpu = sections.get(script.SECTION_GPU)
    if gpu is None:
        notes.add("probe output has no GPU query section")
    elif gpu.rc != 0:
        notes.add(failure_note("nvidia-smi GPU query", gpu))
    else:
        rows = read_csv(
            gpu.text,
            what="GPU query",
            required="index",
            max_rows=MAX_GPU_ROWS,
            merge_into=None,
            notes=notes,
        )
        if rows is not None:
            extra: dict[int, Row] = {}
            health = sections.get(script.SECTION_GPU_HEALTH)
            if health is not None and health.rc == 0:
                health_rows = read_csv(
                    health.text,
                    what="GPU health query",
                    required="index",
                    max_rows=MAX_GPU_ROWS,
                    merge_into=None,
                    notes=notes,
                )
                extra = rows_by_index(health_rows or [], notes)
            elif health is not None:
                notes.add(
                    failure_note("nvidia-smi health query (MIG, remapped rows, thermal)", health)
                    + "; those fields are unknown"
                )
            gpus = parse_gpu_rows(rows, notes, extra=extra)
            driver_from_query = _version(first_value(rows, "driver_version"))
            nvml_ok = True

    if not nvml_ok:
        notes.promote(first_gpu_note)  # why the GPUs are unknown comes first

    processes: tuple[GpuProcess, ...] = ()
    apps = sections.get(script.SECTION_APPS)
    if apps is not None and apps.rc == 0:
        processes = parse_apps_csv(apps.text, notes)
    elif apps is not None and apps.rc != "skip":
        notes.add(failure_note("nvidia-smi compute apps query", apps) + "; processes unknown")

    driver, cuda = None, None
    for name in (script.SECTION_VERSION, script.SECTION_BANNER):
        section = sections.get(name)
        if section is not None and section.rc == 0:
            found_driver, found_cuda = parse_versions(section.text)
            driver, cuda = driver or found_driver, cuda or found_cuda
    facts = dataclasses.replace(
        facts, driver_version=driver or driver_from_query, cuda_version=cuda
    )

    xids: tuple[XidEvent, ...] = ()
    xid = sections.get(script.SECTION_XID)
    if xid is not None:
        lines = xid.stdout
        source = lines[0].strip() if lines else ""
        if source == "source=none":
            notes.add("kernel log not readable on the node (dmesg restricted?): XIDs unknown")
        xids = parse_xid_lines(lines[1:] if source.startswith("source=") else lines)

    return Observation(
        gpus=gpus,
        processes=processes,
        xids=xids,
        facts=facts,
        notes=notes.result(),
        nvml_ok=nvml_ok,
    )
