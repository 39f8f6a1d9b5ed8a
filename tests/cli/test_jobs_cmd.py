"""`gpuctl submit`, `jobs list|show`, `logs` and `cancel` as an operator sees them, on a real
SQLite store in a temporary state folder."""

import datetime as dt
import json
import re
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.core.jobs.model import Checkpoint, Event, Incarnation, IncarnationState, JobState
from gpuctl.lab import node_tools, nodestate
from gpuctl.testing.fakes import FakeTransport, ShellTransport

SECRET = "pa55-Wd0rd-61c3f5"
FILE_SECRET = "file-t0ken-9e07aa"
JOB = """\
name: train
command: [python3, train.py, --steps, "100"]
resources: {mem_per_gpu: 8GiB}
"""
ID = re.compile(r"^train-[0-9a-f]{6}$")


def gpuctl(state: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    base = {"GPUCTL_STATE_DIR": None, "GPUCTL_INVENTORY": None, "USER": "alice"}
    return CliRunner().invoke(app, ["--state-dir", str(state), *args], env={**base, **(env or {})})


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def job_file(tmp_path: Path, text: str = JOB, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def submitted_id(result: Result) -> str:
    assert result.exit_code == 0, result.output
    match = re.match(r"^submitted (\S+) \(standard, priority 0\)$", result.stdout.strip())
    assert match, result.stdout
    return match.group(1)


def launch(state: Path, job_id: str, *, node: str = "gpu-01", step: int | None = None) -> None:
    """What the control loop would record: incarnation 1 running, maybe a checkpoint."""
    store = open_store(state, write=True)
    try:
        inc = Incarnation(
            job_id=job_id,
            n=1,
            node=node,
            cards=(2,),
            gpu_uuids=("GPU-2",),
            mib_per_card=8192,
            whole=False,
            state=IncarnationState.LAUNCHING,
            started_at=store.job(job_id).submitted_at + 3,  # type: ignore[union-attr]
            run_dir=f".gpuctl/runs/{job_id}/1",
        )
        event = Event(inc.started_at, "gpuctl", "launch", "launching", job_id, node)
        store.begin_launch(inc, capacity_mib={(node, 2): 81920}, event=event)
        store.update_incarnation(job_id, 1, state=IncarnationState.RUNNING, pid=4321)
        if step is not None:
            store.add_checkpoint(
                Checkpoint(job_id, 1, step, f"/ckpt/step-{step:08d}", inc.started_at + 1, "shared")
            )
    finally:
        store.close()


# --- submit, list, show -------------------------------------------------------------------------


def test_submit_queues_the_job_and_list_shows_it(tmp_path: Path, state: Path) -> None:
    job_id = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    assert ID.match(job_id)
    listed = gpuctl(state, "jobs", "list")
    assert listed.exit_code == 0 and listed.stderr == ""
    head, row = listed.stdout.splitlines()
    assert head.split()[:9] == [
        "ID", "NAME", "OWNER", "STATE", "TIER", "PRI", "NODE", "CARDS", "INC"
    ]  # fmt: skip
    assert row.split()[:9] == [job_id, "train", "alice", "queued", "standard", "0", "-", "-", "0"]


def test_each_job_shows_who_submitted_it_and_mine_lists_only_one_s_own(
    tmp_path: Path, state: Path
) -> None:
    alices = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    other = job_file(tmp_path, JOB.replace("name: train", "name: eval"), "eval.yaml")
    bobs = submitted_id(gpuctl(state, "submit", str(other), env={"USER": "bob"}))
    everyone = json.loads(gpuctl(state, "jobs", "list", "-o", "json").stdout)
    assert [(d["id"], d["owner"]) for d in everyone] == [(alices, "alice"), (bobs, "bob")]
    mine = gpuctl(state, "jobs", "list", "--mine", env={"USER": "bob"})
    assert mine.exit_code == 0 and [r.split()[0] for r in mine.stdout.splitlines()[1:]] == [bobs]
    shown = gpuctl(state, "jobs", "show", alices)
    assert "owner        alice\n" in shown.stdout
    assert json.loads(gpuctl(state, "jobs", "show", bobs, "-o", "json").stdout)["owner"] == "bob"


def test_submit_json_is_one_document_listing_the_new_jobs(tmp_path: Path, state: Path) -> None:
    two = "jobs:\n" + "".join(
        f"  - {{name: {n}, command: [sleep, '1'], resources: {{}}}}\n" for n in ("a", "b")
    )
    result = gpuctl(state, "submit", str(job_file(tmp_path, two)), "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(d["name"], d["state"], d["incarnation"]) for d in doc] == [
        ("a", "queued", 0),
        ("b", "queued", 0),
    ]


def test_show_json_has_node_gpus_incarnation_and_the_newest_checkpoint(
    tmp_path: Path, state: Path
) -> None:
    job_id = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    launch(state, job_id, step=40)
    result = gpuctl(state, "jobs", "show", "train", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["id"], doc["name"], doc["state"]) == (job_id, "train", "running")
    assert (doc["node"], doc["gpus"], doc["incarnation"]) == ("gpu-01", [2], 1)
    assert doc["checkpoint"]["step"] == 40
    assert isinstance(doc["checkpoint"]["age_s"], float) and doc["checkpoint"]["age_s"] >= 0
    assert doc["reason"] is None
    assert [i["n"] for i in doc["incarnations"]] == [1]
    assert [e["kind"] for e in doc["events"]] == ["submit", "launch"]
    table = gpuctl(state, "jobs", "show", job_id)
    assert table.exit_code == 0
    assert "node         gpu-01  cards 2  (8.0 GiB per card)" in table.stdout
    assert "checkpoint   step 40, " in table.stdout


def test_show_writes_local_times_with_their_zone_and_json_rfc3339_in_utc(
    tmp_path: Path, state: Path, in_india: ZoneInfo
) -> None:
    job_id = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    launch(state, job_id, step=40)
    store = open_store(state, write=False)
    try:
        submitted = store.job(job_id).submitted_at  # type: ignore[union-attr]
    finally:
        store.close()
    started, committed = submitted + 3, submitted + 4

    def local(t: float) -> str:
        return dt.datetime.fromtimestamp(t, in_india).strftime("%Y-%m-%d %H:%M:%S +05:30")

    def utc(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    shown = gpuctl(state, "jobs", "show", job_id)
    assert shown.exit_code == 0, shown.output
    assert f"submitted    {local(submitted)}  (waited 3s)\n" in shown.stdout
    row = rf"^  1 +gpu-01 +2 +running +{re.escape(local(started))} +- "
    assert re.search(row, shown.stdout, re.M), shown.stdout

    (listed,) = json.loads(gpuctl(state, "jobs", "list", "-o", "json").stdout)
    assert (listed["submitted_at"], listed["first_started_at"]) == (utc(submitted), utc(started))
    assert listed["checkpoint"]["committed_at"] == utc(committed)
    assert listed["queue_wait_s"] == 3.0  # durations stay numbers of seconds
    doc = json.loads(gpuctl(state, "jobs", "show", job_id, "-o", "json").stdout)
    assert [i["started_at"] for i in doc["incarnations"]] == [utc(started)]
    assert [e["at"] for e in doc["events"]] == [utc(submitted), utc(started)]


def test_list_all_includes_finished_jobs_and_yaml_is_a_document(
    tmp_path: Path, state: Path
) -> None:
    job_id = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    assert gpuctl(state, "cancel", job_id, "--yes").exit_code == 0
    assert gpuctl(state, "jobs", "list").stdout == "no jobs\n"
    import yaml

    doc = yaml.safe_load(gpuctl(state, "jobs", "list", "--all", "-o", "yaml").stdout)
    assert [(d["id"], d["state"], d["reason"]) for d in doc] == [
        (job_id, "cancelled", "cancelled by alice")
    ]


def test_a_bad_spec_exits_2_naming_file_line_and_field_and_queues_nothing(
    tmp_path: Path, state: Path
) -> None:
    bad = job_file(tmp_path, "name: j\ncommand: [x]\nresources:\n  gpu: 2\n", "bad.yaml")
    result = gpuctl(state, "submit", str(job_file(tmp_path)), str(bad))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"error: {bad}:4: resources.gpu: unknown key 'gpu'\nhint: did you mean 'gpus'?\n"
    )
    assert gpuctl(state, "jobs", "list", "--all").stdout == "no jobs\n"


def test_submit_refuses_a_command_that_can_never_launch(tmp_path: Path, state: Path) -> None:
    nul = job_file(tmp_path, 'name: j\ncommand: [python3, "a\\0b"]\nresources: {}\n', "nul.yaml")
    huge = job_file(tmp_path, f"name: j\ncommand: [python3, {'x' * 200_000}]\nresources: {{}}\n")
    for path, field in (
        (nul, "command[1]: an argument cannot hold a NUL"),
        (huge, "command[1]: too long"),
    ):
        result = gpuctl(state, "submit", str(path))
        assert result.exit_code == 2
        assert result.stderr.startswith(f"error: {path}:2: {field}")
        assert "Traceback" not in result.output
    assert gpuctl(state, "jobs", "list", "--all").stdout == "no jobs\n"


def test_submit_needs_a_command(tmp_path: Path, state: Path) -> None:
    path = job_file(tmp_path, "name: j\nresources: {}\n")
    result = gpuctl(state, "submit", str(path))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {path}:1: missing required key 'command'")


def test_a_second_active_job_of_the_same_name_needs_replace(tmp_path: Path, state: Path) -> None:
    first = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    again = gpuctl(state, "submit", str(job_file(tmp_path)))
    assert again.exit_code == 1
    assert f"is already active as {first} (queued)" in again.stderr
    second = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path)), "--replace"))
    doc = json.loads(gpuctl(state, "jobs", "list", "--all", "-o", "json").stdout)
    assert [(d["id"], d["state"]) for d in doc] == [(first, "cancelled"), (second, "queued")]


# --- the store fails closed ------------------------------------------------------------------


def test_a_corrupt_store_refuses_mutating_commands_with_exit_6(tmp_path: Path, state: Path) -> None:
    job_id = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    for extra in state.glob("state.db-*"):
        extra.unlink()
    (state / "state.db").write_bytes(b"this is not a database" * 100)
    for args in (("submit", str(job_file(tmp_path))), ("cancel", job_id, "--yes")):
        result = gpuctl(state, *args)
        assert result.exit_code == 6, result.output
        assert result.stdout == ""
        assert result.stderr.startswith("error: ")
        assert "gpuctl db check" in result.stderr


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_of_a_running_job_asks_the_loop_and_force_is_recorded(
    tmp_path: Path, state: Path
) -> None:
    job_id = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    launch(state, job_id)
    unasked = gpuctl(state, "cancel", "train")
    assert unasked.exit_code == 2
    assert unasked.stderr == (  # as every confirming verb without a terminal or --yes
        f"cancel {job_id} (running)? [y/N]: \n"
        "error: no answer (no terminal): nothing changed\n"
        "hint: pass --yes to apply without a terminal\n"
    )
    result = gpuctl(state, "cancel", "train", "--yes", "--force")
    assert result.exit_code == 0
    assert (
        result.stdout == f"{job_id}: cancel requested; the control loop stops it (KILL at once)\n"
    )
    doc = json.loads(gpuctl(state, "jobs", "show", job_id, "-o", "json").stdout)
    assert (doc["state"], doc["cancel_requested"]) == ("running", True)
    cancel_event = doc["events"][-1]
    assert (cancel_event["kind"], cancel_event["actor"], cancel_event["data"]["force"]) == (
        "cancel",
        "alice",
        True,
    )


def test_cancel_of_an_unknown_job_says_so(state: Path) -> None:
    result = gpuctl(state, "cancel", "nope", "--yes")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no job 'nope'\n")


# --- secrets ----------------------------------------------------------------------------------


def test_a_secret_value_never_reaches_output_the_database_or_events(
    tmp_path: Path, state: Path
) -> None:
    token = tmp_path / "hf.token"
    token.write_text(FILE_SECRET + "\n")
    spec = JOB + "secret_env:\n  - API_KEY\n  - HF_TOKEN: {file: hf.token}\n"
    env = {"API_KEY": SECRET}
    results = [gpuctl(state, "submit", str(job_file(tmp_path, spec)), env=env)]
    job_id = submitted_id(results[0])
    launch(state, job_id)
    for args in (
        ("jobs", "list", "-o", "wide"),
        ("jobs", "list", "-o", "json"),
        ("jobs", "show", job_id),
        ("jobs", "show", job_id, "-o", "json"),
        ("cancel", job_id, "--yes"),
    ):
        results.append(gpuctl(state, *args, env=env))
    for r in results:
        assert r.exit_code == 0, r.output
        assert SECRET not in r.stdout + r.stderr
        assert FILE_SECRET not in r.stdout + r.stderr
    assert "API_KEY" in results[4].stdout  # the name is there; the value is not
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "state.db" for p in files)
    for p in files:
        data = p.read_bytes()
        assert SECRET.encode() not in data and FILE_SECRET.encode() not in data, p
    store = open_store(state, write=False)
    try:
        events = json.dumps(
            [e.message for e in store.events()] + [str(e.data) for e in store.events()]
        )
    finally:
        store.close()
    assert SECRET not in events and FILE_SECRET not in events


def test_a_missing_secret_is_named_and_nothing_is_queued(tmp_path: Path, state: Path) -> None:
    spec = JOB + "secret_env: [API_KEY]\n"
    result = gpuctl(state, "submit", str(job_file(tmp_path, spec)), env={"API_KEY": None})  # type: ignore[dict-item]
    assert result.exit_code == 2
    assert result.stderr.startswith("error: secret_env: API_KEY is not set in the environment\n")
    assert gpuctl(state, "jobs", "list", "--all").stdout == "no jobs\n"


# --- logs -------------------------------------------------------------------------------------


def test_logs_read_the_node_log_through_the_job_runner_and_follow_to_the_end(
    tmp_path: Path, state: Path
) -> None:
    home = tmp_path / "home"  # the node: a local shell with its own HOME
    inventory = job_file(tmp_path, "nodes:\n  - {name: gpu-01, host: 127.0.0.1}\n", "inv.yaml")
    job_id = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))

    def logs(*args: str) -> Result:
        obj = AppContext(transport_factory=lambda: ShellTransport({"gpu-01": {"HOME": str(home)}}))
        return CliRunner().invoke(
            app, ["--state-dir", str(state), "-i", str(inventory), "logs", *args], obj=obj
        )

    waiting = logs(job_id)
    assert waiting.exit_code == 1
    assert "has not started yet (queued): no log" in waiting.stderr
    launch(state, job_id)
    run_dir = home / ".gpuctl" / "runs" / job_id / "1"
    run_dir.mkdir(parents=True)
    (run_dir / "log").write_bytes("step 1 é\n\x1b[31mstep 2\x1b[0m\n".encode())
    result = logs("train")
    assert result.exit_code == 0, result.output
    assert result.stdout == "step 1 é\nstep 2\n"  # terminal escape sequences are stripped
    assert result.stderr == ""
    store = open_store(state, write=True)
    try:
        store.update_job(job_id, state=JobState.SUCCEEDED)
    finally:
        store.close()
    followed = logs("-f", job_id)
    assert followed.exit_code == 0, followed.output
    assert followed.stdout == "step 1 é\nstep 2\n"
    assert followed.stderr == (f"[gpuctl] incarnation 1 on gpu-01\n[gpuctl] {job_id} succeeded\n")


# --- the numbers line for `gpuctl status` ----------------------------------------------------


def test_the_numbers_line_shows_each_number_or_na(tmp_path: Path, state: Path) -> None:
    from gpuctl.cli.numbers_view import numbers_line
    from gpuctl.ops.jobs import fleet_numbers

    job_id = submitted_id(gpuctl(state, "submit", str(job_file(tmp_path))))
    launch(state, job_id, step=10)
    store = open_store(state, write=False)
    try:
        submitted = store.job(job_id).submitted_at  # type: ignore[union-attr]
        line = numbers_line(fleet_numbers(store, now=submitted + 64))
    finally:
        store.close()
    assert line == (
        "jobs: queue wait p50 3s p95 3s, 0 waiting (oldest N/A) · checkpoint age max 1m00s "
        "p95 1m00s · failover N/A (0 of 0), 0 drain moves · preemptions 0.00/h\n"
    )


# --- a job no node could ever take ----------------------------------------------------------------

BIG = """\
name: huge
command: [python3, train.py]
resources: {mem_per_gpu: 100GiB}
"""


def lab_fleet(tmp_path: Path) -> tuple[Path, FakeTransport]:
    """An inventory of two lab nodes of 2 H100 80GB cards each, answering through a fake
    transport that records every call."""
    node_tools.install_node_tools(tmp_path / "bin", python="/usr/bin/python3")
    shells = {}
    for i, name in enumerate(("gpu01", "gpu02")):
        lab = tmp_path / f"{name}.json"
        node = nodestate.new_node_state(
            name, gpus=2, model="NVIDIA H100 80GB HBM3", mem_gib=80, node_index=i
        )
        nodestate.write_state(lab, node)
        env = {
            "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
            "GPUCTL_LAB_STATE": str(lab),
            "GPUCTL_LAB_NODE": name,
        }
        shells[name] = ShellTransport({name: env})
    transport = FakeTransport(
        {n: (lambda n, c, s=s: s.run(n, c, timeout_s=10)) for n, s in shells.items()}
    )
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        "nodes:\n"
        "  - {name: gpu01, host: 127.0.0.1, port: 2201}\n"
        "  - {name: gpu02, host: 127.0.0.1, port: 2202}\n"
    )
    return inventory, transport


def on_fleet(state: Path, inventory: Path, transport: FakeTransport, *args: str) -> Result:
    obj = AppContext(transport_factory=lambda: transport, env={"USER": "alice"})
    argv = ["--state-dir", str(state), "-i", str(inventory), *args]
    return CliRunner().invoke(app, argv, obj=obj)


def test_submit_refuses_a_job_no_node_could_ever_take_naming_file_field_and_largest_card(
    tmp_path: Path, state: Path
) -> None:
    inventory, transport = lab_fleet(tmp_path)
    spec = job_file(tmp_path, BIG, "huge.yaml")
    result = on_fleet(state, inventory, transport, "submit", str(spec))
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert f"{spec}:1: resources.mem_per_gpu: 100.0 GiB per card" in result.stderr
    assert "the largest card seen is 79.6 GiB" in result.stderr
    assert "--queue-anyway" in result.stderr
    assert gpuctl(state, "jobs", "list").stdout == "no jobs\n"  # nothing was queued
    fits = job_file(tmp_path, JOB)  # 8 GiB a card: polled, fits, queued
    assert submitted_id(on_fleet(state, inventory, transport, "submit", str(fits)))


def test_queue_anyway_queues_it_without_polling_and_list_says_why_it_waits(
    tmp_path: Path, state: Path
) -> None:
    inventory, transport = lab_fleet(tmp_path)
    spec = job_file(tmp_path, BIG, "huge.yaml")
    result = on_fleet(state, inventory, transport, "submit", str(spec), "--queue-anyway")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("submitted huge-")
    assert transport.calls == []  # no poll: the operator said queue it
    listed = on_fleet(state, inventory, transport, "jobs", "list")
    assert listed.exit_code == 0, listed.output
    head, row = listed.stdout.splitlines()
    assert head.split()[-1] == "REASON"
    reason = row[head.index("REASON") :]
    assert reason.startswith("no node can take 1 × 100.0 GiB: 2 nodes: cards smaller than")
    shown = on_fleet(state, inventory, transport, "jobs", "show", "huge")
    assert "reason       no node can take 1 × 100.0 GiB" in shown.stdout
    assert "(waiting " in shown.stdout and "N/A" not in shown.stdout


def test_submit_without_an_inventory_says_the_fit_was_not_checked(
    tmp_path: Path, state: Path
) -> None:
    result = gpuctl(state, "submit", str(job_file(tmp_path, BIG)))
    assert submitted_id(result)
    assert "whether the jobs could ever fit was not checked" in result.stderr
