"""`gpuctl report -o html|csv`: the store's history as one self-contained page of SVG charts
(looked at in a real headless chromium), or as one CSV table."""

import csv
import io
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpuctl.adapters.store import open_store
from gpuctl.core.history import FleetSample, NodeSample
from gpuctl.testing.fakes import fake_node_env
from tests.cli.test_metrics_cmd import gpuctl, record_history, transport

NODES = ("gpu01", "gpu02", "gpu03")


def seed(state: Path, now: float) -> None:
    """Jobs and events (`record_history`), and six hours of samples a minute for three nodes."""
    record_history(state, now)
    with open_store(state, write=True) as store:
        start = int(now) - 6 * 3600
        for k, at in enumerate(range(start - start % 60, int(now), 60)):
            frag = 20 + (k % 60) / 3
            fleet = FleetSample(at, 60, {"fragmentation_pct": frag, "stranded_gib": frag / 10})
            nodes = [
                NodeSample(at, 60, n, float((k + 30 * i) % 100), 8192, 16384, 1024 * i, 81920)
                for i, n in enumerate(NODES)
            ]
            store.record_samples(fleet, nodes)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    seed(path, time.time())
    return path


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text("nodes:\n  - {name: gpu01, host: 127.0.0.1, port: 2201}\n")
    return path


def report(tmp_path: Path, inventory: Path, state: Path, *args: str) -> str:
    t = transport(fake_node_env(tmp_path, "gpu01"))
    result = gpuctl(inventory, state, t, "report", *args)
    assert result.exit_code == 0, result.output
    return str(result.stdout)


def test_html_is_one_page_with_an_svg_chart_per_section_and_says_what_is_missing(
    tmp_path: Path, inventory: Path, state: Path
) -> None:
    out = tmp_path / "report.html"
    report(tmp_path, inventory, state, "-o", "html", "--window", "6h", "--out", str(out))
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for title in (
        "Fragmentation and stranded memory",
        "Utilization by node and hour",
        "Queue wait",
        "Checkpoint age per job",
        "Memory per node: allocated, observed, ghost",
    ):
        section = page.split(f"<h2>{title}</h2>", 1)[1].split("</section>", 1)[0]
        assert "<svg" in section, title
    assert "no consolidation in the window" in page
    assert "<script" not in page and "<link" not in page and 'src="http' not in page


def test_csv_is_one_table_of_the_series_with_the_documented_columns(
    tmp_path: Path, inventory: Path, state: Path
) -> None:
    text = report(tmp_path, inventory, state, "-o", "csv", "--window", "1h")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["at", "step_s", "series", "node", "value"]
    frag = [r for r in rows if r["series"] == "fragmentation_pct"]
    assert 59 <= len(frag) <= 61 and all(r["node"] == "" for r in frag)
    ghost = {r["value"] for r in rows if r["series"] == "mem_ghost_mib" and r["node"] == "gpu03"}
    assert ghost == {"2048"}


def test_the_page_shows_its_charts_in_a_headless_chromium(
    tmp_path: Path, inventory: Path, state: Path
) -> None:
    browser = shutil.which("chromium")
    assert browser is not None, "install Debian's chromium: make sysdeps"
    page = tmp_path / "report.html"
    report(tmp_path, inventory, state, "-o", "html", "--window", "6h", "--out", str(page))
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1000,2400",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    non_white = (pixels < 240).any(axis=2)
    assert non_white.mean() > 0.05  # charts drawn, not a blank page
    colours = {tuple(p) for p in pixels.reshape(-1, 3)[::7]}
    assert len(colours) > 200  # the heatmap's colour ramp, the lines, the bars
