"""`gpuctl cordon`, `uncordon`, `drain`: what they ask, print and change, and their exit codes.
Nodes are local shells (the lab's node tools, no sshd) running real job processes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.store import open_store
from gpuctl.cli.context import AppContext
from gpuctl.cli.main import app
from gpuctl.config.inventory import load_inventory
from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.ops import jobs as service
from gpuctl.testing.fakes import ShellTransport, shell_fleet

NODES = ("gpu01", "gpu02")
# ignores SIGUSR1 (writes no checkpoint), exits 0 on SIGTERM
PATIENT = "trap '' USR1; trap 'exit 0' TERM; while :; do sleep 0.2; done"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[Path, ShellTransport]]:
    inventory, transport = shell_fleet(tmp_path, NODES)
    yield inventory, transport
    stop_all(tmp_path / "state", inventory, transport)


def stop_all(state: Path, inventory: Path, transport: ShellTransport) -> None:
    if not (state / "state.db").exists():
        return
    specs = load_inventory(inventory).by_name()
    runner = SshJobRunner(transport)
    with open_store(state, write=False) as store:
        for inc in store.incarnations():
            runner.signal(specs[inc.node], inc.job_id, inc.n, "KILL")


def gpuctl(fleet: tuple[Path, ShellTransport], state: Path, *args: str, answer: str = "") -> Result:
    inventory, transport = fleet
    ctx = AppContext(transport_factory=lambda: transport, env={**os.environ, "USER": "alice"})
    argv = ["-i", str(inventory), "--state-dir", str(state), *args]
    return CliRunner().invoke(app, argv, obj=ctx, input=answer)


def running(fleet: tuple[Path, ShellTransport], state: Path, tmp_path: Path, n: int = 1) -> None:
    """`n` whole-card jobs submitted and launched (one reconcile pass)."""
    for i in range(n):
        spec = tmp_path / f"job{i}.yaml"
        spec.write_text(
            f"name: patient{i}\n"
            f"command: [sh, -c, {json.dumps(PATIENT)}]\n"
            "resources: {gpus: 1, mem_per_gpu: whole}\n"
        )
        with open_store(state, write=True) as store:
            service.submit(store, load_specs([spec]), actor="test", clock=SystemClock())
    result = gpuctl(fleet, state, "reconcile")
    assert result.exit_code == 0, result.output


def test_cordon_asks_first_and_records_the_operator_and_uncordon_lifts_it(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    declined = gpuctl(fleet, state, "cordon", "gpu01", "--reason", "fan noise", answer="n\n")
    assert declined.exit_code == 1 and "nothing changed" in declined.stderr
    assert declined.stdout == ""
    done = gpuctl(fleet, state, "cordon", "gpu01", "--reason", "fan noise", "--yes")
    assert done.exit_code == 0, done.output
    assert done.stdout == "gpu01 cordoned by alice: fan noise\n"
    with open_store(state, write=False) as store:
        (cordon,) = store.cordons()
    assert (cordon.node, cordon.reason, cordon.operator, cordon.source) == (
        "gpu01",
        "fan noise",
        "alice",
        "operator",
    )
    lifted = gpuctl(fleet, state, "uncordon", "gpu01", answer="y\n")
    assert lifted.exit_code == 0, lifted.output
    assert "cordoned" in lifted.stderr and "by alice" in lifted.stderr  # the question
    assert lifted.stdout == "gpu01 uncordoned (was: fan noise, by alice)\n"
    again = gpuctl(fleet, state, "uncordon", "gpu01", "--yes")
    assert again.exit_code == 0 and "not cordoned" in again.stderr


def test_an_unknown_node_or_a_missing_reason_is_bad_input(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    unknown = gpuctl(fleet, state, "cordon", "gpu09", "--reason", "x", "--yes")
    assert unknown.exit_code == 2 and "unknown node 'gpu09'" in unknown.stderr
    assert unknown.stdout == ""
    bare = gpuctl(fleet, state, "drain", "gpu01", "--yes")
    assert bare.exit_code == 2 and "--reason" in bare.output
    blank = gpuctl(fleet, state, "drain", "gpu01", "--reason", " ", "--yes")
    assert blank.exit_code == 2 and "must say why" in blank.stderr


def test_a_dry_run_prints_the_plan_as_one_document_and_changes_nothing(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    running(fleet, state, tmp_path)
    with open_store(state, write=False) as store:
        (inc,) = store.incarnations()
        before = len(store.events())
    result = gpuctl(fleet, state, "drain", inc.node, "--reason", "bios", "--dry-run", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (move,) = doc["plan"]["moves"]
    assert doc["dry_run"] is True and move["job_id"] == inc.job_id
    assert move["to_node"] not in (None, inc.node) and doc["plan"]["movable"] == 1
    assert "nothing changed" in result.stderr
    with open_store(state, write=False) as store:
        assert store.cordons() == [] and len(store.events()) == before


def test_a_drain_moves_the_job_and_exits_0(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    running(fleet, state, tmp_path)
    with open_store(state, write=False) as store:
        (inc,) = store.incarnations()
    args = ["drain", inc.node, "--reason", "bios update", "--grace", "5"]
    result = gpuctl(fleet, state, *args, "--checkpoint-wait", "0.2", answer="y\n")
    assert result.exit_code == 0, result.output
    assert f"drain {inc.node}: bios update (not cordoned yet)" in result.stdout
    assert f"{inc.node}: 1 of 1 job(s) moved; cordoned" in result.stdout
    assert f"{inc.job_id}: moved: moved from {inc.node}" in result.stderr
    with open_store(state, write=False) as store:
        (cordon,) = store.cordons()
        old, new = store.incarnations(inc.job_id)
        job = store.job(inc.job_id)
    assert (cordon.node, cordon.operator, cordon.reason) == (inc.node, "alice", "bios update")
    assert (old.state, old.end_reason) == (IncarnationState.EXITED, "drained")
    assert new.node != inc.node and new.state is IncarnationState.RUNNING
    assert job is not None and job.state is JobState.RUNNING


def test_a_drain_that_leaves_jobs_behind_exits_3_with_the_reason(
    fleet: tuple[Path, ShellTransport], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    running(fleet, state, tmp_path, n=3)  # three whole cards of four: one is free
    with open_store(state, write=False) as store:
        full = next(n for n in NODES if len(store.incarnations(node=n, holding=True)) == 2)
    args = ["drain", full, "--reason", "r", "--grace", "5", "--checkpoint-wait", "0.2"]
    result = gpuctl(fleet, state, *args, "--yes", "-o", "json")
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    assert (doc["complete"], doc["moved"], doc["jobs"]) == (False, 1, 2)
    stuck = [r for r in doc["results"] if r["outcome"] != "moved"]
    assert [r["outcome"] for r in stuck] == ["not_started"]
    assert stuck[0]["message"].startswith("not moved: ")
    assert "stays:" in result.stderr  # the plan, on stderr when stdout is a document
    with open_store(state, write=False) as store:
        assert [c.node for c in store.cordons()] == [full]
        left = store.incarnations(node=full, holding=True)
        assert [i.job_id for i in left] == [stuck[0]["job_id"]]


@pytest.mark.parametrize("verb", ["cordon", "uncordon", "drain"])
def test_without_an_answer_or_yes_each_verb_fails_as_a_usage_error_and_changes_nothing(
    fleet: tuple[Path, ShellTransport], tmp_path: Path, verb: str
) -> None:
    """No terminal (stdin at its end) and no --yes: exit 2 with the hint, as `cancel` does."""
    state = tmp_path / "state"
    if verb == "uncordon":
        done = gpuctl(fleet, state, "cordon", "gpu01", "--reason", "fan noise", "--yes")
        assert done.exit_code == 0, done.output
    with open_store(state, write=True) as store:
        before = (store.cordons(), len(store.events()))
    reason = () if verb == "uncordon" else ("--reason", "fan noise")
    result = gpuctl(fleet, state, verb, "gpu01", *reason)
    assert result.exit_code == 2, result.output
    assert result.stderr.endswith(
        "[y/N]: \nerror: no answer (no terminal): nothing changed\n"
        "hint: pass --yes to apply without a terminal\n"
    )
    with open_store(state, write=False) as store:
        assert (store.cordons(), len(store.events())) == before
