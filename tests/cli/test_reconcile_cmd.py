"""`gpuctl reconcile`: one pass launches a queued job on a node (a local shell standing in for it),
the next records its exit; -o json, --dry-run, a second loop refused, --watch stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.jobs.model import JobState
from gpuctl.lab import nodestate
from gpuctl.ops import jobs as service
from gpuctl.testing.fakes import ShellTransport, shell_fleet

NODES = ("gpu01", "gpu02")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Path, ShellTransport]]:
    yield shell_fleet(tmp_path, NODES)


def submit(state_dir: Path, tmp_path: Path, command: str) -> str:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: quick\n"
        f"command: [sh, -c, {json.dumps(command)}]\n"
        "resources: {gpus: 1, mem_per_gpu: 8GiB}\n"
    )
    store = open_store(state_dir, write=True)
    try:
        (job,) = service.submit(store, load_specs([spec]), actor="test", clock=SystemClock())
    finally:
        store.close()
    return job.id


def invoke(inventory: Path, state_dir: Path, transport: ShellTransport, *args: str) -> Result:
    ctx = AppContext(transport_factory=lambda: transport)
    argv = ["-i", str(inventory), "--state-dir", str(state_dir), "reconcile", *args]
    return CliRunner().invoke(app, argv, obj=ctx)


def test_one_pass_launches_the_queued_job_and_the_next_records_its_exit(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    inventory, transport = fleet
    state = tmp_path / "state"
    job_id = submit(state, tmp_path, "exit 0")
    first = invoke(inventory, state, transport, "-o", "json")
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    kinds = [(a["kind"], a["outcome"]) for a in report["actions"] if a["job_id"] == job_id]
    assert kinds == [("launch", "intent"), ("launched", "ok")]
    assert {n["name"]: n["liveness"] for n in report["nodes"]} == {"gpu01": "ok", "gpu02": "ok"}
    deadline = time.monotonic() + 10
    while True:
        second = invoke(inventory, state, transport)
        assert second.exit_code == 0, second.output
        store = open_store(state, write=False)
        job = store.job(job_id)
        store.close()
        assert job is not None
        if job.state is JobState.SUCCEEDED or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert job.state is JobState.SUCCEEDED
    assert "succeeded" in second.stdout and "1 succeeded" in second.stdout


def test_a_dry_run_shows_the_launch_and_changes_nothing(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    inventory, transport = fleet
    state = tmp_path / "state"
    job_id = submit(state, tmp_path, "exit 0")
    result = invoke(inventory, state, transport, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "launch" in result.stdout and "would" in result.stdout
    assert "would be done (dry run)" in result.stdout
    store = open_store(state, write=False)
    try:
        job = store.job(job_id)
        assert job is not None and job.state is JobState.QUEUED
        assert store.incarnations(job_id) == []
    finally:
        store.close()


def test_a_second_loop_is_refused_while_one_holds_the_lock(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    inventory, transport = fleet
    state = tmp_path / "state"
    submit(state, tmp_path, "exit 0")
    store = open_store(state, write=True)
    try:
        with store.loop_lock():
            result = invoke(inventory, state, transport)
    finally:
        store.close()
    assert result.exit_code == 6
    assert "another control loop is running" in result.stderr
    assert "--wait" in result.stderr
    assert result.stdout == ""


def test_watch_stops_cleanly_on_ctrl_c_and_releases_the_lock(tmp_path: Path) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text("nodes:\n  - {name: gone, host: 127.0.0.1, port: 9, gpus: 1}\n")
    state = tmp_path / "state"
    env = {**os.environ, "GPUCTL_STATE_DIR": str(state)}
    argv = [sys.executable, "-c", "from gpuctl.cli.main import run; run()"]
    argv += ["-i", str(inventory), "reconcile"]
    proc = subprocess.Popen(
        [*argv, "--watch", "--interval", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = [proc.stderr.readline() for _ in range(2)]  # the first pass's events
        assert any(line.startswith("node_failing: gone") for line in seen), seen
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopping after this step" in err and "Traceback" not in err
    again = subprocess.run([*argv, "-o", "json"], env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["nodes"][0]["liveness"] == "failing"


def hot_history(state: Path, node: str, *ago_s: float) -> None:
    """Earlier runs' samples of `node` with its GPU 0 at 95 C, `ago_s` seconds ago each."""
    from gpuctl.core.model import GpuSnapshot, NodeSnapshot, NodeState, Observation, Reach
    from gpuctl.ops.health import SampleHistory

    history = SampleHistory.in_state_dir(state)
    for ago in ago_s:
        gpu = GpuSnapshot(index=0, uuid=nodestate.fake_uuid(node, 0), temp_c=95)
        sample = NodeSnapshot(
            node,
            Reach.OK,
            NodeState.READY,
            observation=Observation(gpus=(gpu,)),
            taken_at=time.time() - ago,
        )
        history.record([sample])


@pytest.mark.parametrize(("earlier", "action"), [((), "alert"), ((120.0, 60.0), "drain")])
def test_a_one_shot_pass_reads_earlier_runs_samples_to_tell_sustained_heat_from_a_spike(
    fleet: tuple[Path, ShellTransport], tmp_path: Path, earlier: tuple[float, ...], action: str
) -> None:
    inventory, transport = fleet
    state = tmp_path / "state"
    nodestate.inject(Path(transport.envs["gpu01"]["GPUCTL_LAB_STATE"]), gpu=0, temp_c=95)
    hot_history(state, "gpu01", *earlier)
    result = invoke(inventory, state, transport, "-o", "json")
    assert result.exit_code == 0, result.output
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    assert nodes["gpu01"]["health_action"] == action
    assert nodes["gpu02"]["health_action"] == "none"
    assert (state / "health-history.json").is_file()  # this run's sample is kept for the next


def test_an_unreadable_health_history_is_reported_and_the_pass_goes_on(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    inventory, transport = fleet
    state = tmp_path / "state"
    job_id = submit(state, tmp_path, "exit 0")
    (state / "health-history.json").write_text("{not json")
    result = invoke(inventory, state, transport, "-o", "json")
    assert result.exit_code == 0, result.output
    actions = json.loads(result.stdout)["actions"]
    (error,) = [a for a in actions if a["kind"] == "error"]
    assert error["message"].startswith("health judged on this poll alone: ")
    assert "the health history is unreadable (not valid JSON); remove " in error["message"]
    assert [a["kind"] for a in actions if a["job_id"] == job_id] == ["launch", "launched"]


def test_beside_a_live_controller_reconcile_names_it_and_runs_no_pass(tmp_path: Path) -> None:
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text("nodes:\n  - {name: gone, host: 127.0.0.1, port: 9, gpus: 1}\n")
    state = tmp_path / "state"
    with open_store(state, write=True) as store:
        store.acquire_lease("host-a:41:beef", 600.0)
    leads = (
        r"controller host-a:41:beef leads \(token 1, lease until "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d\d:\d\d, in (9m\d\ds|10m00s)\): "
        r"reconcile runs no pass"
    )
    env = {**os.environ, "GPUCTL_STATE_DIR": str(state)}
    argv = [sys.executable, "-c", "from gpuctl.cli.main import run; run()"]
    argv += ["-i", str(inventory), "reconcile"]
    once = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert once.returncode == 6
    assert re.fullmatch(f"error: {leads}", once.stderr.splitlines()[0]), once.stderr
    proc = subprocess.Popen(
        [*argv, "--watch", "--interval", "0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = [proc.stderr.readline() for _ in range(2)]  # a line per pass it did not run
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert all(re.fullmatch(leads + "\n", line) for line in seen), seen
    with open_store(state, write=False) as store:
        assert store.liveness() == {}  # no pass ran: the node was never judged
