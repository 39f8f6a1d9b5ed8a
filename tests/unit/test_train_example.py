"""examples/train.py keeps the checkpoint contract: killed, it resumes where it committed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpuctl.core.jobs.checkpoints import parse_marker, step_of_dir

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train.py"
STEP_LINE = re.compile(r"^step (\d+) loss (\d+\.\d{4}) incarnation (\S+)$")


def contract_env(
    ckpt_dir: Path, incarnation: int, resume_from: str | None = None
) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "GPUCTL_JOB_ID": "train-demo-1a2b3c",
        "GPUCTL_INCARNATION": str(incarnation),
        "GPUCTL_CHECKPOINT_DIR": str(ckpt_dir),
        "GPUCTL_MEM_LIMIT_MIB": "8192",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    if resume_from is not None:
        env["GPUCTL_RESUME_FROM"] = resume_from
    return env


class Run:
    """train.py in a subprocess, its stdout read line by line with deadlines."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        # `python -S`: no site-packages, so gpuctl is found only from the checkout, as on a node
        self.proc = subprocess.Popen(
            [sys.executable, "-S", str(TRAIN), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
        )
        self.lines: list[str] = []
        self._buffer = b""

    def read_until(self, done: Callable[[str], bool], timeout_s: float = 30.0) -> list[str]:
        """The new lines up to and including the first for which `done` holds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        seen = len(self.lines)
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                self.lines.append(raw.decode())
                if done(self.lines[-1]):
                    return self.lines[seen:]
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                raise AssertionError(f"train.py did not get there in time: {self.lines[seen:]}")
            self._buffer += chunk

    def finish(self, timeout_s: float = 30.0) -> tuple[int, list[str], str]:
        """Wait for the exit: (exit status, the remaining stdout lines, stderr)."""
        out, err = self.proc.communicate(timeout=timeout_s)
        rest = (self._buffer + out).decode().splitlines()
        self.lines.extend(rest)
        return self.proc.returncode, rest, err.decode()

    def kill(self) -> None:
        """SIGKILL (when still running); what it had written is kept in `lines`."""
        if self.proc.poll() is None:
            self.proc.kill()
        out, _ = self.proc.communicate()
        self.lines.extend((self._buffer + out).decode().splitlines())
        self._buffer = b""


def steps_of(lines: list[str]) -> list[tuple[int, str, str]]:
    return [(int(m.group(1)), m.group(2), m.group(3)) for m in map(STEP_LINE.match, lines) if m]


def newest_committed(ckpt_dir: Path) -> Path:
    """The newest checkpoint folder whose marker parses and whose files match it."""
    best: tuple[int, Path] | None = None
    for folder in ckpt_dir.iterdir():
        step = step_of_dir(folder.name)
        marker = folder / "COMMITTED"
        if step is None or not marker.exists():
            continue
        fields = parse_marker(marker.read_bytes())
        intact = fields.ok and all(
            hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
            for name, digest in fields.files
        )
        if intact and (best is None or step > best[0]):
            best = (step, folder)
    assert best is not None, f"no committed checkpoint in {ckpt_dir}"
    return best[1]


def test_killed_mid_run_it_resumes_from_the_last_committed_step_with_the_same_losses(
    tmp_path: Path,
) -> None:
    ckpt_dir = tmp_path / "ckpt"
    args = ["--steps", "40", "--checkpoint-every", "5"]
    first = Run([*args, "--step-seconds", "0.01"], contract_env(ckpt_dir, 1), tmp_path)
    try:
        first.read_until(lambda line: line.startswith("step 23 "))
    finally:
        first.kill()  # SIGKILL: no chance to checkpoint
    assert first.proc.returncode == -signal.SIGKILL
    ran_before = steps_of(first.lines)
    reached = ran_before[-1][0]
    committed = newest_committed(ckpt_dir)
    last = step_of_dir(committed.name)
    assert last is not None and 20 <= last <= reached < 40

    resumed_env = contract_env(ckpt_dir, 2, resume_from=str(committed))
    second = Run([*args, "--step-seconds", "0"], resumed_env, tmp_path)
    code, after, err = second.finish()
    assert code == 0, err
    assert f"resumed from step {last} (incarnation 1)" in after
    assert "memory limit 8192 MiB" in after[0]

    ran_after = steps_of(after)
    assert [s for s, _, _ in ran_before] == list(range(1, reached + 1))
    assert [s for s, _, _ in ran_after] == list(range(last + 1, 41))  # continuous from the commit
    assert {inc for _, _, inc in ran_before} == {"1"} and {inc for _, _, inc in ran_after} == {"2"}
    redone = {s: loss for s, loss, _ in ran_after if s <= reached}
    assert redone == {s: loss for s, loss, _ in ran_before if s > last}  # the same work again
    assert after[-1] == "done: 40 steps"

    # an uninterrupted run logs the same losses and ends with exactly the same weights
    reference = Run([*args, "--step-seconds", "0"], contract_env(tmp_path / "ref", 1), tmp_path)
    code, whole, err = reference.finish()
    assert code == 0, err
    assert [loss for _, loss, _ in steps_of(whole)][last:] == [loss for _, loss, _ in ran_after]
    final = json.loads((ckpt_dir / "step-00000040" / "state.json").read_text())
    expected = json.loads((tmp_path / "ref" / "step-00000040" / "state.json").read_text())
    assert final == expected


def test_sigusr1_checkpoints_now_and_sigterm_checkpoints_and_exits_0(tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    args = ["--steps", "100000", "--checkpoint-every", "100000", "--step-seconds", "0.01"]
    run = Run(args, contract_env(ckpt_dir, 1), tmp_path)
    try:
        run.read_until(lambda line: line.startswith("step 3 "))
        run.proc.send_signal(signal.SIGUSR1)
        asked = run.read_until(lambda line: line.startswith("checkpoint step "))
        run.proc.send_signal(signal.SIGTERM)
        code, rest, err = run.finish()
    finally:
        run.kill()
    assert code == 0, err
    usr1_step = steps_of(run.lines[: run.lines.index(asked[-1])])[-1][0]  # the step just done
    assert asked[-1] == f"checkpoint step {usr1_step} committed (SIGUSR1): step-{usr1_step:08d}"
    stopped = steps_of(run.lines)[-1][0]
    assert rest[-2:] == [
        f"checkpoint step {stopped} committed (SIGTERM): step-{stopped:08d}",
        f"stopping at step {stopped} (SIGTERM)",
    ]
    assert newest_committed(ckpt_dir).name == f"step-{stopped:08d}"


def test_without_a_checkpoint_dir_it_says_how_to_give_one(tmp_path: Path) -> None:
    code, _, err = Run([], {"PATH": os.environ.get("PATH", "")}, tmp_path).finish()
    assert code == 2
    assert "set GPUCTL_CHECKPOINT_DIR or pass --checkpoint-dir" in err
