"""Job services on the in-memory store: submit, list, show, cancel, logs, the conversions the
control loop uses, and the fleet numbers."""

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config.jobspec import JobSpecModel, spec_from_data
from gpuctl.config.jobspec_files import LoadedSpec
from gpuctl.core.jobs.model import (
    Checkpoint,
    EndReason,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
)
from gpuctl.core.model import Inventory, NodeSpec
from gpuctl.errors import ExitCode, GpuctlError, JobSpecError, Unreachable
from gpuctl.ops import jobs
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore

SECRET = "hunter2-d41d8cd9"
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def spec(name: str = "train", **extra: Any) -> LoadedSpec:
    data = {"name": name, "command": ["python", "train.py"], "resources": {"mem_per_gpu": 0.5}}
    return LoadedSpec(spec_from_data({**data, **extra}), f"{name}.yaml:1")


def tokens(*values: str) -> Any:
    it = iter(values)
    return lambda: next(it)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


def start(store: MemoryStore, job: Job, n: int, node: str = "gpu-01", at: float = 1100.0) -> None:
    inc = Incarnation(
        job_id=job.id,
        n=n,
        node=node,
        cards=(1,),
        gpu_uuids=("GPU-1",),
        mib_per_card=40000,
        whole=False,
        state=IncarnationState.LAUNCHING,
        started_at=at,
        run_dir=f".gpuctl/runs/{job.id}/{n}",
    )
    event = Event(at, "gpuctl", "launch", "launch", job.id, node)
    store.begin_launch(inc, capacity_mib={(node, 1): 80000}, event=event)
    store.update_incarnation(job.id, n, state=IncarnationState.RUNNING, pid=4242)


# --- submit -----------------------------------------------------------------------------------


def test_submit_queues_each_job_with_a_fresh_id_and_an_event(
    store: MemoryStore, clock: ManualClock
) -> None:
    added = jobs.submit(
        store, [spec("a"), spec("b")], actor="alice", clock=clock, token=tokens("0a1b2c", "ffffff")
    )
    assert [j.id for j in added] == ["a-0a1b2c", "b-ffffff"]
    assert all(j.state is JobState.QUEUED and j.submitted_at == 1000.0 for j in added)
    events = store.events(kinds=["submit"])
    assert [(e.job_id, e.actor, e.data["source"]) for e in events] == [
        ("a-0a1b2c", "alice", "a.yaml:1"),
        ("b-ffffff", "alice", "b.yaml:1"),
    ]
    assert store.job("a").id == "a-0a1b2c"  # type: ignore[union-attr]


def test_a_random_id_is_the_name_and_six_hex_digits_within_64_characters() -> None:
    assert re.match(r"^train-[0-9a-f]{6}$", jobs.new_job_id("train"))
    long = jobs.new_job_id("x" * 64, token=lambda: "abcdef")
    assert len(long) == 64 and long.endswith("x-abcdef") and ID.match(long)


def test_a_taken_id_is_drawn_again(store: MemoryStore, clock: ManualClock) -> None:
    jobs.submit(store, [spec("a")], actor="al", clock=clock, token=tokens("000001"))
    jobs.cancel(store, "a", actor="al", clock=clock)
    (again,) = jobs.submit(store, [spec("a")], actor="al", clock=clock, token=tokens("000001", "2"))
    assert again.id == "a-2"


def test_the_stored_spec_holds_secret_names_and_never_a_value(
    store: MemoryStore, clock: ManualClock, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "-file\n")
    loaded = spec("s", secret_env=["API_KEY", {"HF_TOKEN": {"file": str(token_file)}}])
    env = {"API_KEY": SECRET}
    (job,) = jobs.submit(store, [loaded], actor="al", clock=clock, env=env)
    stored = json.dumps(store.job(job.id).spec.to_dict())  # type: ignore[union-attr]
    assert SECRET not in stored
    assert "API_KEY" in stored and str(token_file) in stored
    assert SECRET not in json.dumps([dataclasses.asdict(e) for e in store.events()])
    assert jobs.resolve_secrets(store.job(job.id), env) == {  # type: ignore[arg-type]
        "API_KEY": SECRET,
        "HF_TOKEN": SECRET + "-file",
    }


def test_submit_refuses_a_missing_secret_by_name_and_adds_nothing(
    store: MemoryStore, clock: ManualClock
) -> None:
    with pytest.raises(JobSpecError) as err:
        jobs.submit(
            store, [spec("ok"), spec("s", secret_env=["API_KEY"])], actor="a", clock=clock, env={}
        )
    assert str(err.value) == "secret_env: API_KEY is not set in the environment"
    assert err.value.exit_code is ExitCode.USAGE
    assert store.jobs() == []


def test_a_secret_file_that_cannot_be_read_is_named_with_its_path(tmp_path: Path) -> None:
    loaded = spec("s", secret_env=[{"T": {"file": "~/missing.token"}}])
    with pytest.raises(JobSpecError) as err:
        jobs.resolve_secrets(loaded.spec, {"HOME": str(tmp_path)})
    assert str(err.value) == (
        f"secret_env: T: cannot read {tmp_path / 'missing.token'}: No such file or directory"
    )


def test_submit_refuses_a_name_that_is_active_unless_replacing(
    store: MemoryStore, clock: ManualClock
) -> None:
    (old,) = jobs.submit(store, [spec("a")], actor="al", clock=clock, token=tokens("111111"))
    with pytest.raises(GpuctlError) as err:
        jobs.submit(store, [spec("a")], actor="al", clock=clock)
    assert str(err.value) == "job name 'a' is already active as a-111111 (queued)"
    assert err.value.hint == "cancel it first (gpuctl cancel a-111111), or submit with --replace"
    clock.advance(5)
    (new,) = jobs.submit(
        store, [spec("a")], actor="al", clock=clock, replace=True, token=tokens("222222")
    )
    assert store.job(old.id).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert store.job("a") == new


# --- cancel -----------------------------------------------------------------------------------


def test_a_queued_job_is_cancelled_at_once(store: MemoryStore, clock: ManualClock) -> None:
    (job,) = jobs.submit(store, [spec("a")], actor="al", clock=clock)
    done = jobs.cancel(store, "a", actor="bob", clock=clock)
    assert (done.state, done.reason, done.cancel_requested) == (
        JobState.CANCELLED,
        "cancelled by bob",
        True,
    )
    assert [e.actor for e in store.events(job_id=job.id, kinds=["cancel"])] == ["bob"]
    assert jobs.cancel(store, job.id, actor="bob", clock=clock) == done  # again: nothing changes


def test_a_running_job_is_asked_to_stop_and_the_loop_learns_whether_to_force(
    store: MemoryStore, clock: ManualClock
) -> None:
    (job,) = jobs.submit(store, [spec("a")], actor="al", clock=clock)
    start(store, job, 1)
    asked = jobs.cancel(store, "a", actor="bob", clock=clock)
    assert (asked.state, asked.cancel_requested) == (JobState.RUNNING, True)
    assert jobs.cancel_is_forced(store, job.id) is False
    jobs.cancel(store, "a", actor="bob", clock=clock, force=True)
    assert jobs.cancel_is_forced(store, job.id) is True
    last = store.events(job_id=job.id, kinds=["cancel"])[-1]
    assert last.message == "cancelled by bob: KILL at once"


def test_cancel_of_a_finished_job_says_there_is_nothing_to_cancel(
    store: MemoryStore, clock: ManualClock
) -> None:
    (job,) = jobs.submit(store, [spec("a")], actor="al", clock=clock)
    store.update_job(job.id, state=JobState.SUCCEEDED)
    with pytest.raises(GpuctlError, match="already succeeded: nothing to cancel"):
        jobs.cancel(store, "a", actor="bob", clock=clock)
    with pytest.raises(jobs.JobNotFound, match="no job 'nope'"):
        jobs.cancel(store, "nope", actor="bob", clock=clock)


class RacingStore(MemoryStore):
    """The control loop launches the job between our read and our write, once."""

    def __init__(self) -> None:
        super().__init__()
        self.raced = False

    def update_job(self, job_id: str, **kw: Any) -> Job:
        if not self.raced and kw.get("expect") is JobState.QUEUED:
            self.raced = True
            start(self, self.job(job_id), 1)  # type: ignore[arg-type]
        return super().update_job(job_id, **kw)


def test_cancel_looks_again_when_the_loop_moves_the_job_meanwhile(clock: ManualClock) -> None:
    store = RacingStore()
    jobs.submit(store, [spec("a")], actor="al", clock=clock)
    result = jobs.cancel(store, "a", actor="bob", clock=clock)
    assert store.raced
    assert (result.state, result.cancel_requested) == (JobState.RUNNING, True)


# --- list and show ----------------------------------------------------------------------------


def test_list_shows_active_jobs_and_all_with_include_done(
    store: MemoryStore, clock: ManualClock
) -> None:
    a, b = jobs.submit(store, [spec("a"), spec("b")], actor="al", clock=clock)
    jobs.cancel(store, "b", actor="al", clock=clock)
    assert [v.job.id for v in jobs.list_jobs(store)] == [a.id]
    assert [v.job.id for v in jobs.list_jobs(store, include_done=True)] == [a.id, b.id]


def test_show_gives_node_cards_incarnation_and_the_newest_checkpoint(
    store: MemoryStore, clock: ManualClock
) -> None:
    (job,) = jobs.submit(store, [spec("a")], actor="al", clock=clock)
    start(store, job, 1)
    store.add_checkpoint(Checkpoint(job.id, 1, 100, "/c/step-00000100", 1150.0, "shared"))
    store.add_checkpoint(Checkpoint(job.id, 1, 200, "/c/step-00000200", 1190.0, "shared"))
    detail = jobs.show_job(store, "a")
    doc = jobs.job_document(detail, now=1200.0)
    assert (doc["name"], doc["state"], doc["node"], doc["gpus"], doc["incarnation"]) == (
        "a",
        "running",
        "gpu-01",
        [1],
        1,
    )
    assert doc["checkpoint"]["step"] == 200
    assert doc["checkpoint"]["age_s"] == 10.0
    assert doc["queue_wait_s"] == 100.0
    assert [i["state"] for i in doc["incarnations"]] == ["running"]
    assert [e["kind"] for e in doc["events"]] == ["submit", "launch"]
    json.dumps(doc, allow_nan=False)  # one plain JSON document


def test_a_job_waiting_after_a_failover_is_on_no_node(
    store: MemoryStore, clock: ManualClock
) -> None:
    (job,) = jobs.submit(store, [spec("a")], actor="al", clock=clock)
    start(store, job, 1)
    store.update_incarnation(job.id, 1, state=IncarnationState.LOST, end_reason=EndReason.NODE_LOST)
    store.update_job(job.id, state=JobState.QUEUED, reason="node gpu-01 down")
    doc = jobs.job_summary(jobs.show_job(store, "a").view, now=1200.0)
    assert (doc["state"], doc["node"], doc["gpus"], doc["checkpoint"]) == ("queued", None, [], None)


# --- what the loop needs ------------------------------------------------------------------------


def test_the_placement_request_is_keyed_by_id_and_avoids_jobs_by_their_ids(
    store: MemoryStore, clock: ManualClock
) -> None:
    a, b = jobs.submit(
        store,
        [spec("a"), spec("b", affinity={"avoid_jobs": ["a"]})],
        actor="al",
        clock=clock,
    )
    req = jobs.job_request(b, jobs.ids_by_name(store.jobs()))
    assert (req.name, req.avoid_jobs) == (b.id, (a.id,))
    assert jobs.job_request(b).avoid_jobs == ("a",)  # without the map: names as written
    start(store, a, 1)
    alloc = jobs.allocation(a, store.incarnations(a.id)[0])
    assert (alloc.job, alloc.node, alloc.cards, alloc.mib_per_card) == (a.id, "gpu-01", (1,), 40000)


def test_the_launch_request_carries_the_checkpoint_contract_and_hides_secrets(
    store: MemoryStore, clock: ManualClock
) -> None:
    loaded = spec("a", workdir="/shared/w", env={"EPOCHS": 3}, secret_env=["API_KEY"])
    (job,) = jobs.submit(store, [loaded], actor="al", clock=clock, env={"API_KEY": SECRET})
    req = jobs.launch_request(
        job, 2, (0, 3), ("GPU-a", "GPU-b"), 40000, "/c/step-00000100", {"API_KEY": SECRET}
    )
    assert req.argv == ("python", "train.py")
    assert (req.job_id, req.incarnation, req.cuda_visible_devices) == (job.id, 2, "0,3")
    assert (req.mib_per_card, req.resume_from, req.workdir) == (
        40000,
        "/c/step-00000100",
        "/shared/w",
    )
    assert req.checkpoint_dir == f"~/.gpuctl/checkpoints/{job.id}"
    assert req.env == {"EPOCHS": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert req.secret_env == {"API_KEY": SECRET}
    assert SECRET not in repr(req)


def test_a_checkpoint_dir_takes_the_job_id_for_its_placeholder(
    store: MemoryStore, clock: ManualClock
) -> None:
    loaded = spec("a", checkpoint={"dir": "/shared/ckpt/{job_id}", "sync": "shared"})
    (job,) = jobs.submit(store, [loaded], actor="al", clock=clock)
    assert job.spec.policy.checkpoint.dir_for(job.id) == f"/shared/ckpt/{job.id}"


# --- logs -------------------------------------------------------------------------------------


class LogRunner:
    """Serves logs per (job, incarnation) in chunks of 4 bytes; nodes in `down` do not answer."""

    def __init__(self) -> None:
        self.logs_by: dict[tuple[str, int], bytes] = {}
        self.down: set[str] = set()

    def logs(
        self, node: NodeSpec, job_id: str, incarnation: int, *, offset: int = 0, limit: int = 4
    ) -> tuple[bytes, int]:
        if node.name in self.down:
            raise Unreachable(f"{node.name}: no route to host")
        data = self.logs_by.get((job_id, incarnation), b"")[offset : offset + 4]
        return data, offset + len(data)


INVENTORY = Inventory(nodes=(NodeSpec("gpu-01", "10.0.0.1"), NodeSpec("gpu-02", "10.0.0.2")))


def collect(chunks: Iterator[jobs.LogChunk]) -> tuple[bytes, list[str]]:
    data, notes = b"", []
    for c in chunks:
        data += c.data
        if c.note:
            notes.append(c.note)
    return data, notes


def test_logs_read_the_whole_log_of_the_current_incarnation(
    store: MemoryStore, clock: ManualClock
) -> None:
    (job,) = jobs.submit(store, [spec("a")], actor="al", clock=clock)
    runner = LogRunner()
    with pytest.raises(GpuctlError, match="has not started yet"):
        collect(jobs.read_logs(store, runner, INVENTORY, "a"))  # type: ignore[arg-type]
    start(store, job, 1)
    runner.logs_by[(job.id, 1)] = b"step 1\nstep 2\n"
    data, notes = collect(jobs.read_logs(store, runner, INVENTORY, "a"))  # type: ignore[arg-type]
    assert (data, notes) == (b"step 1\nstep 2\n", [])


def test_follow_goes_on_with_the_next_incarnation_and_stops_when_the_job_ends(
    store: MemoryStore, clock: ManualClock
) -> None:
    (job,) = jobs.submit(store, [spec("a")], actor="al", clock=clock)
    start(store, job, 1)
    runner = LogRunner()
    runner.logs_by[(job.id, 1)] = b"step 1\n"
    script = iter(["node dies", "restart", "end"])

    def sleep(_: float) -> None:  # each poll, the world moves on
        what = next(script)
        if what == "node dies":
            runner.logs_by[(job.id, 1)] += b"step 2\n"
            runner.down.add("gpu-01")
        elif what == "restart":
            store.update_incarnation(  # lost, and (for this test) already fenced
                job.id, 1, state=IncarnationState.KILLED, end_reason=EndReason.NODE_LOST
            )
            store.update_job(job.id, state=JobState.QUEUED)
            start(store, job, 2, node="gpu-02")
            runner.logs_by[(job.id, 2)] = b"resumed at 1\nstep 2\n"
        else:
            store.update_job(job.id, state=JobState.SUCCEEDED)

    chunks = jobs.read_logs(
        store,
        runner,  # type: ignore[arg-type]
        INVENTORY,
        "a",
        follow=True,
        sleep=sleep,
    )
    data, notes = collect(chunks)
    assert data == b"step 1\nresumed at 1\nstep 2\n"
    assert notes == [
        "incarnation 1 on gpu-01",
        "gpu-01: cannot read the log: gpu-01: no route to host",
        "incarnation 2 on gpu-02",
        f"{job.id} succeeded",
    ]


# --- numbers ------------------------------------------------------------------------------------


def test_fleet_numbers_come_from_the_store(store: MemoryStore, clock: ManualClock) -> None:
    a, b = jobs.submit(store, [spec("a"), spec("b")], actor="al", clock=clock)
    start(store, a, 1, at=1030.0)
    store.add_checkpoint(Checkpoint(a.id, 1, 10, "/c", 1100.0, "shared"))
    numbers = jobs.fleet_numbers(store, now=1200.0).to_dict()
    assert numbers["queue_wait_p50_s"] == 30.0
    assert (numbers["queue_waiting"], numbers["queue_oldest_wait_s"]) == (1, 200.0)
    assert numbers["queue_oldest_job"] == b.id
    assert numbers["checkpoint_age_max_s"] == 100.0
    assert numbers["failover_success_pct"] is None
    json.dumps(numbers, allow_nan=False)


def test_a_control_loop_pass_reads_typed_specs_and_validates_no_spec_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuctl.testing.drainkit import Kit

    kit = Kit.make(MemoryStore(), ("n1", "n2"))
    submitted = [kit.submit(name, priority=i) for i, name in enumerate(("a", "b", "c"))]

    def validated(*args: object, **kwargs: object) -> None:
        raise AssertionError("a job spec was validated again")

    monkeypatch.setattr(JobSpecModel, "model_validate", classmethod(validated))
    monkeypatch.setattr(JobSpecModel, "__init__", validated)
    kit.step()
    kit.step()
    assert [kit.job(j.id).state for j in submitted] == [JobState.RUNNING] * 3


def test_a_cpu_only_job_is_held_saying_so_and_the_pass_goes_on(tmp_path: Path) -> None:
    from gpuctl.adapters.store import open_store
    from gpuctl.ops.loop.launch import CPU_ONLY
    from gpuctl.testing.drainkit import Kit

    with open_store(tmp_path / "state", write=True) as store:
        kit = Kit.make(store, ("n1", "n2"))
        etl = kit.submit("etl", resources={"gpus": 0, "cpu": 2})
        train = kit.submit("train")
        kit.step()
        assert (kit.job(etl.id).state, kit.job(etl.id).reason) == (JobState.HELD, CPU_ONLY)
        assert kit.job(train.id).state is JobState.RUNNING
