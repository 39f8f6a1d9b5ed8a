"""Pure parsers for `nvidia-smi --query-gpu` / `--query-compute-apps` CSV (with a header row).

Both `--format=csv` (values with units: `81559 MiB`) and `--format=csv,nounits` are read; columns
are found by header name, so extra or reordered fields do not matter. Nothing here raises: a bad
value becomes `None` plus a note naming the GPU index and the field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from gpuctl.adapters.probe.text import (
    bracket_error,
    clean,
    is_not_available,
    parse_flag,
    quote_value,
    split_lines,
    split_unit,
)
from gpuctl.core.model import GpuProcess, GpuSnapshot

MAX_GPU_ROWS = 256
MAX_APP_ROWS = 4096

Row = dict[str, str]

# Flag words as nvidia-smi prints them (any other spelling goes through `parse_flag`).
_FLAG_WORDS: dict[str, bool] = {
    "Enabled": True, "Disabled": False, "Yes": True, "No": False,
    "Active": True, "Not Active": False,
}  # fmt: skip
# "No value" cells as nvidia-smi spells them (`is_not_available` reads any case)
_NOT_AVAILABLE_CELLS = frozenset({"[N/A]", "N/A", "[Not Supported]", ""})

_HEADER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,80}")
_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]{0,16}\]\s*$")


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    attr: str
    kind: str  # "int", "float", "flag", "str"
    names: tuple[str, ...]  # the query name first, then aliases nvidia-smi may print instead
    units: tuple[str, ...] = ()
    low: float = 0
    high: float = float(1 << 53)


_GPU_FIELDS: tuple[_Field, ...] = (
    _Field("uuid", "str", ("uuid", "gpu_uuid")),
    _Field("model", "str", ("name", "gpu_name")),
    _Field("pci_bus_id", "str", ("pci.bus_id", "gpu_bus_id")),
    _Field("mem_total_mib", "int", ("memory.total",), ("MiB",), 0, 1 << 24),
    _Field("mem_used_mib", "int", ("memory.used",), ("MiB",), 0, 1 << 24),
    _Field("util_pct", "int", ("utilization.gpu",), ("%",), 0, 100),
    _Field("temp_c", "int", ("temperature.gpu",), ("C",), -60, 200),
    _Field("power_w", "float", ("power.draw", "power.draw.instant"), ("W",), 0, 100_000),
    _Field("power_limit_w", "float", ("power.limit", "enforced.power.limit"), ("W",), 0, 100_000),
    _Field("ecc_mode", "flag", ("ecc.mode.current",)),
    _Field("ecc_volatile_corrected", "int", ("ecc.errors.corrected.volatile.total",)),
    _Field("ecc_volatile_uncorrected", "int", ("ecc.errors.uncorrected.volatile.total",)),
    _Field("ecc_aggregate_corrected", "int", ("ecc.errors.corrected.aggregate.total",)),
    _Field("ecc_aggregate_uncorrected", "int", ("ecc.errors.uncorrected.aggregate.total",)),
    _Field("retired_pages_sbe", "int", ("retired_pages.single_bit_ecc.count", "retired_pages.sbe")),
    _Field("retired_pages_dbe", "int", ("retired_pages.double_bit.count", "retired_pages.dbe")),
    _Field("retired_pages_pending", "flag", ("retired_pages.pending",)),
    _Field("remapped_rows_correctable", "int", ("remapped_rows.correctable", "remapped_rows.sbe")),
    _Field(
        "remapped_rows_uncorrectable", "int", ("remapped_rows.uncorrectable", "remapped_rows.dbe")
    ),
    _Field("remapped_rows_pending", "flag", ("remapped_rows.pending",)),
    _Field("remapped_rows_failure", "flag", ("remapped_rows.failure",)),
    _Field("mig_mode", "flag", ("mig.mode.current",)),
    _Field(
        "thermal_slowdown_hw",
        "flag",
        (
            "clocks_throttle_reasons.hw_thermal_slowdown",
            "clocks_event_reasons.hw_thermal_slowdown",
        ),
    ),
    _Field(
        "thermal_slowdown_sw",
        "flag",
        (
            "clocks_throttle_reasons.sw_thermal_slowdown",
            "clocks_event_reasons.sw_thermal_slowdown",
        ),
    ),
)


_MAX_CACHED = 64
_HEADERS: dict[str, tuple[str, ...]] = {}
_PLANS: dict[tuple[str, ...], tuple[tuple[_Field, str], ...]] = {}


class Notes:
    """A bounded list of one-line notes: garbage input must not produce a million of them."""

    LIMIT = 40

    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    def add(self, note: str) -> None:
        if len(self.items) < self.LIMIT:
            self.items.append(clean(note, 300))
        else:
            self.dropped += 1

    def extend(self, notes: Iterable[str]) -> None:
        for note in notes:
            self.add(note)

    def promote(self, index: int) -> None:
        """Move one note to the front: callers show the first note as the reason."""
        if 0 <= index < len(self.items):
            self.items.insert(0, self.items.pop(index))

    def result(self) -> tuple[str, ...]:
        if self.dropped:
            return (*self.items, f"{self.dropped} more notes not shown")
        return tuple(self.items)


def header_names(line: str) -> list[str] | None:
    """`index, memory.total [MiB]` -> ["index", "memory.total"]; None if not a header row."""
    cached = _HEADERS.get(line)  # a node prints the same header at every poll
    if cached is not None:
        return list(cached)
    names = [_UNIT_SUFFIX.sub("", cell).strip() for cell in line.split(",")]
    if not names or not all(_HEADER_NAME.fullmatch(n) for n in names):
        return None
    if len(_HEADERS) >= _MAX_CACHED:
        _HEADERS.clear()
    _HEADERS[line] = tuple(names)
    return names


def read_csv(
    text: str, *, what: str, required: str, max_rows: int, merge_into: str | None, notes: Notes
) -> list[Row] | None:
    """Rows as {header name: raw cell}. None (with a note) when there is no header row at all.

    A row with more cells than the header has its extras merged into the `merge_into` column
    (a process name may contain commas); other rows of the wrong width are ignored with a note.
    """
    lines = [ln for ln in split_lines(text) if ln.strip()]
    if not lines:
        notes.add(f"{what}: no output (expected a CSV header row)")
        return None
    header = header_names(lines[0])
    if header is None or required not in header:
        notes.add(f"{what}: output unreadable (first line is not a CSV header): {lines[0][:60]!r}")
        return None
    merge_at = header.index(merge_into) if merge_into in header else None
    rows: list[Row] = []
    for number, line in enumerate(lines[1:], start=1):
        if len(rows) >= max_rows:
            notes.add(f"{what}: more than {max_rows} rows; the rest ignored")
            break
        cells = [c.strip() for c in line.split(",")]
        extra = len(cells) - len(header)
        if extra > 0 and merge_at is not None:
            cells[merge_at : merge_at + extra + 1] = [
                ", ".join(cells[merge_at : merge_at + extra + 1])
            ]
        if len(cells) != len(header):
            notes.add(
                f"{what}: row {number} has {len(cells)} fields, expected {len(header)}; ignored"
            )
            continue
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def _raw(row: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        if name in row:
            return name, row[name]
    return None


def convert(
    raw: str, kind: str, *, units: tuple[str, ...], low: float, high: float
) -> tuple[object, str | None]:
    """One cell -> (value or None, problem or None)."""
    # Fast paths for what nearly every cell of `--format=csv,nounits` is (a gather parses about
    # 200 cells per node per poll): a plain whole number, a plain decimal, a known flag word.
    # Anything else takes the careful path below, with the same result.
    if kind == "int":
        if raw.isascii() and raw.isdigit() and len(raw) <= 18:
            whole_number = int(raw)
            if low <= whole_number <= high:
                return whole_number, None
    elif kind == "flag":
        word = _FLAG_WORDS.get(raw)
        if word is not None:
            return word, None
    elif kind == "float":
        whole, dot, frac = raw.partition(".")
        if (
            whole.isascii() and whole.isdigit() and len(whole) <= 18
            and (not dot or (frac.isascii() and frac.isdigit() and len(frac) <= 12))
        ):  # fmt: skip
            decimal = float(raw)
            if low <= decimal <= high:
                return decimal, None
    if is_not_available(raw):
        return None, None
    error = bracket_error(raw)
    if error is not None:
        return None, error
    if kind == "str":
        value = clean(raw)
        return (value or None), None
    if kind == "flag":
        flag = parse_flag(raw)
        return (flag, None) if flag is not None else (None, f"{quote_value(raw)} is not a flag")
    number = split_unit(raw)
    if number is None:
        return None, f"{quote_value(raw)} is not a number"
    value_f, unit = number
    if unit is not None and unit not in units:
        return None, f"{quote_value(raw)} has an unexpected unit"
    if not low <= value_f <= high:
        return None, f"{quote_value(raw)} is out of range"
    if kind == "int":
        if value_f != int(value_f):
            return None, f"{quote_value(raw)} is not a whole number"
        return int(value_f), None
    return value_f, None


def _gpu_plan(columns: tuple[str, ...]) -> tuple[tuple[_Field, str], ...]:
    """Which column each GPU field is read from, for rows with these columns (cached: the same
    columns come back at every poll)."""
    plan = _PLANS.get(columns)
    if plan is None:
        present = frozenset(columns)
        plan = tuple(
            (spec, next(n for n in spec.names if n in present))
            for spec in _GPU_FIELDS
            if not present.isdisjoint(spec.names)
        )
        if len(_PLANS) >= _MAX_CACHED:
            _PLANS.clear()
        _PLANS[columns] = plan
    return plan


def gpu_from_row(index: int, row: Mapping[str, str], notes: Notes) -> GpuSnapshot:
    values: dict[str, object] = {}
    for spec, name in _gpu_plan(tuple(row)):
        raw = row[name]
        kind = spec.kind
        # `convert`'s fast paths, inline: about 200 cells per node per poll come through here
        if kind == "int" and raw.isascii() and raw.isdigit() and len(raw) <= 18:
            whole_number = int(raw)
            if spec.low <= whole_number <= spec.high:
                values[spec.attr] = whole_number
                continue
        elif kind == "flag" and raw in _FLAG_WORDS:
            values[spec.attr] = _FLAG_WORDS[raw]
            continue
        if raw in _NOT_AVAILABLE_CELLS:
            values[spec.attr] = None
            continue
        value, problem = convert(raw, kind, units=spec.units, low=spec.low, high=spec.high)
        if problem is not None:
            notes.add(f"GPU {index}: {name}: {problem}")
        values[spec.attr] = value
    return GpuSnapshot(index=index, **values)  # type: ignore[arg-type]


def row_index(row: Mapping[str, str]) -> int | None:
    raw = row.get("index", "").strip()
    if raw.isascii() and raw.isdigit() and len(raw) <= 4:
        return int(raw)
    return None


def parse_gpu_rows(
    rows: list[Row], notes: Notes, *, extra: Mapping[int, Row] | None = None
) -> tuple[GpuSnapshot, ...]:
    """GPU rows (and the health query's rows by index) -> snapshots, in index order."""
    gpus: dict[int, GpuSnapshot] = {}
    for number, row in enumerate(rows, start=1):
        index = row_index(row)
        if index is None:
            notes.add(
                f"GPU query: row {number}: index {quote_value(row.get('index', ''))} "
                "is not a GPU index; row ignored"
            )
            continue
        if index in gpus:
            notes.add(f"GPU query: GPU {index} reported twice; the second row ignored")
            continue
        merged = dict(row)
        more = (extra or {}).get(index)
        if more is not None:
            uuid_a, uuid_b = row.get("uuid", "").strip(), more.get("uuid", "").strip()
            if uuid_a and uuid_b and uuid_a != uuid_b:
                notes.add(
                    f"GPU {index}: health query row is for another GPU (uuid differs); ignored"
                )
            else:
                merged = {**more, **row}
        gpus[index] = gpu_from_row(index, merged, notes)
    return tuple(gpus[i] for i in sorted(gpus))


def rows_by_index(rows: list[Row], notes: Notes) -> dict[int, Row]:
    out: dict[int, Row] = {}
    for row in rows:
        index = row_index(row)
        if index is not None and index not in out:
            out[index] = row
    return out


def parse_gpu_csv(
    text: str, notes: Notes, *, health: str | None = None
) -> tuple[GpuSnapshot, ...] | None:
    """`--query-gpu` CSV (and optionally the health query's CSV) -> GPUs; None if unreadable."""
    rows = read_csv(
        text,
        what="GPU query",
        required="index",
        max_rows=MAX_GPU_ROWS,
        merge_into=None,
        notes=notes,
    )
    if rows is None:
        return None
    extra: dict[int, Row] = {}
    if health is not None:
        health_rows = read_csv(
            health,
            what="GPU health query",
            required="index",
            max_rows=MAX_GPU_ROWS,
            merge_into=None,
            notes=notes,
        )
        extra = rows_by_index(health_rows or [], notes)
    return parse_gpu_rows(rows, notes, extra=extra)


def parse_apps_csv(text: str, notes: Notes) -> tuple[GpuProcess, ...]:
    """`--query-compute-apps` CSV -> processes (pid, GPU uuid, used MiB, name)."""
    rows = read_csv(
        text,
        what="compute apps query",
        required="pid",
        max_rows=MAX_APP_ROWS,
        merge_into="process_name",
        notes=notes,
    )
    out: list[GpuProcess] = []
    for number, row in enumerate(rows or [], start=1):
        pid_raw = row.get("pid", "").strip()
        if not (pid_raw.isascii() and pid_raw.isdigit() and 0 < len(pid_raw) <= 10):
            notes.add(
                f"compute apps query: row {number}: pid {quote_value(pid_raw)} is not a pid; "
                "ignored"
            )
            continue
        uuid_found = _raw(row, ("gpu_uuid", "uuid"))
        uuid = clean(uuid_found[1]) if uuid_found and not is_not_available(uuid_found[1]) else None
        used: int | None = None
        used_found = _raw(row, ("used_gpu_memory", "used_memory"))
        if used_found is not None:
            value, problem = convert(used_found[1], "int", units=("MiB",), low=0, high=1 << 24)
            if problem is not None:
                notes.add(f"process {pid_raw}: {used_found[0]}: {problem}")
            used = value if isinstance(value, int) else None
        name_found = _raw(row, ("process_name", "name"))
        name = None
        if name_found is not None and not is_not_available(name_found[1]):
            name = clean(name_found[1]) or None
        out.append(GpuProcess(pid=int(pid_raw), gpu_uuid=uuid or None, used_mib=used, name=name))
    return tuple(out)


def first_value(rows: list[Row], name: str) -> str | None:
    for row in rows:
        raw = row.get(name)
        if raw is not None and not is_not_available(raw) and bracket_error(raw) is None:
            return clean(raw) or None
    return None
