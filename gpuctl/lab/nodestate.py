"""Per-node state of the lab fleet's simulated GPUs (a JSON file) and its fault injection.

The lab fleet helper creates one state file per node (`new_node_state` + `write_state`) and puts
the fake `nvidia-smi` and `dmesg` on the node's PATH (`gpuctl.lab.node_tools`). The fakes read the
file named by `GPUCTL_LAB_STATE` on every call, so `inject` changes what the next poll sees; each
write also re-renders the tools' idle answers beside the file (`node_tools.render_answers`).

Schema (version 1)::

    {"schema": 1, "node": NAME, "driver_version": "590.48.01", "cuda_version": "13.1",
     "faults": {"garbage": false, "hang": false},
     "gpus": [{"index", "uuid", "name", "serial", "pci_bus_id", "mem_total_mib", "base_used_mib",
               "idle_temp_c", "busy_temp_c", "idle_power_w", "busy_power_w", "power_limit_w",
               "busy_util_pct", "temp_c" (override or null), "ecc_mode", "ecc_volatile_corrected",
               "ecc_volatile_uncorrected", "ecc_aggregate_corrected", "ecc_aggregate_uncorrected",
               "remapped_rows_correctable", "remapped_rows_uncorrectable",
               "remapped_rows_pending", "remapped_rows_failure", "mig_mode", "missing"}, ...],
     "xids": [{"gpu", "xid", "uptime_s", "pci", "pid", "name", "message"}, ...]}
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuctl.adapters.files import write_atomic
from gpuctl.errors import LabError
from gpuctl.lab.node_tools import render_answers

SCHEMA_VERSION = 1
DRIVER_VERSION = "590.48.01"
CUDA_VERSION = "13.1"
MAX_XIDS = 1000

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,63}")

# Idle figures from the captures in tests/fixtures/nvidia-smi; busy figures from their load runs.
# (total MiB, idle °C, busy °C, idle W, busy W, power limit W)
_MODELS: dict[str, tuple[int, int, int, float, float, float]] = {
    "NVIDIA H100 80GB HBM3": (81559, 41, 59, 69.85, 631.95, 700.0),
    "NVIDIA H200": (143771, 28, 52, 77.71, 627.40, 700.0),
    "NVIDIA L40S": (46068, 32, 63, 36.12, 298.40, 350.0),
}
_GENERIC = (35, 65, 60.0, 250.0, 300.0)
# PCI buses of an 8-GPU HGX board; GPUs past 8 go to the next PCI domain.
_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

XID_MESSAGES: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f2a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
    "partition 0, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark a row for remapping.",
    68: "NVDEC0 Exception: Error status 0x00000003",
    74: "NVLink: fatal error detected on link 0(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x2080014b 0x5).",
    120: "GSP task timeout @ pc:0x4bd36ec, task: 1",
}
# XIDs the kernel attributes to no process (the bus or the GSP, not an application).
_NO_PROCESS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


def fake_uuid(node: str, index: int) -> str:
    digest = hashlib.sha256(f"gpuctl-lab:{node}:{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _serial(node: str, index: int) -> str:
    digest = hashlib.sha256(f"gpuctl-lab-serial:{node}:{index}".encode()).hexdigest()
    return f"{int(digest[:10], 16):013d}"


def pci_bus_id(index: int) -> str:
    return f"{index // len(_BUSES):08X}:{_BUSES[index % len(_BUSES)]}:00.0"


def new_node_state(
    name: str, *, gpus: int, model: str, mem_gib: int, node_index: int
) -> dict[str, Any]:
    """A fresh node: `gpus` idle cards of `model`, realistic figures, stable UUIDs and bus ids."""
    if not _NAME.fullmatch(name):
        raise LabError(f"lab node name {name!r} is invalid (letters, digits, '.', '_', '-')")
    if not _MODEL.fullmatch(model):
        raise LabError(f"lab GPU model {model!r} is invalid (no commas or control characters)")
    if not 0 <= gpus <= 64:
        raise LabError(f"lab node {name}: gpus must be 0 to 64, got {gpus}")
    if mem_gib <= 0 and model not in _MODELS:
        raise LabError(f"lab node {name}: mem_gib must be more than 0, got {mem_gib}")
    if model in _MODELS:
        total, idle_t, busy_t, idle_w, busy_w, limit = _MODELS[model]
    else:
        total = mem_gib * 1024
        idle_t, busy_t, idle_w, busy_w, limit = _GENERIC
    cards = []
    for i in range(gpus):
        wobble = (node_index + i) % 3  # neighbouring cards and nodes idle a little apart
        cards.append(
            {
                "index": i,
                "uuid": fake_uuid(name, i),
                "name": model,
                "serial": _serial(name, i),
                "pci_bus_id": pci_bus_id(i),
                "mem_total_mib": total,
                "base_used_mib": 0,
                "idle_temp_c": idle_t + wobble,
                "busy_temp_c": busy_t + wobble,
                "idle_power_w": round(idle_w + 0.37 * wobble, 2),
                "busy_power_w": busy_w,
                "power_limit_w": limit,
                "busy_util_pct": 97,
                "temp_c": None,
                "ecc_mode": True,
                "ecc_volatile_corrected": 0,
                "ecc_volatile_uncorrected": 0,
                "ecc_aggregate_corrected": 0,
                "ecc_aggregate_uncorrected": 0,
                "remapped_rows_correctable": 0,
                "remapped_rows_uncorrectable": 0,
                "remapped_rows_pending": False,
                "remapped_rows_failure": False,
                "mig_mode": False,
                "missing": False,
            }
        )
    return {
        "schema": SCHEMA_VERSION,
        "node": name,
        "driver_version": DRIVER_VERSION,
        "cuda_version": CUDA_VERSION,
        "faults": {"garbage": False, "hang": False},
        "gpus": cards,
        "xids": [],
    }


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Atomically replace the state file, mode 0644, keeping the lab user's ownership."""
    body = json.dumps(state, indent=1, sort_keys=True) + "\n"
    write_atomic(path, body, mode=0o644, keep_owner=True)
    render_answers(path, state)


def read_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LabError(f"{path}: lab node state file not found", hint="is the lab up?") from None
    except (OSError, ValueError) as exc:
        raise LabError(f"{path}: lab node state unreadable: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION:
        raise LabError(f"{path}: schema: not a version {SCHEMA_VERSION} lab node state")
    if not isinstance(data.get("gpus"), list) or not isinstance(data.get("xids"), list):
        raise LabError(f"{path}: gpus/xids: missing or not lists")
    return data


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write of one state file (best effort: no lock if we cannot)."""
    try:
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _uptime_s() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.monotonic()


def inject(
    path: Path,
    *,
    gpu: int | None = None,
    ecc_uncorrected: int | None = None,
    xid: int | None = None,
    temp_c: int | None = None,
    missing: bool = False,
    garbage: bool = False,
    hang: bool = False,
    clear: bool = False,
) -> None:
    """Change a node's simulated GPUs; GPU faults hit `gpu`, or every GPU when it is None.

    `clear` runs first (resets the targeted GPUs' faults, their XIDs, and garbage/hang), then the
    other options apply: `ecc_uncorrected` sets the volatile uncorrected count (aggregate at least
    as high), `xid` adds a kernel log event, `temp_c` pins the temperature (slowdown flags follow
    it), `missing` drops the GPU from nvidia-smi, `garbage`/`hang` hit every nvidia-smi call.
    """
    given = (ecc_uncorrected, xid, temp_c)
    if not (clear or missing or garbage or hang or any(v is not None for v in given)):
        raise LabError(
            "nothing to inject",
            hint="give --ecc-uncorrected, --xid, --temp, --missing, --garbage, --hang or --clear",
        )
    if ecc_uncorrected is not None and not 0 <= ecc_uncorrected <= 1_000_000:
        raise LabError(f"--ecc-uncorrected must be 0 to 1000000, got {ecc_uncorrected}")
    if xid is not None and not 1 <= xid <= 999:
        raise LabError(f"--xid must be an XID number from 1 to 999, got {xid}")
    if temp_c is not None and not -40 <= temp_c <= 150:
        raise LabError(f"--temp must be -40 to 150 °C, got {temp_c}")
    with _locked(path):
        state = read_state(path)
        gpus: list[dict[str, Any]] = state["gpus"]
        if gpu is not None and not 0 <= gpu < len(gpus):
            have = f"GPUs 0-{len(gpus) - 1}" if gpus else "no GPUs"
            raise LabError(f"{path}: node {state.get('node')} has no GPU {gpu} (it has {have})")
        targets = [gpus[gpu]] if gpu is not None else gpus
        if clear:
            state["faults"] = {"garbage": False, "hang": False}
            indices = {card["index"] for card in targets}
            state["xids"] = [x for x in state["xids"] if x.get("gpu") not in indices]
            for card in targets:
                card.update(temp_c=None, missing=False, ecc_volatile_uncorrected=0,
                            ecc_aggregate_uncorrected=0)  # fmt: skip
        for card in targets:
            if ecc_uncorrected is not None:
                card["ecc_volatile_uncorrected"] = ecc_uncorrected
                card["ecc_aggregate_uncorrected"] = max(
                    int(card.get("ecc_aggregate_uncorrected") or 0), ecc_uncorrected
                )
            if temp_c is not None:
                card["temp_c"] = temp_c
            if missing:
                card["missing"] = True
            if xid is not None:
                state["xids"].append(_xid_event(card, xid))
        state["xids"] = state["xids"][-MAX_XIDS:]
        if garbage:
            state["faults"]["garbage"] = True
        if hang:
            state["faults"]["hang"] = True
        write_state(path, state)


def _xid_event(card: dict[str, Any], xid: int) -> dict[str, Any]:
    bus = str(card.get("pci_bus_id", "00000000:00:00.0"))
    domain, _, rest = bus.partition(":")
    no_process = xid in _NO_PROCESS
    return {
        "gpu": card["index"],
        "xid": xid,
        "uptime_s": round(_uptime_s(), 6),
        "pci": f"{domain[-4:]}:{rest.split('.')[0]}".lower(),
        "pid": "'<unknown>'" if no_process else "4242",
        "name": "<unknown>" if no_process else "python3",
        "message": XID_MESSAGES.get(xid, "Graphics Exception: ESR 0x404600=0x80000001"),
    }
