"""The metrics server builds a reading's exposition once, whatever the number of scrapes, and
gzips it once: a scrape between two refreshes costs no build (at 8,000 GPUs a build is tens of
milliseconds of CPU, a Prometheus pair scraping every 15 s would pay it at every scrape)."""

import gzip
import urllib.request
from collections.abc import Iterator

import pytest

import gpuctl.ops.metrics as metrics
from gpuctl.core.health import Verdict
from gpuctl.ops.metrics import (
    FleetCollector,
    GpuReading,
    MetricsServer,
    NodeReading,
    Reading,
    exposition,
)


def reading(temp_c: int) -> Reading:
    gpus = tuple(
        GpuReading("n1", i, f"GPU-{i}", "H100", 81559, 1024, 0, 0, 50, temp_c, Verdict.HEALTHY)
        for i in range(4)
    )
    node = NodeReading("n1", True, True, Verdict.HEALTHY, "ready")
    return Reading(1_000.0, 0.5, "gather", None, nodes=(node,), gpus=gpus)


def scrape(url: str, gzipped: bool) -> bytes:
    headers = {"Accept-Encoding": "gzip"} if gzipped else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:  # loopback only
        body: bytes = response.read()
        assert int(response.headers["Content-Length"]) == len(body)
        assert (response.headers["Content-Encoding"] == "gzip") is gzipped
    return gzip.decompress(body) if gzipped else body


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    built: list[object] = []
    real = metrics.exposition_parts

    def counted(r: Reading | None) -> list[bytes]:
        built.append(r)
        return real(r)

    monkeypatch.setattr(metrics, "exposition_parts", counted)
    yield built


def test_scrapes_between_two_refreshes_build_the_exposition_once(builds: list[object]) -> None:
    first, second = reading(40), reading(85)
    want_first, want_second = exposition(first), exposition(second)
    assert b'gpuctl_gpu_temperature_celsius{node="n1",Hostname="n1",gpu="3",UUID="GPU-3"} 40\n' in (
        want_first
    )
    builds.clear()
    collector = FleetCollector()
    server = MetricsServer(collector, "127.0.0.1", 0)
    try:
        assert scrape(server.url, gzipped=False) == b""  # before the first refresh
        collector.update(first)
        bodies = [scrape(server.url, gzipped=g) for g in (True, False, True, False, False)]
        assert bodies == [want_first] * 5
        assert builds == [None, first]
        collector.update(second)
        assert scrape(server.url, gzipped=True) == want_second
        assert scrape(server.url, gzipped=False) == want_second
        assert builds == [None, first, second]
    finally:
        server.close()
