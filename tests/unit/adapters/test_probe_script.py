"""The probe script run by a real `sh`, with the node's kernel log tools replaced by small
scripts: where the XIDs come from and how many are kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuctl.adapters.probe import parse_probe
from gpuctl.adapters.probe.script import XID_TAIL_LINES, probe_command
from gpuctl.core.model import Observation
from gpuctl.lab import node_tools, nodestate

XID = "NVRM: Xid (PCI:0000:18:00): {n}, pid=7, name=python3, Ch 00000010"


@pytest.fixture
def node(tmp_path: Path) -> dict[str, object]:
    """A lab node's fake nvidia-smi, and a folder ahead of it on PATH for the test's own tools."""
    state = tmp_path / "state.json"
    nodestate.write_state(
        state, nodestate.new_node_state("n1", gpus=1, model="NVIDIA H200", mem_gib=1, node_index=0)
    )
    node_tools.install_node_tools(tmp_path / "lab-bin", python=sys.executable)
    (tmp_path / "lab-bin" / "dmesg").unlink()  # each test says what the kernel log looks like
    tools = tmp_path / "tools"
    tools.mkdir()
    env = {
        "PATH": f"{tools}:{tmp_path / 'lab-bin'}:/usr/local/bin:/usr/bin:/bin",
        "GPUCTL_LAB_STATE": str(state),
        "GPUCTL_LAB_NODE": "n1",
    }
    return {"env": env, "tools": tools}


def tool(node: dict[str, object], name: str, body: str) -> None:
    path = Path(str(node["tools"])) / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def probe(node: dict[str, object]) -> Observation:
    done = subprocess.run(
        ["sh", "-c", probe_command(static_facts=False)],
        env=node["env"],  # type: ignore[arg-type]
        capture_output=True,
        timeout=30,
        check=False,
    )
    return parse_probe(done.stdout, done.returncode)


def test_the_last_xid_lines_of_dmesg_are_kept_in_order(node: dict[str, object]) -> None:
    lines = []
    for n in range(1, 121):
        lines += [f"[{n:5d}.000000] {XID.format(n=n)}", f"[{n:5d}.500000] eth0: link up"]
    tool(node, "dmesg", "cat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
    obs = probe(node)
    assert obs.notes == ()
    assert [x.xid for x in obs.xids] == list(range(121 - XID_TAIL_LINES, 121))


def test_a_refused_dmesg_falls_back_to_journalctl(node: dict[str, object]) -> None:
    tool(
        node,
        "dmesg",
        "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n",
    )
    tool(node, "journalctl", f"echo '[   12.000000] host kernel: {XID.format(n=79)}'\n")
    obs = probe(node)
    assert obs.notes == ()
    assert [(x.xid, x.pci_bus_id) for x in obs.xids] == [(79, "0000:18:00")]


def test_a_kernel_log_without_xids_is_read_and_empty(node: dict[str, object]) -> None:
    tool(node, "dmesg", "echo '[    0.000000] Linux version 6.8.0'\n")
    tool(node, "journalctl", f"echo '{XID.format(n=13)}'\n")  # not asked: dmesg answered
    obs = probe(node)
    assert obs.notes == () and obs.xids == ()


def test_with_neither_kernel_log_readable_the_probe_says_xids_are_unknown(
    node: dict[str, object],
) -> None:
    tool(node, "dmesg", "exit 1\n")
    tool(node, "journalctl", "echo 'No journal files were opened.' >&2; exit 1\n")
    obs = probe(node)
    assert obs.nvml_ok and obs.xids == ()
    assert obs.notes == ("kernel log not readable on the node (dmesg restricted?): XIDs unknown",)
