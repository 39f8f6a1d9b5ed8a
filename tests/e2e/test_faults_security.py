"""Hostile or sensitive input on a lab fleet: a secret's value never shows in logs, the database,
errors or the node's process list; shell metacharacters in names and commands run nothing."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import threading
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpuctl.adapters.store import open_store
from gpuctl.cli.main import app
from gpuctl.core.jobs.model import JobState
from gpuctl.ops.invariants import check_invariants
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import PYTHON, gpuctl, job_processes, kill_job_processes, rig, shared_dir

pytestmark = pytest.mark.e2e

SHOW_SECRETS = (
    "import hashlib, os, time\n"
    "for name in ('API_TOKEN', 'FILE_TOKEN'):\n"
    "    print(name, hashlib.sha256(os.environ[name].encode()).hexdigest(), flush=True)\n"
    "time.sleep(300)\n"
)


class CommandLines:
    """Every process's command line, read again and again while something runs."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        while not self.stop.is_set():
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        self.seen.add((entry / "cmdline").read_bytes())
                    except OSError:
                        continue
            self.stop.wait(0.01)

    def __enter__(self) -> CommandLines:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def files_under(*folders: Path) -> dict[Path, bytes]:
    found = {}
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                found[path] = path.read_bytes()
    return found


def test_a_secret_value_never_reaches_logs_the_database_errors_or_the_process_list(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    token, file_token = "tok-" + secrets.token_hex(16), "ftk-" + secrets.token_hex(16)
    forms = [s.encode() for s in (token, file_token)]
    forms += [base64.b64encode(f) for f in forms]  # as the values travel on the launch's stdin
    token_file = tmp_path / "file_token"
    token_file.write_text(file_token + "\n")
    state, inventory = tmp_path / "state", own_lab.lab.inventory_path
    spec = tmp_path / "jobs.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "jobs": [
                    {
                        "name": name,
                        "command": [PYTHON, "-c", SHOW_SECRETS],
                        "resources": {"gpus": 1, "mem_per_gpu": "1GiB"},
                        "secret_env": ["API_TOKEN", {"FILE_TOKEN": {"file": str(token_file)}}],
                        "restart_budget": 0,
                        **extra,
                    }
                    for name, extra in (("holder", {}), ("broken", {"workdir": "/nonexistent"}))
                ]
            }
        )
    )
    env = {"API_TOKEN": token}
    outputs: list[str] = []
    try:
        with CommandLines() as ps:  # while the secrets are read, sent and the jobs start
            done = gpuctl(state, inventory, "submit", str(spec), env=env)
            assert done.returncode == 0, done.stderr
            outputs += [done.stdout, done.stderr]
            done = gpuctl(state, inventory, "reconcile", "-o", "wide", env=env)
            assert done.returncode == 0, done.stderr
            outputs += [done.stdout, done.stderr]
        cli = CliRunner()
        ran = {}
        for args in (
            ("jobs", "show", "holder", "-o", "json"),
            ("jobs", "show", "broken"),
            ("jobs", "list", "--all", "-o", "wide"),
            ("reconcile", "-o", "json"),
            ("logs", "holder"),
            ("--debug", "logs", "broken"),  # an error, with --debug
            ("submit", str(spec)),  # refused: the names are taken
            ("db", "check", "-o", "json"),
        ):
            result = cli.invoke(
                app, ["--state-dir", str(state), "-i", str(inventory), *args], env=env
            )
            ran[args[:3]] = result.stdout
            outputs += [result.stdout, result.stderr, repr(result.exception)]
        assert json.loads(ran["jobs", "show", "holder"])["state"] == JobState.RUNNING
        assert "launch_failed" in ran["jobs", "show", "broken"]  # an error message, shown
        environs = {}  # the processes that hold a secret in their environment
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    environs[int(entry.name)] = (entry / "environ").read_bytes()
                except OSError:
                    continue

        # the job got both values (it prints their digests, never the values)
        log = ran["logs", "holder"]
        for name, value in (("API_TOKEN", token), ("FILE_TOKEN", file_token)):
            assert f"{name} {hashlib.sha256(value.encode()).hexdigest()}" in log
        text = "\n".join(outputs)
        for form in forms:
            assert form.decode() not in text, "a gpuctl output shows the secret"
            assert not [c for c in ps.seen if form in c], "a command line shows the secret"
            leaks = [p for p, data in files_under(state, own_lab.dir).items() if form in data]
            assert leaks == [], "files hold the secret"
        with open_store(state, write=False) as store:
            assert check_invariants(store, capacity_mib=store.card_capacities()) == []
        holder = {pid for (job, _), pids in job_processes(own_lab).items() for pid in pids}
        assert holder  # the job itself holds it, in its own environment: nothing else does
        assert {p for p, data in environs.items() if forms[0] in data} <= holder
    finally:
        kill_job_processes(own_lab)


PAYLOADS = (
    "$(touch {c})",
    "`touch {c}`",
    "; touch {c}",
    "| touch {c}",
    "&& touch {c}",
    "' ; touch {c} ; '",
    '" ; touch {c} ; "',
    "\ntouch {c}\n",
    "$HOME ~ * ?",
    "-e",
)
SHOW_ARGS = (
    "import json, os, sys\n"
    "print(json.dumps([sys.argv[1:], os.environ['PAYLOAD'], os.getcwd(),"
    " os.environ['GPUCTL_CHECKPOINT_DIR']]))\n"
)


def test_shell_metacharacters_in_names_and_commands_run_nothing(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    shared = shared_dir(own_lab)
    canary = shared / "canary"
    payloads = [p.format(c=canary) for p in PAYLOADS]
    state, inventory = tmp_path / "state", own_lab.lab.inventory_path

    # names: refused before anything runs
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump({"name": f"x;touch {canary}", "command": ["true"], "resources": {}})
    )
    cli = CliRunner()

    def run(inventory: Path, *args: str) -> int:
        return cli.invoke(app, ["--state-dir", str(state), "-i", str(inventory), *args]).exit_code

    submitted = cli.invoke(app, ["--state-dir", str(state), "submit", str(bad)])
    assert submitted.exit_code == 2 and "name: " in submitted.stderr, submitted.stderr
    assert run(inventory, "jobs", "show", payloads[0]) == 1
    assert run(inventory, "logs", payloads[1]) == 1
    assert run(inventory, "cancel", payloads[2], "--yes") == 1
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"nodes": [{"name": f"n;touch {canary}", "host": "x"}]}))
    assert run(nodes, "status") == 2

    # a command, its environment, its working dir and checkpoint dir full of them: run literally
    # (folder names cannot hold the canary's path: theirs touch a bare name, in whatever folder)
    local = [p.format(c="pwned") for p in PAYLOADS[:3]]
    workdir = shared / f"w {local[0]} {local[1]}"
    workdir.mkdir()
    os.chmod(workdir, 0o777)
    body = yaml.safe_dump(
        {
            "command": [PYTHON, "-c", SHOW_ARGS, *payloads],
            "workdir": str(workdir),
            "env": {"PAYLOAD": payloads[0]},
            "resources": {"gpus": 1, "mem_per_gpu": "1GiB"},
            "checkpoint": {"dir": f"{shared}/ck {local[2]}/{{job_id}}", "sync": "shared"},
        }
    )
    with rig(own_lab, tmp_path) as r:
        job = r.submit("literal", body)
        r.until(lambda: r.job(job.id).state.terminal, "the job ended")
        assert r.job(job.id).state is JobState.SUCCEEDED, r.history(job.id)
        argv, env_value, cwd, ckpt = json.loads(r.log(job.id, 1))
        assert argv == payloads and env_value == payloads[0] and cwd == str(workdir)
        assert ckpt == f"{shared}/ck {local[2]}/{job.id}"
        r.check()
    assert not canary.exists()
    assert not list(own_lab.dir.rglob("pwned*"))  # the nodes' homes and the shared folder
