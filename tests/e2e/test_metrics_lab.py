"""`gpuctl metrics serve` against a lab fleet of real sshd: every node up, every GPU exposed, the
same figures as `gpuctl status -o json`, refreshed by its own loop, stopped cleanly by SIGTERM."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuctl.testing.lab import LabFleet
from gpuctl.testing.promtool import check_metrics

pytestmark = pytest.mark.e2e

CODE = "from gpuctl.cli.main import run; run()"
MIB = 1 << 20


def isolated(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path), "GPUCTL_STATE_DIR": str(tmp_path / "state")}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(scraped: dict[Any, float], name: str) -> dict[tuple[str, str], float]:
    """(node, gpu) -> value of a per-GPU metric."""
    return {
        (dict(lbls)["node"], dict(lbls)["gpu"]): v for (n, lbls), v in scraped.items() if n == name
    }


def test_a_scrape_shows_every_lab_node_up_and_its_gpus(lab: LabFleet, tmp_path: Path) -> None:
    inventory = str(lab.lab.inventory_path)
    status = subprocess.run(
        [sys.executable, "-c", CODE, "-i", inventory, "status", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=isolated(tmp_path),
    )
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    argv = [sys.executable, "-c", CODE, "-i", inventory, "metrics", "serve", "--port", "0"]
    argv += ["--interval", "1"]
    with subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=isolated(tmp_path)
    ) as child:
        lines: list[str] = []
        arrived: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert child.stderr is not None
            for line in child.stderr:
                lines.append(line.rstrip("\n"))
                arrived.put(line)
            arrived.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 60
            while sum(1 for line in lines if line.startswith("refresh")) < 2:  # its own loop
                got = arrived.get(timeout=max(0.1, deadline - time.monotonic()))
                assert got is not None, "\n".join(lines)
            url = lines[0].split()[3]
            with urllib.request.urlopen(url, timeout=10) as response:  # loopback only
                page = response.read().decode()
            check_metrics(page)  # real nodes' answers validate too
            scraped = samples(page)
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=30) == 0
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=10)
            reader.join(timeout=10)
    names = list(lab.names)
    up = {dict(lbls)["node"]: v for (n, lbls), v in scraped.items() if n == "gpuctl_node_up"}
    assert up == dict.fromkeys(names, 1.0)
    healthy = {
        dict(lbls)["node"]
        for (n, lbls), v in scraped.items()
        if n == "gpuctl_node_health" and dict(lbls)["verdict"] == "healthy" and v == 1.0
    }
    assert healthy == set(names)
    totals = series(scraped, "gpuctl_gpu_memory_total_bytes")
    assert sorted(totals) == [(n, str(i)) for n in names for i in range(4)]
    for node in doc["nodes"]:
        for gpu in node["gpus"]:
            key = (node["name"], str(gpu["index"]))
            assert totals[key] == gpu["mem_total_mib"] * MIB
            temps = series(scraped, "gpuctl_gpu_temperature_celsius")
            assert temps[key] == pytest.approx(gpu["temp_c"], abs=5)
    numbers = doc["numbers"]
    assert scraped[("gpuctl_memory_capacity_bytes", ())] == numbers["capacity_mib"] * MIB
    assert scraped[("gpuctl_utilization_ratio", ())] == numbers["utilization_pct"] / 100
    assert lines[-1] == "metrics: stopped"
    assert "refresh: 3/3 node(s) up, 12 GPU(s)" in lines[1]
