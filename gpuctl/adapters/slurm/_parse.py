"""Slurm's JSON, every shape gpuctl has met: Slurm 22.05 (`sinfo --json` / `squeue --json`,
openapi v0.0.38: numbers as numbers, a node's state as a lower-case word plus `state_flags`, a
job's state as a word) and 23.02 onwards (`scontrol show nodes --json` / `squeue --json`,
data_parser v0.0.39 to v0.0.4x: numbers as `{set, infinite, number}` objects, states as arrays
of upper-case words, features as arrays). Recorded outputs of each are the tests' fixtures
(tests/fixtures/slurm/).

Pure and size-limited. A whole document that is not Slurm's JSON raises `SlurmParseError`
naming the command; a field gpuctl cannot read becomes a note naming the command, the node or
job and the field, never an exception.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuctl.core.scheduler import SchedJob, SchedNode, SchedQueued
from gpuctl.errors import GpuctlError

RUN_DIRS = "/.gpuctl/slurm/"  # where gpuctl's Slurm jobs keep their output (`_jobs._PROLOGUE`)
MAX_JSON_BYTES = 64 * 1024 * 1024  # squeue --json of a busy cluster runs to megabytes
# Job states in which a job still holds its GRES on its nodes.
HOLDING = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "STOPPED"})
_GPU = re.compile(r"(?:^|,)gpu(?::([^:(,]+))?(?::(\d+))?\(IDX:([^)]*)\)")
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
MAX_CARDS = 1024  # per node: beyond it an index list is garbage


class SlurmParseError(GpuctlError):
    """A Slurm command's output is not what gpuctl reads (one line naming the command)."""


def version_of(text: str) -> tuple[int, int, int] | None:
    """`slurm 22.05.8` (`sinfo --version`) -> (22, 5, 8); None when unreadable."""
    m = _VERSION.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def document(text: str, command: str, key: str) -> tuple[list[Any], str | None, list[str]]:
    """The `key` list of a Slurm JSON document, the Slurm release it names and its `errors`
    (as notes). Raises SlurmParseError when it is not JSON or has no such list."""
    if len(text) > MAX_JSON_BYTES:
        raise SlurmParseError(f"`{command}`: output over {MAX_JSON_BYTES // 2**20} MiB")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"`{command}`: not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError as exc:  # bytes that are not text
        raise SlurmParseError(f"`{command}`: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SlurmParseError(f"`{command}`: not a JSON object")
    items = doc.get(key)
    if not isinstance(items, list):
        raise SlurmParseError(f"`{command}`: no `{key}` list in its JSON")
    notes = [f"`{command}`: Slurm says: {_error_text(e)}" for e in doc.get("errors") or ()]
    return items, _release(doc.get("meta")), notes


def _error_text(e: object) -> str:
    if isinstance(e, Mapping):
        return str(e.get("description") or e.get("error") or e)[:200]
    return str(e)[:200]


def _release(meta: object) -> str | None:
    if not isinstance(meta, Mapping):
        return None
    slurm = meta.get("Slurm") or meta.get("slurm")
    if isinstance(slurm, Mapping):
        release = slurm.get("release")
        if isinstance(release, str):
            return release
        v = slurm.get("version")
        if isinstance(v, Mapping):
            return f"{v.get('major')}.{v.get('minor')}.{v.get('micro')}"
    return None


class _Fields:
    """Reads fields of one object, noting those it cannot read."""

    def __init__(self, command: str, what: str, obj: Mapping[str, Any], notes: list[str]) -> None:
        self.command, self.what, self.obj, self.notes = command, what, obj, notes

    def note(self, field: str, why: str) -> None:
        self.notes.append(f"`{self.command}`: {self.what}: field {field}: {why}")

    def text(self, field: str) -> str | None:
        value = self.obj.get(field)
        if value is None or value == "":
            return None
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        self.note(field, f"expected text, got {type(value).__name__}")
        return None

    def number(self, field: str) -> float | None:
        """A number, or `{set, infinite, number}` (unset or infinite: None)."""
        value = self.obj.get(field)
        if value is None:
            return None
        if isinstance(value, Mapping):
            if value.get("set") is False or value.get("infinite") is True:
                return None
            value = value.get("number")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        self.note(field, f"expected a number, got {type(value).__name__}")
        return None

    def words(self, field: str) -> tuple[str, ...]:
        """A list of words, or one comma-separated string (22.05's features)."""
        value = self.obj.get(field)
        if value is None or value == "":
            return ()
        if isinstance(value, str):
            return tuple(w for w in value.split(",") if w)
        if isinstance(value, list) and all(isinstance(w, str) for w in value):
            return tuple(value)
        self.note(field, f"expected a list of words, got {type(value).__name__}")
        return ()


def parse_nodes(items: Iterable[Any], command: str, notes: list[str]) -> tuple[SchedNode, ...]:
    """Nodes of `sinfo --json` (22.05) or `scontrol show nodes --json` (23.02+)."""
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            notes.append(f"`{command}`: node #{i}: no name: left out")
            continue
        f = _Fields(command, f"node {item['name']}", item, notes)
        state, flags = _node_state(f)
        when = f.number("reason_changed_at")
        out.append(
            SchedNode(
                name=item["name"],
                state=state,
                flags=flags,
                reason=f.text("reason"),
                reason_by=f.text("reason_set_by_user"),
                reason_at=when or None,
                address=f.text("address"),
                hostname=f.text("hostname"),
                gres=f.text("gres"),
                partitions=f.words("partitions"),
                features=f.words("active_features") or f.words("features"),
            )
        )
    return tuple(out)


def _node_state(f: _Fields) -> tuple[str, tuple[str, ...]]:
    value = f.obj.get("state")
    extra = f.words("state_flags")  # 22.05
    if isinstance(value, str) and value:
        words = [w.upper() for w in value.split("+")]
    elif isinstance(value, list) and value and all(isinstance(w, str) for w in value):
        words = [w.upper() for w in value]
    else:
        f.note("state", "unreadable: state UNKNOWN")
        words = ["UNKNOWN"]
    base, flags = words[0], (*words[1:], *(w.upper() for w in extra))
    if base == "ALLOC":
        base = "ALLOCATED"
    return base, tuple(dict.fromkeys(flags))


def parse_jobs(items: Iterable[Any], command: str, notes: list[str]) -> tuple[SchedJob, ...]:
    """Running jobs of `squeue --json`, one per node they hold GPUs on, with the cards' indexes
    (`gres_detail`, one entry per node of the job, in the job's node order)."""
    out: list[SchedJob] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            notes.append(f"`{command}`: job #{i}: not an object: left out")
            continue
        f = _Fields(command, f"job {item.get('job_id', '#' + str(i))}", item, notes)
        job_id = f.text("job_id")
        if job_id is None:
            f.note("job_id", "missing: left out")
            continue
        state = _job_state(f)
        if state not in HOLDING:
            continue
        details = item.get("gres_detail") or []
        if not isinstance(details, list):
            f.note("gres_detail", f"expected a list, got {type(details).__name__}")
            continue
        cards = [_gpu_indexes(str(d), f) for d in details]
        if not any(cards):
            continue  # a job without GPUs holds no cards gpuctl counts
        nodes = _job_nodes(item, f, len(details))
        if nodes is None:
            continue
        user, name = f.text("user_name"), f.text("name")
        restarts, started = f.number("restart_cnt"), f.number("start_time")
        out.extend(
            SchedJob(job_id, node, idx, user, name, state, int(restarts or 0), started or None)
            for node, idx in zip(nodes, cards, strict=True)
            if idx
        )
    return tuple(out)


def parse_queue(
    items: Iterable[Any], command: str, notes: list[str], held: Iterable[str] = ()
) -> tuple[tuple[SchedQueued, ...], int]:
    """The other jobs of `squeue --json` (those whose ids are not in `held`, the jobs holding
    cards `parse_jobs` read) that gpuctl submitted (`is_gpuctls`): each one's state, Slurm's
    reason ("None" dropped), restart count and nodes; and how many others it lists, counted
    only (a busy cluster queues thousands, and the view goes into every published poll). A job
    without an id was noted by `parse_jobs` already and is left out quietly."""
    skip, out, others = set(held), [], 0
    for item in items:
        if not isinstance(item, Mapping):
            continue
        job_id = _Fields(command, "", item, []).text("job_id")
        if job_id is None or job_id in skip:
            continue
        if not is_gpuctls(item):
            others += 1
            continue
        f = _Fields(command, f"job {item.get('job_id')}", item, notes)
        reason = f.text("state_reason")
        out.append(
            SchedQueued(
                job_id,
                _job_state(_Fields(command, f.what, item, [])),
                None if reason in (None, "None") else reason,
                int(f.number("restart_cnt") or 0),
                f.text("nodes"),
            )
        )
    return tuple(out), others


def is_gpuctls(item: Mapping[str, Any]) -> bool:
    """A job `gpuctl submit --backend slurm` submitted: its output goes to its run dir,
    `$HOME/.gpuctl/slurm/<job id>/output.log` (`adapters.slurm._jobs`: sbatch's `--output`)."""
    out = item.get("standard_output")
    return isinstance(out, str) and RUN_DIRS in out and out.endswith("/output.log")


def _job_state(f: _Fields) -> str:
    value = f.obj.get("job_state")
    if isinstance(value, str):
        return value.upper()
    if isinstance(value, list) and value and isinstance(value[0], str):
        return value[0].upper()
    f.note("job_state", "unreadable: left out")
    return "UNKNOWN"


def _gpu_indexes(detail: str, f: _Fields) -> tuple[int, ...]:
    """`gpu:h100:2(IDX:0-1)` -> (0, 1); `gpu:8(IDX:0-7)`; `gpu:a100:3(IDX:0-1,4)`."""
    found: list[int] = []
    for m in _GPU.finditer(detail):
        spec = m.group(3)
        if spec in ("", "N/A"):
            continue
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                f.note("gres_detail", f"unreadable index {part!r} in {detail!r}")
                return ()
            first, last = int(lo), int(hi or lo)
            if last < first or last >= MAX_CARDS:
                f.note("gres_detail", f"index range {part!r} out of bounds in {detail!r}")
                return ()
            found.extend(range(first, last + 1))
    return tuple(sorted(set(found)))


def _job_nodes(item: Mapping[str, Any], f: _Fields, count: int) -> list[str] | None:
    """The job's nodes in order: `job_resources`' node list (22.05: `allocated_nodes[].nodename`;
    v0.0.40+: `nodes.allocation[].name`), else `nodes` when it names one node."""
    res = item.get("job_resources")
    names: list[str] = []
    if isinstance(res, Mapping):
        alloc = res.get("allocated_nodes")
        if isinstance(alloc, list):
            names = [str(a.get("nodename")) for a in alloc if isinstance(a, Mapping)]
        nodes = res.get("nodes")
        if not names and isinstance(nodes, Mapping) and isinstance(nodes.get("allocation"), list):
            names = [str(a.get("name")) for a in nodes["allocation"] if isinstance(a, Mapping)]
    if not names:
        single = f.text("nodes")
        if single and not any(c in single for c in "[],"):
            names = [single]
    if len(names) != count:
        f.note(
            "gres_detail",
            f"{count} entries for {len(names)} known nodes: its cards are not counted",
        )
        return None
    return names
