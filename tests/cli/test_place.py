"""`gpuctl place` as an operator sees it, on a saved snapshot (no fleet is touched)."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.core.model import fleet_from_dict
from gpuctl.core.timefmt import machine_times
from gpuctl.errors import ConnectRefused
from gpuctl.lab import node_tools, nodestate
from gpuctl.ops.moves import nodeops
from gpuctl.testing.fakes import FakeTransport, ShellTransport

ROOT = Path(__file__).parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "fleet-5-nodes.json"
EXAMPLES = ROOT / "examples" / "jobs"
BAD = ROOT / "tests" / "fixtures" / "jobs" / "bad"

EIGHT_H100 = "name: big\nresources: {gpus: 8, mem_per_gpu: whole, gpu_models: [H100]}\n"


NO_STORE = Path("/nonexistent/gpuctl-state")  # read-only: an empty store, nothing created


def run(*args: str, state: Path = NO_STORE) -> Result:
    argv = ["--state-dir", str(state), "place", *args]
    return CliRunner().invoke(app, argv, env={"GPUCTL_INVENTORY": None})


def job_file(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_example_job_fits_the_fleet_and_exits_0() -> None:
    result = run(*sorted(str(p) for p in EXAMPLES.glob("*.yaml")), "--snapshot", str(SNAPSHOT))
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith("fleet version ")
    assert lines[1].split()[:4] == ["JOB", "TIER", "PRIORITY", "NODE"]
    train = next(line for line in lines if line.startswith("train-llama"))
    assert train.split()[3:6] == ["gpu-01", "0,1,2,3", "whole"]
    eval_line = next(line for line in lines if line.startswith("eval-llama"))
    assert eval_line.split()[3] == "gpu-02"  # avoids the training run's node
    assert "6 of 6 job(s) placed" in result.stdout


def test_a_snapshot_saved_with_rfc3339_times_plans_as_one_saved_with_unix_times(
    tmp_path: Path,
) -> None:
    doc = machine_times(json.loads(SNAPSHOT.read_text()))  # as `status -o json` prints it now
    assert doc["taken_at"] == "2026-11-30T00:53:20Z"
    saved = tmp_path / "fleet.json"
    saved.write_text(json.dumps(doc))
    job = str(EXAMPLES / "train-4xh100.yaml")
    new, old = (run(job, "--snapshot", str(p), "-o", "json") for p in (saved, SNAPSHOT))
    assert (new.exit_code, old.exit_code) == (0, 0), new.output
    assert json.loads(new.stdout) == json.loads(old.stdout)
    saved.write_text(json.dumps({**doc, "taken_at": "yesterday"}))
    bad = run(job, "--snapshot", str(saved))
    assert bad.exit_code == 2 and bad.stdout == ""
    assert bad.stderr.startswith(f"error: {saved}: not a fleet snapshot: 'yesterday' is not an RFC")


def test_json_output_is_one_plan_document_on_the_snapshot_version(tmp_path: Path) -> None:
    jobs = [str(EXAMPLES / "train-4xh100.yaml"), str(job_file(tmp_path, EIGHT_H100))]
    result = run(*jobs, "--snapshot", str(SNAPSHOT), "-o", "json")
    assert result.exit_code == 3
    doc = json.loads(result.stdout)
    snapshot_version = fleet_from_dict(json.loads(SNAPSHOT.read_text())).version
    assert doc["version"] == snapshot_version
    assert doc["summary"] == {
        "jobs": 2,
        "placed": 1,
        "unplaced": 1,
        "nodes": 5,
        "schedulable_nodes": 2,
    }
    assert set(doc) >= {"settings", "utilization_before", "utilization_after", "predicted"}
    big = next(j for j in doc["jobs"] if j["job"] == "big")
    assert big["placed"] is False
    counts: dict[str, int] = {}
    for r in big["rejections"]:
        counts[r["constraint"]] = counts.get(r["constraint"], 0) + r["count"]
    assert counts == {"unschedulable": 3, "gpu_model": 1, "empty_cards": 1}
    train = next(j for j in doc["jobs"] if j["job"] == "train-llama")
    assert (train["node"], train["cards"], train["whole"]) == ("gpu-01", [0, 1, 2, 3], True)
    assert set(train) >= {"score", "runner_up", "card_uuids", "shape", "allocation"}


def test_yaml_output_is_the_same_document() -> None:
    result = run(str(EXAMPLES / "infer-slice.yaml"), "--snapshot", str(SNAPSHOT), "-o", "yaml")
    assert result.exit_code == 0
    doc = yaml.safe_load(result.stdout)
    assert doc["jobs"][0]["job"] == "infer-small"


def test_unplaced_jobs_exit_3_with_the_reason(tmp_path: Path) -> None:
    jobs = [str(EXAMPLES / "train-4xh100.yaml"), str(job_file(tmp_path, EIGHT_H100))]
    result = run(*jobs, "--snapshot", str(SNAPSHOT))
    assert result.exit_code == 3
    assert "1 of 2 job(s) placed" in result.stdout
    assert (
        "  big: no node can take 8 × whole cards of model H100: 1 node: cordoned; "
        "1 node: health unknown; 1 node: unreachable (timeout); 1 node: no card of model H100; "
        "1 node: fewer than 8 empty usable cards"
    ) in result.stdout


def test_explain_says_why_and_lists_the_nodes_that_could_not(tmp_path: Path) -> None:
    result = run(str(EXAMPLES / "eval-affinity.yaml"), "--snapshot", str(SNAPSHOT), "--explain")
    assert result.exit_code == 0
    out = result.stdout
    assert "eval-llama -> gpu-" in out
    assert "  shape: 1 × 37.3 GiB slice" in out
    assert "1 node [unschedulable] unreachable (timeout): gpu-04" in out
    assert "band: standard-tier work is admitted while" in out


def test_a_node_cordoned_in_the_state_store_is_not_chosen_and_explain_says_why(
    tmp_path: Path,
) -> None:
    job = str(EXAMPLES / "train-4xh100.yaml")
    state = tmp_path / "state"
    before = run(job, "--snapshot", str(SNAPSHOT), state=state)
    assert before.exit_code == 0, before.output
    assert not state.exists()  # a read-only look creates no store
    assert "train-llama -> gpu-01" in run(job, "--snapshot", str(SNAPSHOT), "--explain").stdout
    with open_store(state, write=True) as store:
        nodeops.cordon(store, "gpu-01", reason="fan noise", operator="alice", clock=SystemClock())
    result = run(job, "--snapshot", str(SNAPSHOT), "--explain", state=state)
    assert result.exit_code == 3, result.output  # gpu-01 was the only node with 4 H100 cards
    assert "train-llama -> " not in result.stdout
    assert "1 node [unschedulable] cordoned: fan noise: gpu-01" in result.stdout
    assert "0 of 1 job(s) placed" in result.stdout


def test_band_max_stops_standard_work_at_the_given_edge(tmp_path: Path) -> None:
    job = str(job_file(tmp_path, EIGHT_H100))
    assert run(job, "--snapshot", str(SNAPSHOT)).exit_code == 0
    result = run(job, "--snapshot", str(SNAPSHOT), "--band-max", "0.5")
    assert result.exit_code == 3
    assert (
        "  big: standard-tier admission stops at 50.0% of fleet GPU memory (the failover "
        "headroom): utilization is 0.0%, this job would take it to 66.6%; other nodes: "
    ) in result.stdout


def test_the_standard_limit_is_the_lower_of_band_max_and_one_minus_headroom() -> None:
    job = str(EXAMPLES / "infer-slice.yaml")
    args = ["--snapshot", str(SNAPSHOT), "-o", "json", "--band-max", "1.0", "--headroom", "0.1"]
    settings = json.loads(run(job, *args).stdout)["settings"]
    assert (settings["standard_limit"], settings["spot_limit"]) == (0.9, 1.0)


def test_whole_card_over_decides_whole_card_or_slice(tmp_path: Path) -> None:
    job = str(job_file(tmp_path, "name: mid\nresources: {mem_per_gpu: 48GiB}\n"))
    whole = run(job, "--snapshot", str(SNAPSHOT), "-o", "json")
    assert json.loads(whole.stdout)["jobs"][0]["whole"] is True
    sliced = run(job, "--snapshot", str(SNAPSHOT), "-o", "json", "--whole-card-over", "0.75")
    assert json.loads(sliced.stdout)["jobs"][0]["whole"] is False


def test_policy_changes_the_choice_and_an_unknown_one_is_a_usage_error() -> None:
    job = str(EXAMPLES / "infer-slice.yaml")
    first = run(job, "--snapshot", str(SNAPSHOT), "--policy", "first-fit", "-o", "json")
    assert json.loads(first.stdout)["settings"]["policy"] == "first-fit"
    result = run(job, "--snapshot", str(SNAPSHOT), "--policy", "nope")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "error: --policy: unknown policy 'nope'" in result.stderr
    assert "hint: known: " in result.stderr


@pytest.mark.parametrize(
    ("option", "value"),
    [("--band-max", "1.5"), ("--band-max", "0"), ("--whole-card-over", "2"), ("--headroom", "0.3")],
)
def test_fractions_outside_0_to_1_are_usage_errors(option: str, value: str) -> None:
    result = run(str(EXAMPLES / "infer-slice.yaml"), "--snapshot", str(SNAPSHOT), option, value)
    assert result.exit_code == 2
    assert f"error: {option} must be a fraction" in result.stderr


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("unknown-key.yaml", ":3: resources.gpu: unknown key 'gpu'"),
        ("mem-without-unit.yaml", ":3: resources.mem_per_gpu: 24: a bare number is a fraction"),
        ("bad-yaml.yaml", ":3: invalid YAML"),
    ],
)
def test_a_bad_job_file_exits_2_naming_file_line_and_field(name: str, expected: str) -> None:
    result = run(str(EXAMPLES / "infer-slice.yaml"), str(BAD / name), "--snapshot", str(SNAPSHOT))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {BAD / name}{expected}")
    assert "Traceback" not in result.stderr


def test_a_missing_job_file_exits_2(tmp_path: Path) -> None:
    result = run(str(tmp_path / "nope.yaml"), "--snapshot", str(SNAPSHOT))
    assert result.exit_code == 2
    assert f"error: {tmp_path / 'nope.yaml'}: job spec file not found" in result.stderr


def test_a_bad_snapshot_exits_2_naming_the_file(tmp_path: Path) -> None:
    snap = job_file(tmp_path, "{oops", "snap.json")
    result = run(str(EXAMPLES / "infer-slice.yaml"), "--snapshot", str(snap))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {snap}:1: the snapshot is not JSON")
    assert "hint: save one with `gpuctl status -o json > FILE`" in result.stderr


def test_without_a_snapshot_or_an_inventory_place_says_how_to_name_the_fleet() -> None:
    result = run(str(EXAMPLES / "infer-slice.yaml"))
    assert result.exit_code == 2
    assert "error: no inventory given" in result.stderr


def test_node_names_from_a_snapshot_cannot_smuggle_escape_sequences(tmp_path: Path) -> None:
    data = json.loads(SNAPSHOT.read_text())
    data["nodes"][0]["name"] = "gpu-01\x1b[31mred"
    snap = job_file(tmp_path, json.dumps(data), "snap.json")
    result = run(str(EXAMPLES / "train-4xh100.yaml"), "--snapshot", str(snap))
    assert result.exit_code == 0
    assert "\x1b" not in result.stdout
    assert "gpu-01red" in result.stdout


def test_on_the_live_fleet_place_polls_once_and_skips_nodes_that_do_not_answer(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state.json"
    nodestate.write_state(
        state,
        nodestate.new_node_state(
            "gpu01", gpus=2, model="NVIDIA H100 80GB HBM3", mem_gib=80, node_index=0
        ),
    )
    node_tools.install_node_tools(tmp_path / "bin", python="/usr/bin/python3")
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "GPUCTL_LAB_STATE": str(state),
        "GPUCTL_LAB_NODE": "gpu01",
    }
    shell = ShellTransport({"gpu01": env})
    transport = FakeTransport(
        {
            "gpu01": lambda n, c: shell.run(n, c, timeout_s=10),
            "gpu02": ConnectRefused("connection refused"),
        }
    )
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        "nodes:\n"
        "  - {name: gpu01, host: 127.0.0.1, port: 2201}\n"
        "  - {name: gpu02, host: 127.0.0.1, port: 2202}\n"
    )
    job = job_file(tmp_path, "name: one\nresources: {gpus: 1, gpu_models: [H100]}\n")
    ctx = AppContext(transport_factory=lambda: transport)
    argv = ["-i", str(inventory), "--state-dir", str(tmp_path / "state"), "place", str(job)]
    result = CliRunner().invoke(app, [*argv, "-o", "json"], obj=ctx)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["jobs"][0]["node"], doc["jobs"][0]["cards"]) == ("gpu01", [0])
    assert doc["summary"]["schedulable_nodes"] == 1
    assert [r["summary"] for r in doc["jobs"][0]["rejections"]] == ["unreachable (refused)"]
    assert sorted({name for name, _ in transport.calls}) == ["gpu01", "gpu02"]
