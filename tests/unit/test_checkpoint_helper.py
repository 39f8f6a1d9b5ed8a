"""gpuctl.checkpoint, the job author's helper: atomic save with a marker, load latest, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gpuctl.checkpoint import (
    Checkpointer,
    CheckpointError,
    StaleIncarnationError,
)
from gpuctl.core.jobs.checkpoints import judge_checkpoint, parse_marker

ROOT = Path(__file__).resolve().parents[2]
ENV = (
    "GPUCTL_CHECKPOINT_DIR",
    "GPUCTL_JOB_ID",
    "GPUCTL_INCARNATION",
    "GPUCTL_RESUME_FROM",
    "GPUCTL_MEM_LIMIT_MIB",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def ck(tmp_path: Path, incarnation: int | None = 1, **kw: Any) -> Checkpointer:
    return Checkpointer(tmp_path, job_id="train-demo-1a2b3c", incarnation=incarnation, **kw)


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def run_script(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `code` under `python -S` (no site-packages: the standard library and the checkout)."""
    prelude = f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
    return subprocess.run(
        [sys.executable, "-S", "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), **(env or {})},
    )


# --- save and load -----------------------------------------------------------------------------


def test_a_saved_checkpoint_loads_back_with_its_bytes_and_marker(tmp_path: Path) -> None:
    path = ck(tmp_path, 2).save(10, {"state.bin": b"weights", "opt/moments.bin": b"m"})
    assert path == tmp_path / "step-00000010"
    assert listing(tmp_path) == ["step-00000010"]
    assert listing(path) == ["COMMITTED", "opt", "state.bin"]
    loaded = ck(tmp_path, 3).latest()
    assert loaded is not None
    assert (loaded.step, loaded.incarnation, loaded.job_id) == (10, 2, "train-demo-1a2b3c")
    assert loaded.read("state.bin") == b"weights"
    assert loaded.read("opt/moments.bin") == b"m"
    assert abs(loaded.committed_at - time.time()) < 60


def test_the_marker_is_the_format_gpuctl_reads(tmp_path: Path) -> None:
    import hashlib

    path = ck(tmp_path, 2).save(7, {"model.pt": b"abc"})
    text = (path / "COMMITTED").read_text()
    fields = parse_marker(text)
    assert fields.ok
    assert (fields.job_id, fields.incarnation, fields.step) == ("train-demo-1a2b3c", 2, 7)
    sha = hashlib.sha256(b"abc").hexdigest()
    assert fields.files == (("model.pt", sha),)
    assert judge_checkpoint(str(path), text, {"model.pt": sha}).valid


def test_a_writer_callback_saves_whatever_it_writes_into_the_folder(tmp_path: Path) -> None:
    def write(folder: Path) -> None:
        (folder / "shards").mkdir()
        (folder / "shards" / "0.bin").write_bytes(b"zero")
        (folder / "meta.json").write_text("{}")

    ck(tmp_path).save(3, write)
    loaded = ck(tmp_path).latest()
    assert loaded is not None and loaded.step == 3
    assert sorted(loaded.files) == ["meta.json", "shards/0.bin"]
    assert loaded.read("shards/0.bin") == b"zero"


def test_the_settings_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.setenv("GPUCTL_JOB_ID", "job-abcdef")
    monkeypatch.setenv("GPUCTL_INCARNATION", "4")
    path = Checkpointer().save(1, {"a": b"1"})
    marker = json.loads((path / "COMMITTED").read_text())
    assert path.parent == tmp_path / "ck"
    assert (marker["job_id"], marker["incarnation"]) == ("job-abcdef", 4)


def test_without_a_directory_the_helper_says_how_to_give_one() -> None:
    with pytest.raises(CheckpointError, match="set GPUCTL_CHECKPOINT_DIR"):
        Checkpointer()


@pytest.mark.parametrize("name", ["../escape", "/abs", "COMMITTED", "a//b", "bad\nname"])
def test_file_names_outside_the_folder_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(CheckpointError, match="bad checkpoint file name"):
        ck(tmp_path).save(1, {name: b"x"})
    assert not any(p.name.startswith("step-") for p in tmp_path.iterdir())


def test_an_empty_dir_has_nothing_to_resume_from(tmp_path: Path) -> None:
    assert ck(tmp_path / "missing").latest() is None


# --- interrupted saves -------------------------------------------------------------------------


def test_a_save_killed_while_writing_files_leaves_the_previous_checkpoint_in_use(
    tmp_path: Path,
) -> None:
    code = f"""
        import os, signal
        from gpuctl.checkpoint import Checkpointer
        ck = Checkpointer({str(tmp_path)!r}, job_id="j-1", incarnation=1)
        ck.save(10, {{"state.bin": b"ten"}})
        def dies_halfway(folder):
            (folder / "state.bin").write_bytes(b"twen")
            os.kill(os.getpid(), signal.SIGKILL)
        ck.save(20, dies_halfway)
    """
    assert run_script(code).returncode == -signal.SIGKILL
    assert any(p.name.startswith(".tmp-step-20-") for p in tmp_path.iterdir())
    loaded = Checkpointer(tmp_path, job_id="j-1", incarnation=2).latest()
    assert loaded is not None and loaded.read("state.bin") == b"ten"


def test_a_save_killed_before_its_marker_is_never_loaded_and_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = f"""
        import os, signal
        import gpuctl.checkpoint as c
        ck = c.Checkpointer({str(tmp_path)!r}, job_id="j-1", incarnation=1)
        ck.save(10, {{"state.bin": b"ten"}})
        c.Checkpointer._write_marker = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        ck.save(20, {{"state.bin": b"twenty"}})
    """
    assert run_script(code).returncode == -signal.SIGKILL
    assert listing(tmp_path) == ["step-00000010", "step-00000020"]
    assert listing(tmp_path / "step-00000020") == ["state.bin"]  # files in place, no marker
    restarted = Checkpointer(tmp_path, job_id="j-1", incarnation=2)
    loaded = restarted.latest()
    assert loaded is not None and loaded.step == 10
    err = capsys.readouterr().err
    assert f"skipping {tmp_path / 'step-00000020'}: no marker (an interrupted save)" in err
    # the next incarnation redoes step 20 over the leftover and commits it
    restarted.save(20, {"state.bin": b"twenty again"})
    again = restarted.latest()
    assert again is not None and again.read("state.bin") == b"twenty again"
    assert again.incarnation == 2


def test_older_incarnations_interrupted_saves_are_cleaned_up(tmp_path: Path) -> None:
    (tmp_path / ".tmp-step-20-1-4242").mkdir(parents=True)
    (tmp_path / "step-00000015").mkdir()  # files, no marker
    (tmp_path / ".old-step-00000010-4242").mkdir()  # set aside, then the save was killed
    ck(tmp_path, 2).save(20, {"a": b"1"})
    assert listing(tmp_path) == ["step-00000020"]


# --- which checkpoint is loaded ----------------------------------------------------------------


def test_a_corrupted_checkpoint_is_skipped_loudly_for_the_one_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = ck(tmp_path)
    writer.save(10, {"model.pt": b"ten"})
    writer.save(20, {"model.pt": b"twenty"})
    (tmp_path / "step-00000020" / "model.pt").write_bytes(b"twentx")
    loaded = ck(tmp_path, 2).latest()
    assert loaded is not None and loaded.step == 10
    err = capsys.readouterr().err
    assert err == (
        f"gpuctl.checkpoint: skipping {tmp_path / 'step-00000020'}: checksum mismatch: model.pt\n"
    )


def test_a_missing_file_or_a_garbled_marker_is_skipped_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = ck(tmp_path)
    for step in (10, 20, 30):
        writer.save(step, {"model.pt": b"%d" % step})
    (tmp_path / "step-00000030" / "model.pt").unlink()
    (tmp_path / "step-00000020" / "COMMITTED").write_text("{not json")
    loaded = ck(tmp_path, 2).latest()
    assert loaded is not None and loaded.step == 10
    err = capsys.readouterr().err
    assert "step-00000030: missing file: model.pt" in err
    assert "step-00000020: unreadable marker: not JSON" in err


def test_an_older_incarnations_checkpoint_is_resumed_from(tmp_path: Path) -> None:
    ck(tmp_path, 1).save(10, {"a": b"1"})
    loaded = ck(tmp_path, 2).latest()
    assert loaded is not None and (loaded.step, loaded.incarnation) == (10, 1)


def test_a_newer_incarnations_checkpoint_is_not_resumed_from_by_a_stale_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ck(tmp_path, 1).save(10, {"a": b"1"})
    ck(tmp_path, 3).save(20, {"a": b"2"})
    loaded = ck(tmp_path, 2).latest()
    assert loaded is not None and loaded.step == 10
    assert "step-00000020: written by a newer incarnation (3) than this one (2)" in (
        capsys.readouterr().err
    )


def test_a_stale_copy_may_not_save_over_a_newer_incarnations_work(tmp_path: Path) -> None:
    ck(tmp_path, 3).save(20, {"a": b"new"})
    with pytest.raises(StaleIncarnationError, match=r"incarnation 3 .* \(incarnation 2\) is stale"):
        ck(tmp_path, 2).save(30, {"a": b"old"})
    assert listing(tmp_path) == ["step-00000020"]


def test_another_jobs_checkpoints_in_a_reused_dir_are_left_alone(tmp_path: Path) -> None:
    Checkpointer(tmp_path, job_id="train-demo-000000", incarnation=5).save(600, {"a": b"old"})
    mine = Checkpointer(tmp_path, job_id="train-demo-1a2b3c", incarnation=1)
    assert mine.latest() is None
    mine.save(10, {"a": b"new"})  # a lower incarnation than the other job's: not stale
    assert listing(tmp_path) == ["step-00000010", "step-00000600"]


def test_another_jobs_committed_checkpoint_is_never_overwritten(tmp_path: Path) -> None:
    other = Checkpointer(tmp_path, job_id="train-demo-000000", incarnation=1)
    other.save(10, {"a": b"theirs"})
    mine = Checkpointer(tmp_path, job_id="train-demo-1a2b3c", incarnation=1)
    with pytest.raises(CheckpointError, match=r"another job \(train-demo-000000\).*\{job_id\}"):
        mine.save(10, {"a": b"mine"})
    assert (
        other.latest() is not None and (tmp_path / "step-00000010" / "a").read_bytes() == b"theirs"
    )


def test_the_checkpoint_gpuctl_chose_wins_over_newer_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ck(tmp_path)
    for step in (10, 20, 30):
        writer.save(step, {"a": b"%d" % step})
    monkeypatch.setenv("GPUCTL_RESUME_FROM", str(tmp_path / "step-00000020"))
    loaded = ck(tmp_path, 2).latest()
    assert loaded is not None and loaded.read("a") == b"20"


def test_a_bad_chosen_checkpoint_is_refused_loudly_for_the_newest_older_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = ck(tmp_path)
    for step in (10, 20, 30):
        writer.save(step, {"a": b"%d" % step})
    (tmp_path / "step-00000020" / "a").write_bytes(b"XX")
    chosen = tmp_path / "step-00000020"
    monkeypatch.setenv("GPUCTL_RESUME_FROM", str(chosen))
    loaded = ck(tmp_path, 2).latest()
    assert loaded is not None and loaded.step == 10  # never the newer step 30
    assert capsys.readouterr().err == (
        f"gpuctl.checkpoint: refusing GPUCTL_RESUME_FROM={chosen}: checksum mismatch: a; "
        "falling back to the newest valid older checkpoint\n"
    )


def test_an_empty_resume_from_is_a_fresh_start_chosen_by_gpuctl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ck(tmp_path).save(10, {"a": b"1"})
    monkeypatch.setenv("GPUCTL_RESUME_FROM", "")
    assert ck(tmp_path, 2).latest() is None
    assert "gpuctl chose a fresh start" in capsys.readouterr().err


# --- keeping the newest K ----------------------------------------------------------------------


def test_only_the_newest_k_checkpoints_are_kept(tmp_path: Path) -> None:
    writer = ck(tmp_path, keep=3)
    for step in range(10, 70, 10):
        writer.save(step, {"a": b"%d" % step})
    assert listing(tmp_path) == ["step-00000040", "step-00000050", "step-00000060"]


def test_the_checkpoint_resumed_from_is_kept_until_a_newer_one_is_committed(
    tmp_path: Path,
) -> None:
    ck(tmp_path, 1).save(30, {"a": b"30"})
    again = ck(tmp_path, 2, keep=1)
    loaded = again.latest()
    assert loaded is not None and loaded.step == 30
    again.save(25, {"a": b"25"})  # rewound below the resume point: step 30 must stay
    assert listing(tmp_path) == ["step-00000025", "step-00000030"]
    again.save(31, {"a": b"31"})
    assert listing(tmp_path) == ["step-00000031"]


def test_saving_the_step_just_resumed_from_keeps_the_committed_copy(tmp_path: Path) -> None:
    first = ck(tmp_path, 1).save(30, {"a": b"30"})
    marker = (first / "COMMITTED").read_text()
    again = ck(tmp_path, 2)
    assert again.latest() is not None
    assert again.save(30, {"a": b"30"}) == first  # SIGTERM before any step: nothing to add
    assert (first / "COMMITTED").read_text() == marker


def test_an_older_incarnations_steps_past_the_new_timeline_are_dropped(tmp_path: Path) -> None:
    old = ck(tmp_path, 1)
    for step in (10, 20, 30):
        old.save(step, {"a": b"%d" % step})
    new = ck(tmp_path, 2, resume_from=tmp_path / "step-00000010")
    assert new.latest() is not None
    new.save(15, {"a": b"15"})
    # steps 20 and 30 of incarnation 1 were abandoned when gpuctl resumed from step 10
    assert listing(tmp_path) == ["step-00000010", "step-00000015"]


def test_an_older_incarnations_folder_at_the_same_step_is_replaced(tmp_path: Path) -> None:
    ck(tmp_path, 1).save(20, {"a": b"stale"})
    ck(tmp_path, 2).save(20, {"a": b"fresh"})
    loaded = ck(tmp_path, 3).latest()
    assert loaded is not None and (loaded.incarnation, loaded.read("a")) == (2, b"fresh")
    assert listing(tmp_path) == ["step-00000020"]


# --- signals and the import contract -----------------------------------------------------------

LOOP = """
    import time
    from gpuctl.checkpoint import Checkpointer
    ck = Checkpointer(DIR, job_id="j-1", incarnation=1, every=1000)
    ck.install_signal_handlers()
    print("ready", flush=True)
    step = 0
    # The loop asks about the stop before the next step, and saves after it: a SIGTERM landing
    # between `should_checkpoint` and the stop check still gets its checkpoint.
    while step < 100000 and not ck.stop_requested:
        step += 1
        time.sleep(0.005)
        if ck.should_checkpoint(step):
            print("checkpoint", step, ck.save(step, {"s": b"%d" % step}).name, flush=True)
    print("checkpoint", step, ck.save(step, {"s": b"%d" % step}).name, flush=True)
    print("stopping", step, flush=True)
"""


def test_sigusr1_asks_for_a_checkpoint_and_sigterm_for_a_checkpoint_and_exit(
    tmp_path: Path,
) -> None:
    prelude = f"import sys; sys.path.insert(0, {str(ROOT)!r})\nDIR = {str(tmp_path)!r}\n"
    proc = subprocess.Popen(
        [sys.executable, "-S", "-c", prelude + textwrap.dedent(LOOP)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR1)
        line = proc.stdout.readline().split()
        assert line[0] == "checkpoint" and int(line[1]) % 1000 != 0
        assert line[2] == f"step-{int(line[1]):08d}"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = out.splitlines()
    assert proc.returncode == 0, err
    assert lines[-1].startswith("stopping ") and lines[-2].startswith("checkpoint ")
    stopped_at = int(lines[-1].split()[1])
    assert lines[-2].split()[1] == str(stopped_at)  # checkpointed at the step it stopped on
    latest = Checkpointer(tmp_path, job_id="j-1", incarnation=2).latest()
    assert latest is not None and latest.step == stopped_at


def test_the_helper_imports_with_the_standard_library_alone() -> None:
    result = run_script(
        """
        import gpuctl.checkpoint
        names = sorted(m.split(".")[0] for m in sys.modules)
        print(",".join(sorted(n for n in set(names) if n not in sys.stdlib_module_names)))
        print(",".join(sorted(m for m in sys.modules if m.startswith("gpuctl"))))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["__main__,gpuctl", "gpuctl,gpuctl.checkpoint"]
