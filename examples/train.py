#!/usr/bin/env python3
"""A toy training loop that keeps gpuctl's checkpoint contract (docs/checkpoints.md).

    python3 examples/train.py [--steps N] [--checkpoint-every K] [--step-seconds S]

It fits a small weight vector to a fixed target by gradient descent, one step every S seconds,
logging `step 123 loss 0.4567 incarnation 2` per step. It checkpoints every K steps, when asked
(SIGUSR1), and on SIGTERM (then exits 0), and resumes exactly where its newest committed checkpoint
left off (`resumed from step 120 (incarnation 1)`): the same steps give the same losses whether
or not the run was interrupted. Pure Python; with torch installed it does the arithmetic in torch
(on the granted GPU when there is one). Standard library only otherwise: it runs under the node's
/usr/bin/python3 from a checkout of gpuctl, without gpuctl installed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

try:
    from gpuctl.checkpoint import Checkpointer, StaleIncarnationError
except ImportError:  # run from a checkout: the repository root is the parent of examples/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gpuctl.checkpoint import Checkpointer, StaleIncarnationError

DIM = 8
LEARNING_RATE = 0.01
STATE_FILE = "state.json"


def initial_weights() -> list[float]:
    return [0.0] * DIM


def target() -> list[float]:
    return [((i * 37) % 11) / 10.0 - 0.5 for i in range(DIM)]


class PlainMath:
    """One gradient-descent step on mean((w - t)^2), in plain Python floats."""

    name = "python"

    def __init__(self, weights: list[float]) -> None:
        self.weights = list(weights)
        self.goal = target()

    def step(self) -> float:
        self.weights = [
            w - LEARNING_RATE * 2.0 * (w - t) for w, t in zip(self.weights, self.goal, strict=True)
        ]
        return sum((w - t) ** 2 for w, t in zip(self.weights, self.goal, strict=True)) / DIM

    def export(self) -> list[float]:
        return list(self.weights)


class TorchMath:
    """The same step in torch (float64), on the first visible GPU when there is one."""

    def __init__(self, torch: Any, weights: list[float]) -> None:
        self.torch = torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.name = f"torch ({device})"
        self.weights = torch.tensor(weights, dtype=torch.float64, device=device)
        self.goal = torch.tensor(target(), dtype=torch.float64, device=device)

    def step(self) -> float:
        self.weights = self.weights - LEARNING_RATE * 2.0 * (self.weights - self.goal)
        return float(((self.weights - self.goal) ** 2).mean().item())

    def export(self) -> list[float]:
        return [float(x) for x in self.weights.tolist()]


def make_math(weights: list[float], use_torch: bool) -> PlainMath | TorchMath:
    if use_torch:
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            pass
        else:
            return TorchMath(torch, weights)
    return PlainMath(weights)


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=600, help="train up to this step (600)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps (10)")
    parser.add_argument("--step-seconds", type=float, default=0.5, help="time per step (0.5)")
    parser.add_argument("--checkpoint-dir", help="default: $GPUCTL_CHECKPOINT_DIR")
    parser.add_argument("--no-torch", action="store_true", help="plain Python even with torch")
    args = parser.parse_args(argv)

    if not (args.checkpoint_dir or os.environ.get("GPUCTL_CHECKPOINT_DIR")):
        parser.error("no checkpoint directory: set GPUCTL_CHECKPOINT_DIR or pass --checkpoint-dir")
    ckpt = Checkpointer(args.checkpoint_dir, every=args.checkpoint_every)
    ckpt.install_signal_handlers()
    incarnation = ckpt.incarnation if ckpt.incarnation is not None else "-"
    limit_mib = os.environ.get("GPUCTL_MEM_LIMIT_MIB")
    limit = f"{limit_mib} MiB" if limit_mib else "unset"
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    say(
        f"train: job {ckpt.job_id or '-'} incarnation {incarnation}, checkpoints in {ckpt.dir}, "
        f"CUDA_VISIBLE_DEVICES {devices}, memory limit {limit}"
    )

    loaded = ckpt.latest()
    if loaded is None:
        step, weights = 0, initial_weights()
        say("starting fresh")
    else:
        state = json.loads(loaded.read(STATE_FILE))
        step, weights = int(state["step"]), [float(w) for w in state["weights"]]
        of = loaded.incarnation if loaded.incarnation is not None else "-"
        say(f"resumed from step {step} (incarnation {of})")
    math = make_math(weights, use_torch=not args.no_torch)
    say(f"math: {math.name}")

    def checkpoint(why: str) -> None:
        data = json.dumps({"step": step, "weights": math.export()}).encode()
        path = ckpt.save(step, {STATE_FILE: data})
        say(f"checkpoint step {step} committed ({why}): {path.name}")

    try:
        while step < args.steps and not ckpt.stop_requested:
            if args.step_seconds > 0:
                time.sleep(args.step_seconds)
            if ckpt.stop_requested:
                break
            loss = math.step()
            step += 1
            say(f"step {step} loss {loss:.4f} incarnation {incarnation}")
            if ckpt.checkpoint_requested:
                checkpoint("SIGUSR1")
            elif ckpt.should_checkpoint(step) and not ckpt.stop_requested:
                checkpoint(f"every {args.checkpoint_every} steps")
        if ckpt.stop_requested:
            checkpoint("SIGTERM")
            say(f"stopping at step {step} (SIGTERM)")
            return 0
        checkpoint("done")
        say(f"done: {step} steps")
        return 0
    except StaleIncarnationError as exc:
        print(f"train: {exc}", file=sys.stderr, flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
