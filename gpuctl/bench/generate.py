"""Workloads along the FGD paper's four knobs, generated from a base openb trace with a seed.

The paper (Weng et al., ATC '23, §6) derives its 16 other openb workloads from the default trace by
changing the share of one pod class and resampling the trace's own pods of that class. What each
shipped CSV holds, measured, and how this module follows it:

* `gpushareNN`: GPU-sharing pods (one card, less than a whole one) ask NN % of the GPU that GPU
  pods ask (gpushare40: 40.1 %; the default trace 28.5 %; gpushare100: all of it); the pod count
  stays. Here: random whole-GPU pods (multi-GPU ones too) are replaced by sharing pods drawn (with
  replacement) from the base trace's sharing pods until the share reaches NN % (to lower it, random
  sharing pods by single whole-GPU pods).
* `multigpuNN`: multi-GPU pods ask NN % of the GPU (multigpu20: 20.4 %; default 7.3 %), every
  pod of the base trace kept. Here: multi-GPU pods drawn from the base trace's are added, each at a
  random position, until the share reaches NN %.
* `gpuspecNN`: NN % of the GPU pods are pinned to card models (gpuspec10: 10.4 %), the rest of the
  trace unchanged. Here: that share of GPU pods, drawn at random, each get a `gpu_spec` drawn from
  the specs of a source trace that has them (the shipped gpuspec10, whose specs follow the
  production trace: T4 most, then G2, P100, V100 pairs, ...), weighted by how often each occurs.
* `cpuNNN`: the same GPU pods with more or fewer CPU-only pods (cpu050: 375 of the default trace's
  1,088, asking 6.1 % of the fleet's CPU against 17.9 %). The shipped CSVs do not say the unit of
  NNN; here it is linear and anchored on cpu050: CPU-only pods ask NNN/50 x 6.1 % of the node
  list's CPU (so cpu100 12.2 %, the default trace sits near cpu147, cpu250 30.5 %), drawn with
  replacement from the base trace's CPU-only pods, each at a random position.

Pods are renamed `openb-pod-NNNN` in their final order (the trace order that `--order trace`
replays). Pure apart from the seeded numpy generator it is given.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpuctl.bench.openb import MILLI_PER_GPU, OpenbNode, OpenbPod
from gpuctl.errors import ConfigError, UsageError

KNOBS = ("cpu", "gpushare", "gpuspec", "multigpu")
CPU050_SHARE = 0.061  # cpu050's CPU-only pods ask this share of the openb node list's CPU
POD_HEADER = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


def _sharing(p: OpenbPod) -> bool:
    return p.num_gpu == 1 and p.gpu_milli < MILLI_PER_GPU


def _multi(p: OpenbPod) -> bool:
    return p.num_gpu > 1


def _gpu(pods: Sequence[OpenbPod]) -> int:
    return sum(p.gpu_request_milli for p in pods)


def _with(p: OpenbPod, **changes: object) -> OpenbPod:
    fields = {
        "name": p.name,
        "cpu_milli": p.cpu_milli,
        "memory_mib": p.memory_mib,
        "num_gpu": p.num_gpu,
        "gpu_milli": p.gpu_milli,
        "gpu_spec": p.gpu_spec,
    }
    fields.update(changes)
    return OpenbPod(**fields)  # type: ignore[arg-type]


def _pool(pods: Sequence[OpenbPod], what: str, test: object) -> list[OpenbPod]:
    found = [p for p in pods if test(p)]  # type: ignore[operator]
    if not found:
        raise UsageError(f"the base trace has no {what} pods to draw from")
    return found


def gpushare(pods: Sequence[OpenbPod], pct: float, rng: np.random.Generator) -> list[OpenbPod]:
    out = list(pods)
    sharing = _pool(pods, "GPU-sharing", _sharing)
    whole = _pool(pods, "whole single-GPU", lambda p: p.num_gpu == 1 and not _sharing(p))
    share, total = _gpu([p for p in out if _sharing(p)]), _gpu(out)
    target = pct / 100
    up = share < target * total  # raise the share: whole -> sharing; else the reverse
    for i in rng.permutation(len(out)).tolist():
        if (share >= target * total) if up else (share <= target * total):
            break
        p = out[i]
        if not p.num_gpu or _sharing(p) == up:
            continue
        new = (sharing if up else whole)[int(rng.integers(len(sharing if up else whole)))]
        delta_share = new.gpu_request_milli if up else -p.gpu_request_milli
        share += delta_share
        total += new.gpu_request_milli - p.gpu_request_milli
        out[i] = new
    return out


def multigpu(pods: Sequence[OpenbPod], pct: float, rng: np.random.Generator) -> list[OpenbPod]:
    out = list(pods)
    multi = _pool(pods, "multi-GPU", _multi)
    share, total = _gpu([p for p in out if _multi(p)]), _gpu(out)
    if pct >= 100:
        raise UsageError("multigpu: the share must be below 100")
    while share < pct / 100 * total:
        new = multi[int(rng.integers(len(multi)))]
        out.insert(int(rng.integers(len(out) + 1)), new)
        share += new.gpu_request_milli
        total += new.gpu_request_milli
    return out


def gpuspec(
    pods: Sequence[OpenbPod], pct: float, rng: np.random.Generator, specs: Sequence[OpenbPod]
) -> list[OpenbPod]:
    out = list(pods)
    source = [p.gpu_spec for p in specs if p.num_gpu and p.gpu_spec]
    if not source:
        raise UsageError("gpuspec: the spec source trace has no pod with a gpu_spec")
    gpu_at = [i for i, p in enumerate(out) if p.num_gpu and not p.gpu_spec]
    pinned = sum(1 for p in out if p.num_gpu and p.gpu_spec)
    want = round(pct / 100 * (len(gpu_at) + pinned)) - pinned
    for i in rng.permutation(gpu_at)[: max(want, 0)].tolist():
        out[i] = _with(out[i], gpu_spec=source[int(rng.integers(len(source)))])
    return out


def cpu(
    pods: Sequence[OpenbPod], nnn: float, rng: np.random.Generator, nodes: Sequence[OpenbNode]
) -> list[OpenbPod]:
    cpu_only = _pool(pods, "CPU-only", lambda p: p.num_gpu == 0)
    out = [p for p in pods if p.num_gpu]
    target = nnn / 50 * CPU050_SHARE * sum(n.cpu_milli for n in nodes)
    asked = 0
    while True:
        new = cpu_only[int(rng.integers(len(cpu_only)))]
        if asked + new.cpu_milli > target:
            break
        out.insert(int(rng.integers(len(out) + 1)), new)
        asked += new.cpu_milli
    return out


def generate(
    pods: Sequence[OpenbPod],
    knob: str,
    value: float,
    seed: int,
    *,
    nodes: Sequence[OpenbNode] = (),
    specs: Sequence[OpenbPod] = (),
) -> tuple[OpenbPod, ...]:
    """The workload `<knob><value>` drawn from `pods` with `seed` (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    if knob == "gpushare":
        out = gpushare(pods, value, rng)
    elif knob == "multigpu":
        out = multigpu(pods, value, rng)
    elif knob == "gpuspec":
        out = gpuspec(pods, value, rng, specs)
    elif knob == "cpu":
        out = cpu(pods, value, rng, nodes)
    else:
        raise UsageError(f"unknown knob {knob!r}; known: {', '.join(KNOBS)}")
    return tuple(_with(p, name=f"openb-pod-{i:04d}") for i, p in enumerate(out))


def parse_family(name: str) -> tuple[str, float]:
    """`gpuspec25` -> ("gpuspec", 25.0); `cpu050` -> ("cpu", 50.0)."""
    m = re.fullmatch(r"(cpu|gpushare|gpuspec|multigpu)(\d+)", name)
    if not m:
        raise UsageError(
            f"cannot read workload {name!r}", hint="e.g. gpuspec25, cpu250, multigpu40"
        )
    return m.group(1), float(m.group(2))


def write_pods(path: Path, pods: Sequence[OpenbPod]) -> None:
    try:
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(POD_HEADER)
            for p in pods:
                writer.writerow(
                    (p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec)
                )
    except OSError as exc:
        raise ConfigError(f"cannot write: {exc.strerror or exc}", path=str(path)) from None
