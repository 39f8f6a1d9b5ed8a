"""The `transport: local` probe: conversion over a fake of OUR Nvml protocol, and this machine."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from gpuctl.adapters.probe.local import NvmlNotSupported, observe, probe_local
from gpuctl.core.model import GpuProcess, GpuSnapshot, NodeFacts


@dataclasses.dataclass
class FakeDevice:
    """Answers from a dict; a value that is an exception is raised instead."""

    values: dict[str, Any]

    def _get(self, key: str) -> Any:
        value = self.values[key]
        if isinstance(value, Exception):
            raise value
        return value

    def uuid(self) -> str:
        return str(self._get("uuid"))

    def name(self) -> str:
        return str(self._get("name"))

    def pci_bus_id(self) -> str:
        return str(self._get("bus"))

    def memory_mib(self) -> tuple[int, int]:
        return tuple(self._get("memory"))  # type: ignore[return-value]

    def util_pct(self) -> int:
        return int(self._get("util"))

    def temp_c(self) -> int:
        return int(self._get("temp"))

    def power_w(self) -> float:
        return float(self._get("power"))

    def power_limit_w(self) -> float:
        return float(self._get("limit"))

    def ecc_mode(self) -> bool:
        return bool(self._get("ecc_mode"))

    def ecc_count(self, *, uncorrected: bool, aggregate: bool) -> int:
        return int(self._get(f"ecc_{int(uncorrected)}{int(aggregate)}"))

    def retired_pages(self) -> tuple[int, int, bool]:
        return tuple(self._get("retired"))  # type: ignore[return-value]

    def remapped_rows(self) -> tuple[int, int, bool, bool]:
        return tuple(self._get("remapped"))  # type: ignore[return-value]

    def mig_mode(self) -> bool:
        return bool(self._get("mig"))

    def thermal_slowdown(self) -> tuple[bool, bool]:
        return tuple(self._get("thermal"))  # type: ignore[return-value]

    def processes(self) -> list[tuple[int, int | None, str | None]]:
        return list(self._get("procs"))


H100 = {
    "uuid": "GPU-aaaa",
    "name": "NVIDIA H100 80GB HBM3",
    "bus": "00000000:18:00.0",
    "memory": (81559, 19818),
    "util": 100,
    "temp": 59,
    "power": 631.95,
    "limit": 700.0,
    "ecc_mode": True,
    "ecc_00": 2,
    "ecc_10": 0,
    "ecc_01": 7,
    "ecc_11": 1,
    "retired": NvmlNotSupported("Not Supported"),
    "remapped": (0, 1, True, False),
    "mig": False,
    "thermal": (False, True),
    "procs": [(11345, 15690, "./gpu_burn"), (11327, None, None)],
}


@dataclasses.dataclass
class FakeNvml:
    devices: list[FakeDevice | Exception]
    init_error: Exception | None = None
    count_error: Exception | None = None
    calls: list[str] = dataclasses.field(default_factory=list)

    def init(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def shutdown(self) -> None:
        self.calls.append("shutdown")

    def driver_version(self) -> str:
        return "590.48.01"

    def cuda_version(self) -> str:
        return "13.1"

    def device_count(self) -> int:
        if self.count_error is not None:
            raise self.count_error
        return len(self.devices)

    def device(self, index: int) -> FakeDevice:
        dev = self.devices[index]
        if isinstance(dev, Exception):
            raise dev
        return dev


def test_nvml_values_convert_to_the_same_snapshot_fields_as_nvidia_smi() -> None:
    nvml = FakeNvml([FakeDevice(H100)])
    facts = NodeFacts(hostname="here", clock_s=1.0, cpu_count=8)
    obs = observe(nvml, facts=facts)
    assert obs.nvml_ok and obs.notes == ()
    assert obs.gpus == (
        GpuSnapshot(
            index=0, uuid="GPU-aaaa", model="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0",
            mem_total_mib=81559, mem_used_mib=19818, util_pct=100, temp_c=59, power_w=631.95,
            power_limit_w=700.0, ecc_mode=True, ecc_volatile_corrected=2,
            ecc_volatile_uncorrected=0, ecc_aggregate_corrected=7, ecc_aggregate_uncorrected=1,
            remapped_rows_correctable=0, remapped_rows_uncorrectable=1,
            remapped_rows_pending=True, remapped_rows_failure=False, mig_mode=False,
            thermal_slowdown_hw=False, thermal_slowdown_sw=True,
        ),
    )  # fmt: skip
    assert obs.processes == (
        GpuProcess(pid=11345, gpu_uuid="GPU-aaaa", used_mib=15690, name="./gpu_burn"),
        GpuProcess(pid=11327, gpu_uuid="GPU-aaaa", used_mib=None, name=None),
    )
    assert obs.facts == dataclasses.replace(facts, driver_version="590.48.01", cuda_version="13.1")
    assert nvml.calls == ["init", "shutdown"]


def test_a_failing_field_is_none_with_a_note_and_a_lost_gpu_is_left_out() -> None:
    broken = dict(H100, uuid="GPU-bbbb", temp=RuntimeError("GPU is lost"), name="\x1b[31mEvil\x07")
    nvml = FakeNvml([RuntimeError("Unknown Error"), FakeDevice(broken)])
    obs = observe(nvml)
    assert obs.nvml_ok
    assert [g.index for g in obs.gpus] == [1]
    assert obs.gpus[0].temp_c is None and obs.gpus[0].util_pct == 100
    assert obs.gpus[0].model == "Evil"
    assert obs.notes == ("GPU 0: handle: Unknown Error", "GPU 1: temperature: GPU is lost")


def test_mig_unsupported_fields_are_quietly_unknown() -> None:
    mig = dict(H100, util=NvmlNotSupported("x"), remapped=NvmlNotSupported("x"), mig=True)
    obs = observe(FakeNvml([FakeDevice(mig)]))
    gpu = obs.gpus[0]
    assert (gpu.util_pct, gpu.remapped_rows_pending, gpu.mig_mode) == (None, None, True)
    assert obs.notes == ()


def test_no_driver_means_nvml_not_ok_with_a_clear_note_and_facts_kept() -> None:
    nvml = FakeNvml([], init_error=OSError("NVML Shared Library Not Found"))
    obs = observe(nvml, facts=NodeFacts(hostname="laptop"))
    assert not obs.nvml_ok and obs.gpus == ()
    assert obs.facts.hostname == "laptop"
    assert obs.notes == (
        "NVML unavailable on this machine (NVML Shared Library Not Found): no NVIDIA driver or "
        "GPU here?",
    )
    assert nvml.calls == ["init"]
    counted = FakeNvml([], count_error=RuntimeError("Driver Not Loaded"))
    obs = observe(counted)
    assert not obs.nvml_ok
    assert obs.notes == ("NVML: device count: Driver Not Loaded",)
    assert counted.calls == ["init", "shutdown"]


def test_this_machine_through_real_pynvml() -> None:
    """This machine's truth decides the branch: with no NVIDIA driver loaded, NVML must fail
    cleanly (the no-GPU path); with one, it must list GPUs."""
    obs = probe_local(kernel_log=lambda: ["[ 5.0] NVRM: Xid (PCI:0000:18:00): 79, gone"])
    assert obs.facts.hostname == os.uname().nodename
    assert obs.facts.cpu_count == os.cpu_count()
    assert [x.xid for x in obs.xids] == [79]
    if Path("/proc/driver/nvidia/version").exists():
        assert obs.nvml_ok and obs.gpus
    else:
        assert not obs.nvml_ok and obs.gpus == ()
        assert len(obs.notes) == 1
        assert obs.notes[0].startswith("NVML unavailable on this machine (")


def test_an_unreadable_kernel_log_is_said() -> None:
    obs = probe_local(nvml=FakeNvml([FakeDevice(H100)]), kernel_log=lambda: None)
    assert obs.nvml_ok and len(obs.gpus) == 1
    assert obs.notes == ("kernel log not readable here (dmesg restricted?): XIDs unknown",)
