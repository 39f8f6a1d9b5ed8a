"""The `transport: local` probe: NVML through pynvml (package nvidia-ml-py), same `Observation`.

pynvml sits behind our small `Nvml`/`NvmlDevice` protocols: `PynvmlLib` is the only code that
touches pynvml (imported lazily, so gpuctl imports without it), and tests fake the protocols.
Every NVML call may fail per GPU and per field: "not supported" becomes `None` quietly, any
other error becomes `None` plus a note, as in the nvidia-smi parser.
"""

from __future__ import annotations

import functools
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gpuctl.adapters.probe.csvq import Notes
from gpuctl.adapters.probe.nvsmi import parse_facts, parse_xid_lines
from gpuctl.adapters.probe.script import XID_TAIL_LINES
from gpuctl.adapters.probe.text import clean
from gpuctl.core.model import GpuProcess, GpuSnapshot, NodeFacts, Observation

T = TypeVar("T")

_MIB = 1 << 20
_HW_THERMAL = 0x40  # nvmlClocksEventReasonHwThermalSlowdown
_SW_THERMAL = 0x20  # nvmlClocksEventReasonSwThermalSlowdown


class NvmlNotSupported(Exception):
    """NVML says this GPU does not support the query (nvidia-smi prints [Not Supported])."""


class NvmlDevice(Protocol):
    def uuid(self) -> str: ...
    def name(self) -> str: ...
    def pci_bus_id(self) -> str: ...
    def memory_mib(self) -> tuple[int, int]: ...  # total, used
    def util_pct(self) -> int: ...
    def temp_c(self) -> int: ...
    def power_w(self) -> float: ...
    def power_limit_w(self) -> float: ...
    def ecc_mode(self) -> bool: ...
    def ecc_count(self, *, uncorrected: bool, aggregate: bool) -> int: ...
    def retired_pages(self) -> tuple[int, int, bool]: ...  # single bit, double bit, pending
    def remapped_rows(self) -> tuple[int, int, bool, bool]: ...  # corr, uncorr, pending, failure
    def mig_mode(self) -> bool: ...
    def thermal_slowdown(self) -> tuple[bool, bool]: ...  # hardware, software
    def processes(self) -> list[tuple[int, int | None, str | None]]: ...  # pid, used MiB, name


class Nvml(Protocol):
    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_version(self) -> str: ...
    def device_count(self) -> int: ...
    def device(self, index: int) -> NvmlDevice: ...


# --- conversion (pure over the protocol) ------------------------------------------------------


def _call(notes: Notes, where: str, fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except NvmlNotSupported:
        return None
    except Exception as exc:  # NVML errors are per field: the rest of the GPU still reads
        notes.add(f"{where}: {clean(str(exc), 120) or type(exc).__name__}")
        return None


def gpu_snapshot(index: int, dev: NvmlDevice, notes: Notes) -> GpuSnapshot:
    where = f"GPU {index}"
    memory = _call(notes, f"{where}: memory", dev.memory_mib)
    retired = _call(notes, f"{where}: retired pages", dev.retired_pages)
    remapped = _call(notes, f"{where}: remapped rows", dev.remapped_rows)
    thermal = _call(notes, f"{where}: clock event reasons", dev.thermal_slowdown)
    uuid = _call(notes, f"{where}: uuid", dev.uuid)
    name = _call(notes, f"{where}: name", dev.name)
    bus = _call(notes, f"{where}: pci bus id", dev.pci_bus_id)

    def ecc(uncorrected: bool, aggregate: bool) -> int | None:
        kind = f"{'un' if uncorrected else ''}corrected {'aggregate' if aggregate else 'volatile'}"
        return _call(
            notes,
            f"{where}: ECC {kind}",
            lambda: dev.ecc_count(uncorrected=uncorrected, aggregate=aggregate),
        )

    return GpuSnapshot(
        index=index,
        uuid=clean(uuid) or None if uuid is not None else None,
        model=clean(name) or None if name is not None else None,
        pci_bus_id=clean(bus) or None if bus is not None else None,
        mem_total_mib=memory[0] if memory else None,
        mem_used_mib=memory[1] if memory else None,
        util_pct=_call(notes, f"{where}: utilization", dev.util_pct),
        temp_c=_call(notes, f"{where}: temperature", dev.temp_c),
        power_w=_call(notes, f"{where}: power", dev.power_w),
        power_limit_w=_call(notes, f"{where}: power limit", dev.power_limit_w),
        ecc_mode=_call(notes, f"{where}: ECC mode", dev.ecc_mode),
        ecc_volatile_corrected=ecc(False, False),
        ecc_volatile_uncorrected=ecc(True, False),
        ecc_aggregate_corrected=ecc(False, True),
        ecc_aggregate_uncorrected=ecc(True, True),
        retired_pages_sbe=retired[0] if retired else None,
        retired_pages_dbe=retired[1] if retired else None,
        retired_pages_pending=retired[2] if retired else None,
        remapped_rows_correctable=remapped[0] if remapped else None,
        remapped_rows_uncorrectable=remapped[1] if remapped else None,
        remapped_rows_pending=remapped[2] if remapped else None,
        remapped_rows_failure=remapped[3] if remapped else None,
        mig_mode=_call(notes, f"{where}: MIG mode", dev.mig_mode),
        thermal_slowdown_hw=thermal[0] if thermal else None,
        thermal_slowdown_sw=thermal[1] if thermal else None,
    )


def observe(
    nvml: Nvml,
    *,
    facts: NodeFacts | None = None,
    xid_lines: list[str] | None = None,
    notes: Notes | None = None,
) -> Observation:
    """Read every GPU through `nvml` (initialised and shut down here). Never raises."""
    notes = notes or Notes()
    facts = facts or NodeFacts()
    xids = parse_xid_lines(xid_lines or [])
    try:
        nvml.init()
    except Exception as exc:
        notes.add(f"NVML unavailable on this machine ({clean(str(exc), 120)}): no NVIDIA "
                  "driver or GPU here?")  # fmt: skip
        return Observation(xids=xids, facts=facts, notes=notes.result(), nvml_ok=False)
    try:
        driver = _call(notes, "NVML: driver version", nvml.driver_version)
        cuda = _call(notes, "NVML: CUDA version", nvml.cuda_version)
        facts = NodeFacts(
            hostname=facts.hostname,
            driver_version=clean(driver) or None if driver else None,
            cuda_version=clean(cuda) or None if cuda else None,
            clock_s=facts.clock_s,
            cpu_count=facts.cpu_count,
            host_mem_total_mib=facts.host_mem_total_mib,
            host_mem_available_mib=facts.host_mem_available_mib,
        )
        count = _call(notes, "NVML: device count", nvml.device_count)
        if count is None:
            return Observation(xids=xids, facts=facts, notes=notes.result(), nvml_ok=False)
        gpus: list[GpuSnapshot] = []
        processes: list[GpuProcess] = []
        for index in range(count):
            dev = _call(notes, f"GPU {index}: handle", functools.partial(nvml.device, index))
            if dev is None:
                continue
            gpu = gpu_snapshot(index, dev, notes)
            gpus.append(gpu)
            for pid, used, name in _call(notes, f"GPU {index}: processes", dev.processes) or []:
                processes.append(
                    GpuProcess(
                        pid=pid,
                        gpu_uuid=gpu.uuid,
                        used_mib=used,
                        name=(clean(name) or None) if name else None,
                    )
                )
        return Observation(
            gpus=tuple(gpus),
            processes=tuple(processes),
            xids=xids,
            facts=facts,
            notes=notes.result(),
            nvml_ok=True,
        )
    finally:
        try:
            nvml.shutdown()
        except Exception as exc:
            notes.add(f"NVML shutdown failed: {clean(str(exc), 120)}")


# --- the pynvml wrapper (the only code importing pynvml) --------------------------------------


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _PynvmlDevice:
    def __init__(self, lib: PynvmlLib, handle: Any) -> None:
        self._lib = lib
        self._h = handle

    def _q(self, name: str, *args: Any) -> Any:
        return self._lib.call(name, self._h, *args)

    def uuid(self) -> str:
        return _text(self._q("nvmlDeviceGetUUID"))

    def name(self) -> str:
        return _text(self._q("nvmlDeviceGetName"))

    def pci_bus_id(self) -> str:
        return _text(self._q("nvmlDeviceGetPciInfo").busId)

    def memory_mib(self) -> tuple[int, int]:
        info = self._q("nvmlDeviceGetMemoryInfo")
        return int(info.total) // _MIB, int(info.used) // _MIB

    def util_pct(self) -> int:
        return int(self._q("nvmlDeviceGetUtilizationRates").gpu)

    def temp_c(self) -> int:
        return int(self._q("nvmlDeviceGetTemperature", self._lib.const("NVML_TEMPERATURE_GPU")))

    def power_w(self) -> float:
        return int(self._q("nvmlDeviceGetPowerUsage")) / 1000.0

    def power_limit_w(self) -> float:
        return int(self._q("nvmlDeviceGetEnforcedPowerLimit")) / 1000.0

    def ecc_mode(self) -> bool:
        return bool(self._q("nvmlDeviceGetEccMode")[0])

    def ecc_count(self, *, uncorrected: bool, aggregate: bool) -> int:
        kind = "UNCORRECTED" if uncorrected else "CORRECTED"
        counter = "NVML_AGGREGATE_ECC" if aggregate else "NVML_VOLATILE_ECC"
        return int(
            self._q(
                "nvmlDeviceGetTotalEccErrors",
                self._lib.const(f"NVML_MEMORY_ERROR_TYPE_{kind}"),
                self._lib.const(counter),
            )
        )

    def retired_pages(self) -> tuple[int, int, bool]:
        sbe = self._q(
            "nvmlDeviceGetRetiredPages",
            self._lib.const("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
        )
        dbe = self._q(
            "nvmlDeviceGetRetiredPages",
            self._lib.const("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
        )
        pending = self._q("nvmlDeviceGetRetiredPagesPendingStatus")
        return len(sbe), len(dbe), bool(pending)

    def remapped_rows(self) -> tuple[int, int, bool, bool]:
        corr, unc, pending, failure = self._q("nvmlDeviceGetRemappedRows")[:4]
        return int(corr), int(unc), bool(pending), bool(failure)

    def mig_mode(self) -> bool:
        return int(self._q("nvmlDeviceGetMigMode")[0]) == 1

    def thermal_slowdown(self) -> tuple[bool, bool]:
        try:
            reasons = int(self._q("nvmlDeviceGetCurrentClocksEventReasons"))
        except AttributeError:  # older nvidia-ml-py
            reasons = int(self._q("nvmlDeviceGetCurrentClocksThrottleReasons"))
        return bool(reasons & _HW_THERMAL), bool(reasons & _SW_THERMAL)

    def processes(self) -> list[tuple[int, int | None, str | None]]:
        out: list[tuple[int, int | None, str | None]] = []
        for proc in self._q("nvmlDeviceGetComputeRunningProcesses"):
            used = getattr(proc, "usedGpuMemory", None)
            out.append((int(proc.pid), int(used) // _MIB if used is not None else None,
                        _process_name(int(proc.pid))))  # fmt: skip
        return out


class PynvmlLib:
    """`Nvml` over pynvml. NVML "not supported" errors become `NvmlNotSupported`."""

    def __init__(self) -> None:
        self._mod: Any = None

    def init(self) -> None:
        import pynvml

        self._mod = pynvml
        pynvml.nvmlInit()

    def shutdown(self) -> None:
        if self._mod is not None:
            self._mod.nvmlShutdown()

    def const(self, name: str) -> Any:
        return getattr(self._mod, name)

    def call(self, name: str, *args: Any) -> Any:
        fn = getattr(self._mod, name)
        try:
            return fn(*args)
        except self._mod.NVMLError_NotSupported as exc:
            raise NvmlNotSupported(str(exc)) from None

    def driver_version(self) -> str:
        return _text(self.call("nvmlSystemGetDriverVersion"))

    def cuda_version(self) -> str:
        version = int(self.call("nvmlSystemGetCudaDriverVersion"))  # e.g. 13010
        return f"{version // 1000}.{version % 1000 // 10}"

    def device_count(self) -> int:
        return int(self.call("nvmlDeviceGetCount"))

    def device(self, index: int) -> NvmlDevice:
        return _PynvmlDevice(self, self.call("nvmlDeviceGetHandleByIndex", index))


# --- this machine's facts and kernel log ------------------------------------------------------


def _process_name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text(errors="replace").strip() or None
    except OSError:
        return None


def local_facts() -> NodeFacts:
    notes = Notes()
    try:
        meminfo = Path("/proc/meminfo").read_text(errors="replace")
    except OSError:
        meminfo = ""
    text = (
        f"hostname={os.uname().nodename}\nclock_s={time.time()}\ncpu_count={os.cpu_count() or ''}\n"
    )
    return parse_facts(text + meminfo, notes)


def read_kernel_log(timeout_s: float = 2.0) -> list[str] | None:
    """The last NVRM Xid lines of `dmesg`, or None when the kernel log is not readable."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    lines = done.stdout[: 16 << 20].decode("utf-8", "replace").split("\n")
    return [ln for ln in lines if "NVRM: Xid" in ln][-XID_TAIL_LINES:]


def probe_local(
    *,
    nvml: Nvml | None = None,
    kernel_log: Callable[[], list[str] | None] | None = read_kernel_log,
) -> Observation:
    """Probe the machine gpuctl runs on. Never raises; no GPU/driver -> `nvml_ok=False`."""
    notes = Notes()
    lines: list[str] | None = []
    if kernel_log is not None:
        lines = kernel_log()
        if lines is None:
            notes.add("kernel log not readable here (dmesg restricted?): XIDs unknown")
    return observe(nvml or PynvmlLib(), facts=local_facts(), xid_lines=lines, notes=notes)
