"""`gpuctl metrics serve|dump`: the endpoint scraped over loopback and parsed with the Prometheus
text parser carries the numbers `gpuctl status -o json` shows for the same fleet and store; the
server stops cleanly on SIGTERM and Ctrl-C."""

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.config.jobspec import spec_from_data
from gpuctl.core.jobs.model import (
    Checkpoint,
    EndReason,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    NodeLiveness,
)
from gpuctl.errors import ConnectRefused
from gpuctl.testing.fakes import FakeTransport, ShellTransport, fake_node_env
from gpuctl.testing.promtool import check_metrics

MIB = 1 << 20
CAP = 81559
NODES = ("gpu01", "gpu02", "gpu03")

# Runs the CLI in a child process with a fleet of ShellTransport nodes (argv[1]: node -> its
# environment, or null for a node that refuses), as tests inject a transport in-process.
CHILD = """
import json, sys
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.config.jobspec import spec_from_data
from gpuctl.errors import ConnectRefused
from gpuctl.testing.fakes import FakeTransport, ShellTransport
envs = json.loads(sys.argv[1])
shell = ShellTransport({n: e for n, e in envs.items() if e is not None})
script = {n: (ConnectRefused(n + ": refused") if e is None else
              (lambda node, cmd: shell.run(node, cmd, timeout_s=10))) for n, e in envs.items()}
ctx = AppContext(transport_factory=lambda: FakeTransport(script))
app(sys.argv[2:], obj=ctx, prog_name="gpuctl")
"""


@pytest.fixture
def node_env(tmp_path: Path) -> dict[str, str]:
    return fake_node_env(tmp_path, "gpu01")


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "nodes:\n"
        + "".join(
            f"  - {{name: {n}, host: 127.0.0.1, port: {2201 + i}}}\n" for i, n in enumerate(NODES)
        )
    )
    return path


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def envs(node_env: dict[str, str], *down: str) -> dict[str, dict[str, str] | None]:
    return {n: None if n in down else node_env for n in NODES}


def transport(node_env: dict[str, str], *down: str) -> FakeTransport:
    shell = ShellTransport(dict.fromkeys(NODES, node_env))
    answer = lambda n, c: shell.run(n, c, timeout_s=10)  # noqa: E731
    return FakeTransport(
        {n: ConnectRefused(f"{n}: refused") if n in down else answer for n in NODES}
    )


def gpuctl(inventory: Path, state: Path, t: FakeTransport, *args: str) -> Any:
    ctx = AppContext(transport_factory=lambda: t)  # type: ignore[arg-type,return-value]
    argv = ["-i", str(inventory), "--state-dir", str(state), *args]
    return CliRunner().invoke(app, argv, obj=ctx)


def record_history(state: Path, now: float) -> None:
    """Jobs on gpu01 (8 GiB on card 0, 16 GiB on card 1), a spot job preempted and running again,
    a queued job, an old job (the preemption rate spans the whole window), audit events."""
    store = open_store(state, write=True)

    def ev(kind: str, jid: str | None = None) -> Event:
        return Event(now - 60, "gpuctl", kind, kind, jid, "gpu01")

    def add(jid: str, submitted: float, tier: str = "standard") -> None:
        spec = spec_from_data(
            {"name": jid, "command": ["sleep", "1"], "resources": {"mem_per_gpu": "8GiB"}}
        )
        store.add_job(
            Job(jid, jid, spec, JobState.QUEUED, 0, tier, submitted, updated_at=submitted),
            ev("submit", jid),
        )

    def launch(jid: str, n: int, card: int, mib: int, at: float) -> None:
        inc = Incarnation(
            jid,
            n,
            "gpu01",
            (card,),
            (f"GPU-{card}",),
            mib,
            False,
            IncarnationState.LAUNCHING,
            at,
            f"r/{jid}/{n}",
        )
        store.begin_launch(inc, capacity_mib={("gpu01", card): CAP}, event=ev("launch", jid))
        store.update_incarnation(jid, n, state=IncarnationState.RUNNING, pid=100 + n)

    try:
        add("old", now - 30 * 3600)
        launch("old", 1, 0, 8192, now - 29 * 3600)
        store.update_incarnation(
            "old",
            1,
            state=IncarnationState.EXITED,
            ended_at=now - 28 * 3600,
            exit_code=0,
            end_reason=EndReason.EXITED,
        )
        store.update_job("old", state=JobState.SUCCEEDED)
        add("a", now - 7200)
        launch("a", 1, 0, 8192, now - 7200 + 30)
        store.add_checkpoint(Checkpoint("a", 1, 10, "/ckpt/10", now - 600, "shared"))
        add("b", now - 3600, tier="spot")
        launch("b", 1, 1, 16384, now - 3600 + 90)
        store.update_incarnation(
            "b",
            1,
            state=IncarnationState.KILLED,
            ended_at=now - 1800,
            end_reason=EndReason.PREEMPTED,
        )
        store.update_job("b", state=JobState.QUEUED)
        launch("b", 2, 1, 16384, now - 1700)
        add("c", now - 300)
        for kind in ("failover", "preempt", "preempt", "drain"):
            store.append_event(ev(kind))
        store.set_liveness(NodeLiveness("gpu01", now, None))
        store.set_liveness(NodeLiveness("gpu03", now - 900, now - 900, down=True))
    finally:
        store.close()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, through Prometheus' own text parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(
    scraped: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return scraped.get((name, tuple(sorted(labels.items()))))


def assert_numbers_equal(scraped: dict[Any, float], numbers: dict[str, Any]) -> None:
    """The scraped gauges are `gpuctl status -o json`'s numbers (ages move with the clock)."""
    assert get(scraped, "gpuctl_utilization_ratio") == pytest.approx(
        numbers["utilization_pct"] / 100
    )
    assert get(scraped, "gpuctl_memory_allocated_bytes") == numbers["allocated_mib"] * MIB
    assert get(scraped, "gpuctl_memory_capacity_bytes") == numbers["capacity_mib"] * MIB
    assert get(scraped, "gpuctl_observed_utilization_ratio") == pytest.approx(
        numbers["observed_util_pct"] / 100
    )
    assert get(scraped, "gpuctl_utilization_band", band=numbers["band"]) == 1.0
    assert get(scraped, "gpuctl_queue_wait_p50_seconds") == numbers["queue_wait_p50_s"]
    assert get(scraped, "gpuctl_queue_wait_p95_seconds") == numbers["queue_wait_p95_s"]
    assert get(scraped, "gpuctl_queue_waiting_jobs") == numbers["queue_waiting"]
    assert get(scraped, "gpuctl_queue_oldest_wait_seconds") == pytest.approx(
        numbers["queue_oldest_wait_s"], abs=60
    )
    for stat in ("max", "p95"):
        assert get(scraped, "gpuctl_checkpoint_age_seconds", stat=stat) == pytest.approx(
            numbers[f"checkpoint_age_{stat}_s"], abs=60
        )
    assert get(scraped, "gpuctl_checkpoint_missing_jobs") == numbers["checkpoint_missing"]
    assert get(scraped, "gpuctl_failover_success_ratio") == numbers["failover_success_pct"] / 100
    assert get(scraped, "gpuctl_preemptions_per_hour") == pytest.approx(
        numbers["preemptions_per_hour"]
    )
    assert get(scraped, "gpuctl_spot_preempted_ratio") == numbers["spot_preempted_pct"] / 100
    assert (numbers["fragmentation_pct"] is None) == (
        get(scraped, "gpuctl_fragmentation_ratio") is None
    )


# --- serve in a child process --------------------------------------------------------------------


@contextmanager
def serving(
    inventory: Path, state: Path, fleet: dict[str, Any], *extra: str
) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """`gpuctl metrics serve --port 0` in a child; yields it, its URL and its stderr lines so far
    (kept up to date) once the first refresh is logged."""
    argv = [
        sys.executable,
        "-c",
        CHILD,
        json.dumps(fleet),
        "-i",
        str(inventory),
        "--state-dir",
        str(state),
        "metrics",
        "serve",
        "--port",
        "0",
        *extra,
    ]
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    arrived: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            lines.append(line.rstrip("\n"))
            arrived.put(line)
        arrived.put(None)  # the child closed stderr: it ended

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any(line.startswith("refresh") for line in lines):
            got = arrived.get(timeout=max(0.1, deadline - time.monotonic()))
            assert got is not None, "ended before its first refresh:\n" + "\n".join(lines)
        url = next(line for line in lines if line.startswith("serving metrics on ")).split()[3]
        yield child, url, lines
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        reader.join(timeout=10)  # every line the child wrote is in `lines`
        assert child.stderr is not None
        child.stderr.close()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback only
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return str(response.read().decode())


def test_serve_scraped_over_loopback_equals_status_and_stops_cleanly_on_sigterm(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    record_history(state, time.time())
    status = gpuctl(inventory, state, transport(node_env, "gpu03"), "status", "-o", "json")
    assert status.exit_code == 3, status.output
    numbers = json.loads(status.stdout)["numbers"]
    assert numbers["allocated_mib"] == 8192 + 16384 and numbers["failover_success_pct"] == 100.0
    with serving(inventory, state, envs(node_env, "gpu03")) as (child, url, lines):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        page = scrape(url)
        check_metrics(page)  # the served page, as Prometheus would scrape it
        scraped = samples(page)
        assert_numbers_equal(scraped, numbers)
        assert get(scraped, "gpuctl_node_up", node="gpu01") == 1.0
        assert get(scraped, "gpuctl_node_up", node="gpu03") == 0.0
        assert (
            get(scraped, "gpuctl_gpu_memory_allocated_bytes", **_gpu(scraped, "gpu01", "1"))
            == 16384 * MIB
        )
        assert get(scraped, "gpuctl_failovers_total") == 1.0
        assert get(scraped, "gpuctl_preemptions_total") == 2.0
        assert get(scraped, "gpuctl_drains_total") == 1.0
        refreshes = sum(1 for line in lines if line.startswith("refresh"))
        again = samples(scrape(url))  # a scrape reads the latest values: no new poll
        assert sum(1 for line in lines if line.startswith("refresh")) == refreshes
        assert get(again, "gpuctl_refresh_timestamp_seconds") == get(
            scraped, "gpuctl_refresh_timestamp_seconds"
        )
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0
    assert lines[-1] == "metrics: stopped"
    assert "refresh: 2/3 node(s) up, 4 GPU(s)" in "\n".join(lines)
    assert "Traceback" not in "\n".join(lines)


def _gpu(scraped: dict[Any, float], node: str, gpu: str) -> dict[str, str]:
    """The labels of a GPU's series: node, Hostname, gpu, UUID (as dcgm-exporter's)."""
    for (name, labels), _ in scraped.items():
        d = dict(labels)
        if name == "gpuctl_gpu_info" and d["node"] == node and d["gpu"] == gpu:
            return {k: d[k] for k in ("node", "Hostname", "gpu", "UUID")}
    raise AssertionError(f"no GPU {node}/{gpu}")


def test_ctrl_c_stops_the_server_and_frees_its_port(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    with serving(inventory, state, envs(node_env)) as (child, url, lines):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert get(samples(scrape(url)), "gpuctl_node_up", node="gpu02") == 1.0
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=30) == 0
    assert "metrics: SIGINT: stopping" in lines and lines[-1] == "metrics: stopped"
    with socket.socket() as s:  # a restarted server can listen there again (TIME_WAIT allowed)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    assert not state.exists()  # a read-only exporter creates no state


def test_serve_on_a_port_in_use_exits_1_with_a_hint(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        argv = [
            sys.executable,
            "-c",
            CHILD,
            json.dumps(envs(node_env)),
            "-i",
            str(inventory),
            "--state-dir",
            str(state),
            "metrics",
            "serve",
            "--port",
            port,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert f"error: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "hint: pick another --port or --address" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_refuses_an_interval_under_a_second(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    result = gpuctl(inventory, state, transport(node_env), "metrics", "serve", "--interval", "0.2")
    assert result.exit_code == 2
    assert "--interval must be at least 1 second" in result.stderr


# --- dump ----------------------------------------------------------------------------------------


def test_dump_prints_the_exposition_once_and_exits_3_when_a_node_is_down(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    record_history(state, time.time())
    t = transport(node_env, "gpu02")
    status = json.loads(gpuctl(inventory, state, t, "status", "-o", "json").stdout)["numbers"]
    result = gpuctl(inventory, state, t, "metrics", "dump")
    assert result.exit_code == 3, result.output
    check_metrics(result.stdout)
    scraped = samples(result.stdout)
    assert_numbers_equal(scraped, status)
    assert [dict(lbls)["node"] for (name, lbls) in scraped if name == "gpuctl_node_up"] == list(
        NODES
    )
    assert get(scraped, "gpuctl_node_up", node="gpu02") == 0.0
    assert get(scraped, "gpuctl_node_health", node="gpu02", verdict="unknown") == 1.0
    assert sum(1 for (name, _) in scraped if name == "gpuctl_gpu_info") == 4
    assert result.stderr.startswith("refresh: 2/3 node(s) up, 4 GPU(s), utilization ")


def test_dump_exits_4_when_no_node_answers(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    result = gpuctl(inventory, state, transport(node_env, *NODES), "metrics", "dump")
    assert result.exit_code == 4
    scraped = samples(result.stdout)
    assert all(get(scraped, "gpuctl_node_up", node=n) == 0.0 for n in NODES)
    assert get(scraped, "gpuctl_utilization_ratio") is None  # no capacity: undefined, not 0


def test_dump_from_the_store_polls_nothing(
    inventory: Path, state: Path, node_env: dict[str, str]
) -> None:
    record_history(state, time.time())
    t = transport(node_env)
    result = gpuctl(inventory, state, t, "metrics", "dump", "--from-store")
    assert result.exit_code == 0, result.output
    assert t.calls == []
    check_metrics(result.stdout)
    scraped = samples(result.stdout)
    assert get(scraped, "gpuctl_node_up", node="gpu01") == 1.0
    assert get(scraped, "gpuctl_node_up", node="gpu03") == 0.0  # the control loop holds it down
    assert get(scraped, "gpuctl_queue_waiting_jobs") == 1.0
    assert get(scraped, "gpuctl_failover_success_ratio") == 1.0
    assert get(scraped, "gpuctl_utilization_ratio") is None
    assert result.stderr.startswith(
        "refresh (store): 2 node(s) known; events: failover 1, preempt 2, drain 1"
    )
