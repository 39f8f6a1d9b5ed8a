#!/usr/bin/env python3
"""The lab fleet's fake `nvidia-smi` and `dmesg` (one file, dispatched on the program name).

STDLIB ONLY: it is copied onto each lab node's PATH and runs as the lab user; it must not import
gpuctl. It reads the node state (JSON) named by GPUCTL_LAB_STATE and the node name from
GPUCTL_LAB_NODE, and answers, in the real output format, the calls gpuctl's probe makes:
`--query-gpu=... --format=csv[,noheader][,nounits]`, `--query-compute-apps=...`, `--version`,
plain `nvidia-smi` and `-L`. Anything else gets the real tool's complaint and exit status 2.

Observed usage: processes whose environment holds GPUCTL_LAB_NODE=<this node> and
CUDA_VISIBLE_DEVICES (indices or GPU UUIDs) use GPUCTL_LAB_MEM_MIB MiB per granted GPU (else
GPUCTL_MEM_LIMIT_MIB, else 1024). Only the topmost such process of a process tree counts, so a
`sh -c` wrapper and its child are one job. A GPU with such processes runs at busy_util_pct.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

View = dict[str, Any]
Proc = tuple[int, str, int, int]  # pid, comm, GPU index, MiB

NODE_ENV = "GPUCTL_LAB_NODE"
STATE_ENV = "GPUCTL_LAB_STATE"
DEFAULT_MIB = 1024
SW_SLOWDOWN_C = 85
HW_SLOWDOWN_C = 92

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


def load_state() -> dict[str, Any] | None:
    path = os.environ.get(STATE_ENV, "")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


# --- observed processes -----------------------------------------------------------------------


def _read(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def _int_env(env: dict[str, str], key: str) -> int | None:
    raw = env.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def scan_processes(node: str, gpus: list[View]) -> list[Proc]:
    """[(pid, comm, gpu index, MiB)] for this node's processes holding a GPU grant."""
    by_uuid = {g["uuid"]: g["index"] for g in gpus}
    indices = {g["index"] for g in gpus}
    me = os.getpid()
    # another lab running at the same time has nodes of the same names: its processes carry
    # their own lab's state path, and are not this node's
    lab_state = os.environ.get(STATE_ENV)
    found: dict[int, tuple[int, str, list[int], int]] = {}
    try:
        entries = [p.name for p in Path("/proc").iterdir()]
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        raw = _read(f"/proc/{entry}/environ")
        if not raw:
            continue
        env: dict[str, str] = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep:
                env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        if env.get(NODE_ENV) != node or "CUDA_VISIBLE_DEVICES" not in env:
            continue
        if lab_state and env.get(STATE_ENV, lab_state) != lab_state:
            continue
        granted: list[int] = []
        for token in env["CUDA_VISIBLE_DEVICES"].split(","):
            token = token.strip()
            index = int(token) if token.isdigit() else by_uuid.get(token)
            if isinstance(index, int) and index in indices and index not in granted:
                granted.append(index)
        if not granted:
            continue
        mib = _int_env(env, "GPUCTL_LAB_MEM_MIB")
        if mib is None:
            mib = _int_env(env, "GPUCTL_MEM_LIMIT_MIB")
        if mib is None:
            mib = DEFAULT_MIB
        stat = _read(f"/proc/{entry}/stat", 4096) or b""
        fields = stat[stat.rfind(b")") + 2 :].split()
        ppid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
        comm = (_read(f"/proc/{entry}/comm", 256) or b"").decode("utf-8", "replace").strip()
        found[int(entry)] = (ppid, comm or "unknown", granted, mib)
    out: list[Proc] = []
    for pid in sorted(found):
        ppid, comm, granted, mib = found[pid]
        if ppid in found:  # a child of a counted job process: the job is counted once
            continue
        out.extend((pid, comm, index, mib) for index in granted)
    return out


# --- the live view of each GPU ----------------------------------------------------------------


def live_gpus(state: dict[str, Any], *, scan: bool = True) -> tuple[list[View], list[Proc]]:
    gpus = [g for g in state.get("gpus", []) if not g.get("missing")]
    node = str(state.get("node", os.environ.get(NODE_ENV, "")))
    procs = scan_processes(node, gpus) if scan else []
    views: list[View] = []
    for g in gpus:
        mine = [p for p in procs if p[2] == g["index"]]
        busy = bool(mine)
        temp = g.get("temp_c")
        if temp is None:
            temp = g["busy_temp_c"] if busy else g["idle_temp_c"]
        used = min(g["mem_total_mib"], g.get("base_used_mib", 0) + sum(p[3] for p in mine))
        views.append(
            {
                **g,
                "procs": mine,
                "used": used,
                "util": g.get("busy_util_pct", 97) if busy else 0,
                "temp": temp,
                "power": g["busy_power_w"] if busy else g["idle_power_w"],
            }
        )
    return views, procs


def _flag(value: object, yes: str, no: str) -> str:
    return yes if value else no


def _stamp() -> str:
    now = time.time()
    return (
        time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    )


GPU_UNITS = {
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "memory.reserved": "MiB",
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "power.draw": "W",
    "power.limit": "W",
    "enforced.power.limit": "W",
}
_GPU_KEYS = {  # field -> key of the live view, printed as is
    "driver_version": "driver_version",
    "name": "name",
    "serial": "serial",
    "uuid": "uuid",
    "pci.bus_id": "pci_bus_id",
    "index": "index",
    "memory.total": "mem_total_mib",
    "memory.used": "used",
    "temperature.gpu": "temp",
    "ecc.errors.corrected.volatile.total": "ecc_volatile_corrected",
    "ecc.errors.uncorrected.volatile.total": "ecc_volatile_uncorrected",
    "ecc.errors.corrected.aggregate.total": "ecc_aggregate_corrected",
    "ecc.errors.uncorrected.aggregate.total": "ecc_aggregate_uncorrected",
}
_GPU_CONSTANT = {
    "persistence_mode": "Enabled",
    "pstate": "P0",
    "compute_mode": "Default",
    "memory.reserved": "0",
    # Hopper and later remap rows instead of retiring pages: [N/A], as in the captures.
    "retired_pages.single_bit_ecc.count": "[N/A]",
    "retired_pages.double_bit.count": "[N/A]",
    "retired_pages.pending": "[N/A]",
}
_GPU_OTHER = (
    "timestamp",
    "count",
    "memory.free",
    "utilization.gpu",
    "utilization.memory",
    "power.draw",
    "power.limit",
    "enforced.power.limit",
    "ecc.mode.current",
    "mig.mode.current",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown",
)
GPU_FIELDS = frozenset((*_GPU_KEYS, *_GPU_CONSTANT, *_GPU_OTHER))
GPU_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
    "retired_pages.dbe": "retired_pages.double_bit.count",
    "remapped_rows.sbe": "remapped_rows.correctable",
    "remapped_rows.dbe": "remapped_rows.uncorrectable",
    "clocks_throttle_reasons.hw_thermal_slowdown": "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_throttle_reasons.sw_thermal_slowdown": "clocks_event_reasons.sw_thermal_slowdown",
}


def gpu_cell(name: str, g: View) -> str:
    """One --query-gpu value of one live GPU view, as nvidia-smi prints it (without unit)."""
    mig = bool(g.get("mig_mode"))
    if name in _GPU_CONSTANT:
        return _GPU_CONSTANT[name]
    if name in _GPU_KEYS:
        return str(g.get(_GPU_KEYS[name], "[N/A]"))
    if name == "timestamp":
        return _stamp()
    if name == "count":
        return str(g["count"])
    if name == "memory.free":
        return str(g["mem_total_mib"] - g["used"])
    if name.startswith("utilization."):
        return "[N/A]" if mig else str(g["util"] if name.endswith("gpu") else g["util"] // 10)
    if name == "power.draw":
        return f"{g['power']:.2f}"
    if name.endswith("power.limit"):
        return f"{g['power_limit_w']:.2f}"
    if name == "ecc.mode.current":
        return _flag(g.get("ecc_mode"), "Enabled", "Disabled")
    if name == "mig.mode.current":
        return _flag(mig, "Enabled", "Disabled")
    if name.startswith("remapped_rows."):
        key = name.replace(".", "_")
        value = g[key]
        return (
            "[N/A]"
            if mig
            else (_flag(value, "Yes", "No") if isinstance(value, bool) else str(value))
        )
    limit = HW_SLOWDOWN_C if ".hw_" in name else SW_SLOWDOWN_C
    return _flag(g["temp"] >= limit, "Active", "Not Active")


APP_UNITS = {"used_gpu_memory": "MiB"}
APP_FIELDS = frozenset(
    ("timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "pid", "process_name",
     "used_gpu_memory")
)  # fmt: skip
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


def app_cell(name: str, p: Proc, g: View) -> str:
    """One --query-compute-apps value; a process is (pid, comm, GPU index, MiB)."""
    if name == "timestamp":
        return _stamp()
    if name == "pid":
        return str(p[0])
    if name == "process_name":
        return p[1]
    if name == "used_gpu_memory":
        return str(p[3])
    return gpu_cell(GPU_ALIASES[name], g)


def query(
    fields_arg: str,
    fmt_arg: str,
    known: frozenset[str],
    aliases: dict[str, str],
    units: dict[str, str],
    rows: Sequence[Callable[[str], str]],
    out: IO[str],
) -> int:
    """Render a --query-* CSV (each row renders one canonical field name); returns the status."""
    fmt = [f.strip() for f in fmt_arg.split(",")]
    if "csv" not in fmt or any(f not in ("csv", "noheader", "nounits") for f in fmt):
        out.write(f'"{fmt_arg}" is not a valid format.\n')  # close to the real message
        return 2
    names = [f.strip() for f in fields_arg.split(",")]
    for name in names:
        if aliases.get(name, name) not in known:
            out.write(f'Field "{name}" is not a valid field to query.\n\n')
            return 2
    canonical = [aliases.get(n, n) for n in names]
    lines = []
    if "noheader" not in fmt:
        lines.append(
            ", ".join(
                f"{n} [{units[c]}]" if c in units else n
                for n, c in zip(names, canonical, strict=True)
            )
        )
    with_units = "nounits" not in fmt
    for cell in rows:
        values = []
        for name in canonical:
            value = cell(name)
            if with_units and name in units and not value.startswith("["):
                value = f"{value} {units[name]}"
            values.append(value)
        lines.append(", ".join(values))
    out.write("".join(line + "\n" for line in lines))
    return 0


# --- plain nvidia-smi, -L, --version ----------------------------------------------------------


def banner(state: dict[str, Any], views: list[View], procs: list[Proc]) -> str:
    bar = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    wide = "+" + "-" * 89 + "+"
    driver, cuda = state.get("driver_version", ""), state.get("cuda_version", "")
    head = f" NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}"
    lines = [
        time.strftime("%a %b %e %H:%M:%S %Y") + "       ",
        wide,
        f"|{head:<89}|",
        bar,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",  # noqa: E501
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",  # noqa: E501
        "|                                         |                        |               MIG M. |",  # noqa: E501
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    for g in views:
        util = "N/A" if g.get("mig_mode") else f"{g['util']}%"
        left = f" N/A  {g['temp']:>3}C    P0"
        power = f"{int(g['power'])}W / {int(g['power_limit_w']):>4}W "
        memory = f"{g['used']}MiB / {g['mem_total_mib']:>6}MiB "
        ecc = str(g["ecc_volatile_uncorrected"]) if g.get("ecc_mode") else "N/A"
        lines += [
            f"|{g['index']:>4}  {g['name'][:31]:<31}On  |{g['pci_bus_id']:>19} Off |{ecc:>21} |",
            f"|{left}{power:>{41 - len(left)}}|{memory:>24}|{util:>8}      Default |",
            f"|{'':41}|{'':24}|{_flag(g.get('mig_mode'), 'Enabled', 'Disabled'):>21} |",
            bar,
        ]
    lines += [
        "",
        wide,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",  # noqa: E501
        "|        ID   ID                                                               Usage      |",  # noqa: E501
        "|" + "=" * 89 + "|",
    ]
    if not procs:
        lines.append("|  No running processes found" + " " * 61 + "|")
    for pid, comm, index, mib in procs:
        left = f"|{index:>5}   N/A  N/A {pid:>15}      C   {comm[:30]}"
        right = f"{mib}MiB |"
        lines.append(left + " " * max(1, 91 - len(left) - len(right)) + right)
    lines.append(wide)
    return "\n".join(lines) + "\n"


def garbage(state: dict[str, Any]) -> bytes:
    """Random-looking bytes: non-UTF-8, escape sequences, CSV-ish fragments. Seeded per node."""
    rng = random.Random(f"{state.get('node')}")  # noqa: S311 (not crypto; the same bytes each call)
    pieces = [
        b"\x1b[2J\x1b[H", b"\x1b]0;owned\x07", b"\xff\xfe\xfd", b"\xc3\x28", b"\x00", b"\r",
        b"index, uuid, memory.used [MiB]\n", b"0, GPU-\x1b[31m", b"[N/A], ", b"\xe2\x80\xae",
        b"NVRM: Xid (PCI:", b"@@gpuctl-probe 1 abcd\n", b"\n", b", ", b"-1", b"9" * 30,
    ]  # fmt: skip
    chunks = [b"\xff\x1b[2J"]  # always: not UTF-8, and an escape sequence
    for _ in range(rng.randint(40, 200)):
        if rng.random() < 0.5:
            chunks.append(rng.choice(pieces))
        else:
            chunks.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 24))))
    return b"".join(chunks)


def smi_main(
    args: list[str],
    *,
    state: dict[str, Any] | None = None,
    out: IO[str] | None = None,
    scan: bool = True,
) -> int:
    """Answer one invocation. `scan=False` renders the idle answer (no process looked at): the
    lab pre-renders those so that the node's `nvidia-smi` wrapper prints them itself (see
    `gpuctl.lab.node_tools.render_answers`)."""
    out = sys.stdout if out is None else out
    state = load_state() if state is None else state
    if state is None:
        out.write(NO_DRIVER)
        return 9
    faults = state.get("faults") or {}
    if faults.get("hang"):
        while True:  # a stuck driver: nvidia-smi never answers
            time.sleep(3600)
    if faults.get("garbage"):
        sys.stdout.flush()
        os.write(1, garbage(state))
        return 0
    views, procs = live_gpus(state, scan=scan)
    for g in views:
        g["count"] = len(views)
        g["driver_version"] = state.get("driver_version", "")
    opts: dict[str, str | None] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        opts[key] = value if sep else None
    if not args:
        out.write(banner(state, views, procs))
        return 0
    if args in (["-L"], ["--list-gpus"]):
        out.write("".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in views))
        return 0
    if args == ["--version"]:
        d = str(state.get("driver_version", ""))
        nvml = d.rsplit(".", 1)[0] if d.count(".") > 1 else d
        out.write(
            f"NVIDIA-SMI version  : {d}\nNVML version        : {nvml}\n"
            f"DRIVER version      : {d}\nCUDA Version        : {state.get('cuda_version', '')}\n"
        )
        return 0
    fmt = opts.get("--format")
    gpu_fields, app_fields = opts.get("--query-gpu"), opts.get("--query-compute-apps")
    if set(opts) == {"--query-gpu", "--format"} and gpu_fields and fmt:
        if not views:
            out.write("No devices were found\n")
            return 6
        rows = [functools.partial(gpu_cell, g=g) for g in views]
        return query(gpu_fields, fmt, GPU_FIELDS, GPU_ALIASES, GPU_UNITS, rows, out)
    if set(opts) == {"--query-compute-apps", "--format"} and app_fields and fmt:
        if not views:
            out.write("No devices were found\n")
            return 6
        by_index = {g["index"]: g for g in views}
        rows = [
            functools.partial(app_cell, p=p, g=by_index[p[2]]) for p in procs if p[2] in by_index
        ]
        return query(app_fields, fmt, APP_FIELDS, APP_ALIASES, APP_UNITS, rows, out)
    out.write(BAD_ARGS)
    return 2


# --- dmesg ------------------------------------------------------------------------------------

BOOT_LINES = (
    (0.0, "Linux version 6.8.0-lab (gpuctl lab fleet)"),
    (4.211538, "nvidia: loading out-of-tree module taints kernel."),
    (4.398127, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {driver}"),
    (5.012300, "nvidia-uvm: Loaded the UVM driver, major device number 510."),
)


def dmesg_main(
    args: list[str], *, state: dict[str, Any] | None = None, out: IO[str] | None = None
) -> int:
    out = sys.stdout if out is None else out
    state = (load_state() or {}) if state is None else state
    driver = state.get("driver_version", "")
    events = [(t, text.format(driver=driver)) for t, text in BOOT_LINES]
    for x in state.get("xids", []):
        try:
            events.append(
                (
                    float(x["uptime_s"]),
                    f"NVRM: Xid (PCI:{x['pci']}): {int(x['xid'])}, pid={x['pid']}, "
                    f"name={x['name']}, {x['message']}",
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    events.sort(key=lambda e: e[0])
    for t, text in events:
        seconds, micros = divmod(round(t * 1e6), 1_000_000)
        out.write(f"[{seconds:5d}.{micros:06d}] {text}\n")
    return 0


def main(argv: list[str]) -> int:
    prog, args = Path(argv[0]).name, argv[1:]
    if prog.startswith(".fake") and args:  # run by the node's sh wrapper: the tool comes first
        prog, args = args[0], args[1:]
    if prog == "dmesg":
        return dmesg_main(args)
    return smi_main(args)


if __name__ == "__main__":
    try:
        code = main(sys.argv)
        sys.stdout.flush()
    except BrokenPipeError:
        code = 141
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
