"""The lab's fake nvidia-smi/dmesg, run as real subprocesses, read back through the real probe."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.adapters.probe import parse_probe, parse_versions, parse_xid_line, same_pci_device
from gpuctl.adapters.probe.csvq import Notes, parse_gpu_csv
from gpuctl.adapters.probe.script import GPU_FIELDS, probe_command
from gpuctl.core.model import Observation
from gpuctl.errors import LabError
from gpuctl.lab import node_tools, nodestate

NODE = "lab-07"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Any]:
    state_path = tmp_path / "state.json"
    nodestate.write_state(
        state_path, nodestate.new_node_state(NODE, gpus=2, model=H100, mem_gib=80, node_index=7)
    )
    node_tools.install_node_tools(tmp_path / "bin", python=sys.executable)
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "GPUCTL_LAB_STATE": str(state_path),
        "GPUCTL_LAB_NODE": NODE,
        "LC_ALL": "C",
    }
    return {"state": state_path, "env": env, "bin": tmp_path / "bin"}


@pytest.fixture
def spawn() -> Iterator[Any]:
    """Start long-running processes (our own) and kill exactly those at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def probe(lab: dict[str, Any], *, step_timeout_s: int = 5) -> Observation:
    done = subprocess.run(
        ["sh", "-c", probe_command(step_timeout_s=step_timeout_s)],
        env=lab["env"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    return parse_probe(done.stdout, done.returncode)


def smi(lab: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(lab["bin"] / "nvidia-smi"), *args],
        env=lab["env"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def test_the_probe_through_the_fakes_reports_exactly_the_node_state(lab: dict[str, Any]) -> None:
    obs = probe(lab)
    state = nodestate.read_state(lab["state"])
    assert obs.nvml_ok
    assert obs.notes == ()
    assert obs.processes == () and obs.xids == ()
    assert (obs.facts.driver_version, obs.facts.cuda_version) == ("590.48.01", "13.1")
    assert obs.facts.hostname == os.uname().nodename
    assert obs.facts.cpu_count == os.cpu_count()
    assert obs.facts.host_mem_total_mib is not None and obs.facts.clock_s is not None
    assert abs(obs.facts.clock_s - time.time()) < 60
    assert [g.index for g in obs.gpus] == [0, 1]
    for gpu, card in zip(obs.gpus, state["gpus"], strict=True):
        assert gpu.uuid == card["uuid"] and gpu.uuid.startswith("GPU-")
        assert (gpu.model, gpu.pci_bus_id) == (H100, card["pci_bus_id"])
        assert (gpu.mem_total_mib, gpu.mem_used_mib, gpu.util_pct) == (81559, 0, 0)
        assert (gpu.temp_c, gpu.power_w) == (card["idle_temp_c"], card["idle_power_w"])
        assert gpu.power_limit_w == 700.0
        assert gpu.ecc_mode is True
        assert (gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_uncorrected) == (0, 0)
        assert (gpu.remapped_rows_correctable, gpu.remapped_rows_pending) == (0, False)
        assert (gpu.mig_mode, gpu.thermal_slowdown_hw, gpu.thermal_slowdown_sw) == (
            False,
            False,
            False,
        )
        assert gpu.retired_pages_sbe is None  # Hopper: [N/A], as on the real card


def test_units_and_nounits_output_parse_to_the_same_gpus(lab: dict[str, Any]) -> None:
    fields = ",".join(GPU_FIELDS)
    with_units = smi(lab, f"--query-gpu={fields}", "--format=csv")
    nounits = smi(lab, f"--query-gpu={fields}", "--format=csv,nounits")
    assert "81559 MiB" in with_units.stdout and "81559 MiB" not in nounits.stdout
    notes = Notes()
    assert parse_gpu_csv(with_units.stdout, notes) == parse_gpu_csv(nounits.stdout, notes)
    assert notes.result() == ()
    noheader = smi(lab, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits")
    assert noheader.stdout == "0, 81559\n1, 81559\n"


def test_list_banner_and_refusals_look_like_the_real_tool(lab: dict[str, Any]) -> None:
    state = nodestate.read_state(lab["state"])
    listing = smi(lab, "-L")
    assert listing.stdout.splitlines() == [
        f"GPU {c['index']}: {H100} (UUID: {c['uuid']})" for c in state["gpus"]
    ]
    banner = smi(lab)
    assert parse_versions(banner.stdout) == ("590.48.01", "13.1")
    table = [ln for ln in banner.stdout.splitlines() if ln.startswith(("|", "+"))]
    assert {len(ln) for ln in table} == {91}  # the real table is 91 columns wide
    bogus = smi(lab, "--bogus")
    assert (bogus.returncode, bogus.stdout) == (
        2,
        "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n",
    )
    field = smi(lab, "--query-gpu=index,no.such.field", "--format=csv")
    assert field.returncode == 2
    assert field.stdout.startswith('Field "no.such.field" is not a valid field to query.')


def test_injected_uncorrected_ecc_shows_on_that_gpu_only(lab: dict[str, Any]) -> None:
    nodestate.inject(lab["state"], gpu=1, ecc_uncorrected=5)
    gpus = probe(lab).gpus
    assert [g.ecc_volatile_uncorrected for g in gpus] == [0, 5]
    assert [g.ecc_aggregate_uncorrected for g in gpus] == [0, 5]


def test_injected_temperature_sets_the_slowdown_flags(lab: dict[str, Any]) -> None:
    nodestate.inject(lab["state"], temp_c=95)
    gpus = probe(lab).gpus
    assert [(g.temp_c, g.thermal_slowdown_sw, g.thermal_slowdown_hw) for g in gpus] == [
        (95, True, True),
        (95, True, True),
    ]


def test_a_missing_gpu_disappears_and_clear_brings_it_back(lab: dict[str, Any]) -> None:
    nodestate.inject(lab["state"], gpu=0, missing=True)
    assert [g.index for g in probe(lab).gpus] == [1]
    nodestate.inject(lab["state"], clear=True)
    assert [g.index for g in probe(lab).gpus] == [0, 1]


def test_an_injected_xid_is_in_the_kernel_log_for_that_gpus_bus(lab: dict[str, Any]) -> None:
    nodestate.inject(lab["state"], gpu=1, xid=79)
    obs = probe(lab)
    (event,) = obs.xids
    assert event.xid == 79
    assert event.message.endswith("GPU has fallen off the bus.")
    assert same_pci_device(obs.gpus[1].pci_bus_id, event.pci_bus_id)
    assert not same_pci_device(obs.gpus[0].pci_bus_id, event.pci_bus_id)
    dmesg = subprocess.run(
        [str(lab["bin"] / "dmesg")], env=lab["env"], capture_output=True, text=True, check=True
    )
    lines = dmesg.stdout.splitlines()
    assert all(re.match(r"\[ *\d+\.\d{6}\] ", ln) for ln in lines)
    assert [parse_xid_line(ln) for ln in lines if "Xid" in ln] == [event]


def test_garbage_output_becomes_notes_and_nvml_not_ok(lab: dict[str, Any]) -> None:
    nodestate.inject(lab["state"], garbage=True)
    raw = subprocess.run(
        [str(lab["bin"] / "nvidia-smi"), "--query-gpu=index", "--format=csv"],
        env=lab["env"],
        capture_output=True,
        timeout=10,
        check=False,
    )
    assert raw.returncode == 0
    with pytest.raises(UnicodeDecodeError):
        raw.stdout.decode("utf-8")  # really not text
    obs = probe(lab)
    assert not obs.nvml_ok
    assert obs.gpus == ()
    assert any(n.startswith("GPU query: output unreadable") for n in obs.notes), obs.notes
    for note in obs.notes:
        assert not any(unicodedata.category(c) in {"Cc", "Cf"} for c in note)


def test_a_hung_nvidia_smi_is_cut_by_the_probes_own_timeout(lab: dict[str, Any]) -> None:
    nodestate.inject(lab["state"], hang=True)
    started = time.monotonic()
    obs = probe(lab, step_timeout_s=1)
    elapsed = time.monotonic() - started
    assert not obs.nvml_ok
    assert obs.notes == (
        "nvidia-smi GPU query timed out on the node (nvidia-smi hung: driver or GPU stuck?)",
    )
    assert obs.facts.hostname == os.uname().nodename  # the rest of the probe still answered
    assert elapsed < 8  # one step timeout, not one per nvidia-smi call


def test_a_process_with_a_grant_shows_up_using_its_memory(lab: dict[str, Any], spawn: Any) -> None:
    state = nodestate.read_state(lab["state"])
    uuid1 = state["gpus"][1]["uuid"]
    base = {"PATH": "/usr/bin:/bin", "GPUCTL_LAB_NODE": NODE}
    over = spawn(
        ["sleep", "60"],
        {**base, "CUDA_VISIBLE_DEVICES": uuid1, "GPUCTL_MEM_LIMIT_MIB": "4096",
         "GPUCTL_LAB_MEM_MIB": "6000"},
    )  # fmt: skip
    both = spawn(
        ["sh", "-c", "sleep 60; true"],  # a wrapper and its child: one job
        {**base, "CUDA_VISIBLE_DEVICES": "0,1", "GPUCTL_MEM_LIMIT_MIB": "2048"},
    )
    spawn(["sleep", "60"], {**base, "GPUCTL_LAB_NODE": "lab-99", "CUDA_VISIBLE_DEVICES": "0"})
    spawn(["sleep", "60"], base)  # no grant: not a GPU process
    time.sleep(0.2)  # let `sh` fork its child, so the wrapper rule is exercised
    obs = probe(lab)
    assert sorted((p.pid, p.gpu_uuid, p.used_mib) for p in obs.processes) == sorted(
        [
            (over.pid, uuid1, 6000),
            (both.pid, state["gpus"][0]["uuid"], 2048),
            (both.pid, uuid1, 2048),
        ]
    )
    assert {p.name for p in obs.processes} == {"sleep", "sh"}
    assert [g.mem_used_mib for g in obs.gpus] == [2048, 8048]
    assert [g.util_pct for g in obs.gpus] == [97, 97]


def test_one_probe_run_looks_for_gpu_grants_once_and_the_next_run_looks_again(
    lab: dict[str, Any], spawn: Any, tmp_path: Path
) -> None:
    """The probe asks nvidia-smi three times (twice on warm polls); on a node with a runtime
    folder (the lab's sshd names one) the /proc scan for granted processes runs once per probe
    run, and the next run sees a new process. A call outside a probe run always looks, and so
    does every call on a node without the folder, which then gets no file written."""
    shadow, log, run = tmp_path / "shadow", tmp_path / "grep.log", tmp_path / "run"
    shadow.mkdir()
    run.mkdir()
    grep = shutil.which("grep")
    (shadow / "grep").write_text(f'#!/bin/sh\necho "$1" >>{log}\nexec {grep} "$@"\n')
    (shadow / "grep").chmod(0o755)
    plain = {**lab["env"], "PATH": f"{shadow}:{lab['env']['PATH']}"}
    env = {**plain, node_tools.RUN_DIR_ENV: str(run)}

    def scans() -> int:
        found = log.read_text().split().count("-lzs") if log.exists() else 0
        log.unlink(missing_ok=True)
        return found

    assert (probe({**lab, "env": env}).processes, scans()) == ((), 1)
    job = spawn(["sleep", "60"], {**lab["env"], "CUDA_VISIBLE_DEVICES": "0"})
    again = probe({**lab, "env": env})
    assert ([p.pid for p in again.processes], scans()) == ([job.pid], 1)
    apps = node_tools._probe_invocations()["apps"]
    for _ in range(2):
        direct = subprocess.run(
            ["nvidia-smi", *apps], env=env, capture_output=True, text=True, check=True
        )
        assert f", {job.pid}, " in direct.stdout
    assert scans() == 2
    (run / node_tools.GRANT_MEMO).unlink()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert ([p.pid for p in probe({**lab, "env": plain}).processes], scans()) == ([job.pid], 3)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_without_a_state_file_the_fake_fails_like_a_missing_driver(lab: dict[str, Any]) -> None:
    lab["env"]["GPUCTL_LAB_STATE"] = "/nonexistent/state.json"
    obs = probe(lab)
    assert not obs.nvml_ok
    assert obs.notes[0].startswith(
        "nvidia-smi GPU query failed (exit 9): NVIDIA-SMI has failed because it couldn't"
    )


def test_mig_mode_reads_like_the_mig_captures(lab: dict[str, Any]) -> None:
    state = nodestate.read_state(lab["state"])
    state["gpus"][0]["mig_mode"] = True
    nodestate.write_state(lab["state"], state)
    gpu = probe(lab).gpus[0]
    assert (gpu.mig_mode, gpu.util_pct, gpu.remapped_rows_correctable) == (True, None, None)


def test_inject_refuses_a_bad_gpu_index_and_an_empty_request(lab: dict[str, Any]) -> None:
    with pytest.raises(LabError, match=r"has no GPU 5 \(it has GPUs 0-1\)"):
        nodestate.inject(lab["state"], gpu=5, temp_c=90)
    with pytest.raises(LabError, match="nothing to inject"):
        nodestate.inject(lab["state"])
    with pytest.raises(LabError, match="--xid"):
        nodestate.inject(lab["state"], xid=0)


def test_state_files_are_written_atomically_and_validated(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    nodestate.write_state(path, nodestate.new_node_state("n1", gpus=1, model="X", mem_gib=24,
                                                         node_index=0))  # fmt: skip
    assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answers.sh", "state.json"]
    answers = (tmp_path / "answers.sh").read_text()
    for name in ("apps", "dmesg", "gpu", "gpu_all", "gpu_health", "version"):
        assert f"\nanswer_{name}() {{ printf %s '" in answers
    assert answers.endswith("\nanswers=1\n")
    assert nodestate.read_state(path)["gpus"][0]["mem_total_mib"] == 24 * 1024
    path.write_text("{not json")
    with pytest.raises(LabError, match=r"state\.json: lab node state unreadable"):
        nodestate.read_state(path)
    with pytest.raises(LabError, match="invalid"):
        nodestate.new_node_state("-bad", gpus=1, model=H100, mem_gib=80, node_index=0)
    with pytest.raises(LabError, match="model"):
        nodestate.new_node_state("n1", gpus=1, model="A,B", mem_gib=80, node_index=0)
    a = nodestate.new_node_state("n1", gpus=2, model="NVIDIA H200", mem_gib=1, node_index=3)
    b = nodestate.new_node_state("n1", gpus=2, model="NVIDIA H200", mem_gib=1, node_index=3)
    assert a == b and a["gpus"][0]["mem_total_mib"] == 143771
    assert a["gpus"][0]["uuid"] != a["gpus"][1]["uuid"]


def test_a_state_write_retires_the_answers_an_older_gpuctl_left(lab: dict[str, Any]) -> None:
    legacy = lab["state"].parent / "answers"
    legacy.mkdir()
    (legacy / "valid").write_text("1\n")  # tools of an older lab served answers/ while valid
    nodestate.inject(lab["state"], gpu=0, temp_c=90)
    assert not (legacy / "valid").exists()
    assert probe(lab).gpus[0].temp_c == 90


def test_installed_tools_are_sh_wrappers_over_a_stdlib_python_fake(lab: dict[str, Any]) -> None:
    for tool in ("nvidia-smi", "dmesg"):
        path = lab["bin"] / tool
        assert path.stat().st_mode & 0o777 == 0o755
        assert path.read_text().startswith("#!/bin/sh\n")
        assert f"exec {sys.executable} -IS" in path.read_text()
    fake = (lab["bin"] / node_tools.FAKE_SCRIPT).read_text()
    assert fake.startswith(f"#!{sys.executable} -IS\n")
    assert "import gpuctl" not in fake
    with pytest.raises(LabError, match="absolute path"):
        node_tools.install_node_tools(lab["bin"], python="python3 -c evil")


def _tool(lab: dict[str, Any], *argv: str) -> bytes:
    return subprocess.run(
        [str(lab["bin"] / argv[0]), *argv[1:]], env=lab["env"], capture_output=True, check=True
    ).stdout


def test_pre_rendered_answers_are_exactly_what_the_python_fake_says(lab: dict[str, Any]) -> None:
    nodestate.inject(lab["state"], gpu=1, xid=79)
    invocations = [("nvidia-smi", *args) for args in node_tools._probe_invocations().values()]
    fast = {inv: _tool(lab, *inv) for inv in [*invocations, ("dmesg",)]}
    (lab["state"].parent / "answers.sh").unlink()  # every call now runs the Python fake
    slow = {inv: _tool(lab, *inv) for inv in fast}
    assert fast == slow
    assert b"NVRM: Xid" in fast[("dmesg",)]


def test_a_fault_or_a_granted_process_bypasses_the_pre_rendered_answers(
    lab: dict[str, Any], spawn: Any
) -> None:
    answers = lab["state"].parent / "answers.sh"
    nodestate.inject(lab["state"], garbage=True)
    assert "answers=1" not in answers.read_text()
    nodestate.inject(lab["state"], clear=True)
    assert "answers=1" in answers.read_text()
    apps = ("nvidia-smi", *node_tools._probe_invocations()["apps"])
    assert len(_tool(lab, *apps).splitlines()) == 1  # the header only: no process
    env = {**lab["env"], "CUDA_VISIBLE_DEVICES": "1", "GPUCTL_LAB_MEM_MIB": "777"}
    job = spawn(["sleep", "30"], env)
    rows = _tool(lab, *apps).decode().splitlines()[1:]
    assert len(rows) == 1 and f", {job.pid}, 777, sleep" in rows[0]


def test_a_driver_that_refuses_a_health_field_still_reports_every_gpu(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    old = tmp_path / "old-driver"
    old.mkdir()
    (old / "nvidia-smi").write_text(
        "#!/bin/sh\n"
        'case "$*" in *remapped_rows*)\n'
        "  echo 'Field \"remapped_rows.correctable\" is not a valid field to query.'; exit 2 ;;\n"
        "esac\n"
        f'exec {lab["bin"] / "nvidia-smi"} "$@"\n'
    )
    (old / "nvidia-smi").chmod(0o755)
    env = {**lab["env"], "PATH": f"{old}:{lab['env']['PATH']}"}
    obs = probe({**lab, "env": env})
    assert obs.nvml_ok
    assert [g.index for g in obs.gpus] == [0, 1]
    assert obs.gpus[0].mem_total_mib == 81559
    assert obs.gpus[0].remapped_rows_pending is None
    assert any("health query" in n and "not a valid field" in n for n in obs.notes)


def test_a_current_driver_answers_gpu_and_health_fields_in_one_query(
    lab: dict[str, Any], tmp_path: Path
) -> None:
    spy = tmp_path / "spy"
    spy.mkdir()
    calls = tmp_path / "calls.log"
    (spy / "nvidia-smi").write_text(
        f'#!/bin/sh\necho "$1" >> {calls}\nexec {lab["bin"] / "nvidia-smi"} "$@"\n'
    )
    (spy / "nvidia-smi").chmod(0o755)
    obs = probe({**lab, "env": {**lab["env"], "PATH": f"{spy}:{lab['env']['PATH']}"}})
    assert obs.notes == ()
    assert obs.gpus[0].remapped_rows_pending is False
    assert obs.gpus[0].mig_mode is False
    assert obs.gpus[0].thermal_slowdown_hw is False
    called = calls.read_text().split()
    assert len(called) == 3  # GPU and health fields, compute apps, versions
    assert called[0].startswith("--query-gpu=") and "remapped_rows.pending" in called[0]
