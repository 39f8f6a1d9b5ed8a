"""The probe parser against real nvidia-smi captures in tests/fixtures/nvidia-smi (MIT)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.adapters.probe import parse_probe, parse_versions, parse_xid_line, same_pci_device
from gpuctl.adapters.probe.csvq import Notes, parse_apps_csv, parse_gpu_csv
from gpuctl.adapters.probe.script import frame_probe_output, probe_command
from gpuctl.core.model import GpuProcess, Observation

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"

FACTS = (
    b"hostname=gpu-node-07\nclock_s=1784016758\ncpu_count=20\n"
    b"MemTotal:       231011404 kB\nMemAvailable:   220145512 kB\n"
)


def fixture(scenario: str, name: str) -> bytes:
    return (FIXTURES / scenario / name).read_bytes()


def probe_from_capture(scenario: str, phase: str) -> Observation:
    out = frame_probe_output(
        [
            ("facts", FACTS, b"", 0),
            ("gpu", fixture(scenario, f"query-gpu-{phase}.csv"), b"", 0),
            ("apps", fixture(scenario, f"compute-apps-{phase}.csv"), b"", 0),
            ("version", fixture(scenario, "version.txt"), b"", 0),
            ("xid", b"source=dmesg\n", b"", 0),
        ]
    )
    return parse_probe(out, 0)


# scenario, phase, model, total, used, util, temp, power, limit, mig, remapped (corr, unc)
CASES = [
    ("h100", "idle", "NVIDIA H100 80GB HBM3", 81559, 0, 0, 41, 69.85, 700.0, False, 0),
    ("h100", "load", "NVIDIA H100 80GB HBM3", 81559, 19818, 100, 59, 631.95, 700.0, False, 0),
    ("h100-mig", "idle", "NVIDIA H100 80GB HBM3", 81559, 59, None, 42, 71.15, 700.0, True, None),
    (
        "h100-mig",
        "load",
        "NVIDIA H100 80GB HBM3",
        81559,
        11125,
        None,
        53,
        433.78,
        700.0,
        True,
        None,
    ),
    ("h200", "idle", "NVIDIA H200", 143771, 0, 0, 28, 77.71, 700.0, False, 0),
    ("h200", "load", "NVIDIA H200", 143771, 32362, 100, 52, 627.40, 700.0, False, 0),
    ("h200-mig", "idle", "NVIDIA H200", 143771, 55, None, 28, 78.28, 700.0, True, None),
    ("h200-mig", "load", "NVIDIA H200", 143771, 16959, None, 36, 295.01, 700.0, True, None),
    ("l40s", "idle", "NVIDIA L40S", 46068, 0, 100, 63, 144.97, 350.0, None, 0),
    ("l40s", "load", "NVIDIA L40S", 46068, 1235, 9, 54, 110.23, 350.0, None, 0),
]


@pytest.mark.parametrize(
    ("scenario", "phase", "model", "total", "used", "util", "temp", "power", "limit", "mig", "rr"),
    CASES,
)
def test_each_capture_parses_to_the_values_nvidia_smi_printed(
    scenario: str,
    phase: str,
    model: str,
    total: int,
    used: int,
    util: int | None,
    temp: int,
    power: float,
    limit: float,
    mig: bool | None,
    rr: int | None,
) -> None:
    obs = probe_from_capture(scenario, phase)
    assert obs.nvml_ok
    assert obs.notes == ()
    assert len(obs.gpus) == 1
    gpu = obs.gpus[0]
    assert gpu.index == 0
    assert gpu.uuid == UUID0
    assert gpu.model == model
    assert (gpu.mem_total_mib, gpu.mem_used_mib) == (total, used)
    assert gpu.util_pct == util
    assert gpu.temp_c == temp
    assert gpu.power_w == pytest.approx(power)
    assert gpu.power_limit_w == pytest.approx(limit)
    assert gpu.ecc_mode is True
    assert (gpu.ecc_volatile_corrected, gpu.ecc_volatile_uncorrected) == (0, 0)
    assert (gpu.ecc_aggregate_corrected, gpu.ecc_aggregate_uncorrected) == (0, 0)
    # Hopper and Ada remap rows instead of retiring pages: retired pages are [N/A].
    assert (gpu.retired_pages_sbe, gpu.retired_pages_dbe, gpu.retired_pages_pending) == (
        None,
        None,
        None,
    )
    assert (gpu.remapped_rows_correctable, gpu.remapped_rows_uncorrectable) == (rr, rr)
    assert gpu.remapped_rows_pending == (None if rr is None else False)
    assert gpu.mig_mode is mig
    assert (gpu.thermal_slowdown_hw, gpu.thermal_slowdown_sw) == (False, False)


PROCESSES = {
    ("h100", "load"): [(11327, "/root/tools/memhog", 2566), (11328, "/root/tools/memhog", 1542),
                       (11345, "./gpu_burn", 15690)],
    ("h100-mig", "load"): [(21180, "/root/tools/memhog", 2296), (21181, "/root/tools/memhog", 1272),
                           (21198, "./gpu_burn", 7484)],
    ("h200", "load"): [(10291, "/root/tools/memhog", 2566), (10293, "/root/tools/memhog", 1542),
                       (10309, "./gpu_burn", 28234)],
    ("h200-mig", "load"): [(12249, "/root/tools/memhog", 2194), (12250, "/root/tools/memhog", 1170),
                           (12267, "./gpu_burn", 13526)],
    ("l40s", "load"): [(20037, "ffmpeg", 538), (20038, "ffmpeg", 681)],
}  # fmt: skip


@pytest.mark.parametrize(("scenario", "phase"), sorted(PROCESSES))
def test_processes_under_load_carry_pid_uuid_name_and_memory(scenario: str, phase: str) -> None:
    obs = probe_from_capture(scenario, phase)
    assert obs.processes == tuple(
        GpuProcess(pid=pid, gpu_uuid=UUID0, used_mib=mib, name=name)
        for pid, name, mib in PROCESSES[(scenario, phase)]
    )


@pytest.mark.parametrize("scenario", ["h100", "h100-mig", "h200", "h200-mig", "l40s"])
def test_idle_captures_have_no_processes(scenario: str) -> None:
    assert probe_from_capture(scenario, "idle").processes == ()


@pytest.mark.parametrize(
    ("scenario", "driver", "cuda"),
    [("h100", "590.48.01", "13.1"), ("h200-mig", "590.48.01", "13.1"), ("l40s", "595.80", "13.2")],
)
def test_driver_and_cuda_versions_come_from_nvidia_smi_version(
    scenario: str, driver: str, cuda: str
) -> None:
    facts = probe_from_capture(scenario, "idle").facts
    assert (facts.driver_version, facts.cuda_version) == (driver, cuda)


def test_node_facts_are_read_from_the_facts_section() -> None:
    facts = probe_from_capture("h100", "idle").facts
    assert facts.hostname == "gpu-node-07"
    assert facts.clock_s == 1784016758.0
    assert facts.cpu_count == 20
    assert facts.host_mem_total_mib == 231011404 // 1024
    assert facts.host_mem_available_mib == 220145512 // 1024


def test_the_banner_gives_cuda_when_the_driver_refuses_dash_dash_version() -> None:
    out = frame_probe_output(
        [
            ("gpu", fixture("h200-mig", "query-gpu-idle.csv"), b"", 0),
            ("version", b"", b"Invalid combination of input arguments.\n", 2),
            ("banner", fixture("h200-mig", "banner-idle.txt"), b"", 0),
        ]
    )
    obs = parse_probe(out, 0)
    assert (obs.facts.driver_version, obs.facts.cuda_version) == ("590.48.01", "13.1")
    assert parse_versions(fixture("l40s", "banner-idle.txt").decode()) == ("595.80", "13.2")


def test_nounits_output_with_a_separate_health_query_is_joined_by_index() -> None:
    gpu = (
        b"index, uuid, name, memory.total [MiB], memory.used [MiB], utilization.gpu [%], "
        b"temperature.gpu, power.draw [W]\n"
        b"0, GPU-aaaa, NVIDIA H100 80GB HBM3, 81559, 1024, 97, 44, 301.50\n"
        b"1, GPU-bbbb, NVIDIA H100 80GB HBM3, 81559, 0, 0, 41, 69.85\n"
    )
    health = (
        b"index, uuid, mig.mode.current, remapped_rows.correctable, remapped_rows.uncorrectable, "
        b"remapped_rows.pending, remapped_rows.failure, "
        b"clocks_event_reasons.hw_thermal_slowdown, clocks_event_reasons.sw_thermal_slowdown\n"
        b"1, GPU-bbbb, Disabled, 3, 1, Yes, No, Active, Not Active\n"
        b"0, GPU-aaaa, Enabled, 0, 0, No, No, Not Active, Not Active\n"
    )
    obs = parse_probe(frame_probe_output([("gpu", gpu, b"", 0), ("gpu-health", health, b"", 0)]), 0)
    assert obs.notes == ()
    a, b = obs.gpus
    assert (a.uuid, a.mem_used_mib, a.util_pct, a.mig_mode) == ("GPU-aaaa", 1024, 97, True)
    assert (b.remapped_rows_correctable, b.remapped_rows_uncorrectable) == (3, 1)
    assert (b.remapped_rows_pending, b.remapped_rows_failure) == (True, False)
    assert (b.thermal_slowdown_hw, b.thermal_slowdown_sw) == (True, False)


def test_a_driver_that_rejects_the_health_fields_keeps_the_gpus_and_says_why() -> None:
    out = frame_probe_output(
        [
            ("gpu", fixture("h100", "query-gpu-idle.csv"), b"", 0),
            ("gpu-health", b'Field "remapped_rows.correctable" is not a valid field to query.\n\n',
             b"", 2),
        ]
    )  # fmt: skip
    obs = parse_probe(out, 0)
    assert obs.nvml_ok and len(obs.gpus) == 1
    assert obs.notes == (
        "nvidia-smi health query (MIG, remapped rows, thermal) failed (exit 2): "
        'Field "remapped_rows.correctable" is not a valid field to query; '
        "those fields are unknown",
    )


def test_nvidia_smi_failure_is_reported_with_exit_status_and_first_error_line() -> None:
    message = (
        b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        b"Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    obs = parse_probe(frame_probe_output([("gpu", message, b"", 9)]), 0)
    assert not obs.nvml_ok
    assert obs.gpus == ()
    assert obs.notes[0].startswith(
        "nvidia-smi GPU query failed (exit 9): NVIDIA-SMI has failed because it couldn't"
    )


def test_a_hung_nvidia_smi_is_named_as_a_timeout_and_the_rest_are_skipped() -> None:
    out = frame_probe_output(
        [("gpu", b"", b"", 124), ("gpu-health", b"", b"", "skip"), ("apps", b"", b"", "skip")]
    )
    obs = parse_probe(out, 0)
    assert not obs.nvml_ok
    # One note for the cause; the skipped queries add nothing new.
    assert obs.notes == (
        "nvidia-smi GPU query timed out on the node (nvidia-smi hung: driver or GPU stuck?)",
    )


def test_missing_nvidia_smi_is_named() -> None:
    obs = parse_probe(frame_probe_output([("gpu", b"", b"sh: nvidia-smi: not found\n", 127)]), 0)
    assert obs.notes == ("nvidia-smi GPU query failed: nvidia-smi not found on the node's PATH",)


def test_bad_numbers_become_none_with_a_note_naming_gpu_and_field() -> None:
    notes = Notes()
    text = (
        "index, memory.total [MiB], memory.used [MiB], utilization.gpu [%], temperature.gpu\n"
        "0, 81559, lots, 250, [GPU is lost]\n"
    )
    gpus = parse_gpu_csv(text, notes)
    assert gpus is not None
    assert (gpus[0].mem_total_mib, gpus[0].mem_used_mib, gpus[0].util_pct) == (81559, None, None)
    assert gpus[0].temp_c is None
    assert notes.result() == (
        "GPU 0: memory.used: 'lots' is not a number",
        "GPU 0: utilization.gpu: '250' is out of range",
        "GPU 0: temperature.gpu: [GPU is lost]",
    )


def test_a_process_name_with_commas_stays_whole() -> None:
    notes = Notes()
    text = (
        "gpu_uuid, pid, used_gpu_memory [MiB], process_name\n"
        "GPU-aaaa, 4242, 2048, python train.py --a=1,2,3\n"
        "GPU-aaaa, 4343, [N/A], [Not Found]\n"
    )
    assert parse_apps_csv(text, notes) == (
        GpuProcess(
            pid=4242, gpu_uuid="GPU-aaaa", used_mib=2048, name="python train.py --a=1, 2, 3"
        ),
        GpuProcess(pid=4343, gpu_uuid="GPU-aaaa", used_mib=None, name=None),
    )
    assert notes.result() == ()


def test_xid_lines_in_kernel_formats_parse() -> None:
    event = parse_xid_line(
        "[  123.456789] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus."
    )
    assert event is not None
    assert (event.xid, event.pci_bus_id, event.at) == (79, "0000:18:00", "123.456789")
    assert event.message == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    journal = parse_xid_line(
        "[ 5012.000001] node7 kernel: NVRM: Xid (PCI:0000:9a:00): 13, pid=4242, name=python, "
        "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address"
    )
    assert journal is not None and (journal.xid, journal.pci_bus_id) == (13, "0000:9a:00")
    assert parse_xid_line("[  1.0] usb 1-1: new high-speed USB device") is None
    assert same_pci_device("00000000:18:00.0", "0000:18:00")
    assert not same_pci_device("00000000:18:00.0", "0000:2a:00")


def test_xids_from_the_probe_and_an_unreadable_kernel_log() -> None:
    lines = b"source=dmesg\n[  99.5] NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable DBE\n"
    obs = parse_probe(frame_probe_output([("xid", lines, b"", 0)]), 0)
    assert [(x.xid, x.at) for x in obs.xids] == [(48, "99.5")]
    none = parse_probe(frame_probe_output([("xid", b"source=none\n", b"", 0)]), 0)
    assert none.xids == ()
    assert "kernel log not readable on the node (dmesg restricted?): XIDs unknown" in none.notes


def test_the_probe_command_is_constant_and_bounds_every_nvidia_smi_call() -> None:
    script = probe_command()
    assert script == probe_command()
    assert "$t nvidia-smi" in script and "timeout -k 2 5" in script
    assert "--query-gpu=index,uuid,name," in script and "--format=csv,nounits" in script
    assert "--query-compute-apps=gpu_uuid,pid,used_memory,process_name" in script
    assert "timeout -k 2 2" in probe_command(step_timeout_s=2)
    with pytest.raises(ValueError, match="step_timeout_s"):
        probe_command(step_timeout_s=0)


def test_the_parser_imports_without_paramiko_or_pynvml() -> None:
    import subprocess
    import sys

    code = (
        "import sys, gpuctl.adapters.probe\n"
        "print(','.join(m for m in ('paramiko', 'pynvml', 'typer', 'textual') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_reason_the_gpus_are_unknown_is_the_first_note() -> None:
    out = frame_probe_output(
        [("facts", b"clock_s=soon\n", b"", 0), ("gpu", b"", b"Segmentation fault\n", 139)],
        done=False,
    )
    obs = parse_probe(out, None)
    assert obs.notes == (
        "nvidia-smi GPU query failed (exit 139): Segmentation fault",
        "probe did not finish on the node (no exit status)",
        "probe output ends early (no final marker)",
        "node facts: clock_s: 'soon' is not a valid value",
    )
    assert parse_probe(b"Welcome to node7!\n", 0).notes == (
        "probe output has no gpuctl header: 'Welcome to node7!'",
    )
