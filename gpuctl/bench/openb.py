"""Loading the Alibaba `openb` trace CSVs (node list and pod list)."""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from gpuctl.errors import ConfigError

MILLI_PER_GPU = 1000

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # gpu_spec is optional


@dataclasses.dataclass(frozen=True, slots=True)
class OpenbNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclasses.dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU, 0..1000; 0 when num_gpu == 0
    gpu_spec: str = ""  # '|'-separated acceptable models; empty: any

    @property
    def gpu_request_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
    with handle:
        reader = csv.DictReader(handle)
        try:
            header = reader.fieldnames
        except (csv.Error, UnicodeDecodeError) as exc:
            raise ConfigError(f"not a CSV file: {exc}", path=str(path)) from None
        if not header:
            raise ConfigError("empty file, expected a CSV header", path=str(path))
        missing = [c for c in required if c not in header]
        if missing:
            raise ConfigError(
                f"missing column(s) {', '.join(missing)}; header is {','.join(header)}",
                path=str(path),
                line=1,
            )
        try:
            for row in reader:
                yield reader.line_num, row
        except (csv.Error, UnicodeDecodeError) as exc:
            raise ConfigError(f"not a CSV file: {exc}", path=str(path)) from None


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(
            f"expected a non-negative integer, got {raw!r}", path=str(path), line=line, field=column
        ) from None
    if value < 0:
        raise ConfigError(
            f"expected a non-negative integer, got {value}", path=str(path), line=line, field=column
        )
    return value


def _name(path: Path, line: int, row: dict[str, str], column: str, seen: set[str]) -> str:
    name = (row.get(column) or "").strip()
    if not name:
        raise ConfigError("empty name", path=str(path), line=line, field=column)
    if name in seen:
        raise ConfigError(f"duplicate name {name!r}", path=str(path), line=line, field=column)
    seen.add(name)
    return name


def load_nodes(path: Path) -> tuple[OpenbNode, ...]:
    """The node list (`openb_node_list_gpu_node.csv`): sn, cpu_milli, memory_mib, gpu, model."""
    nodes: list[OpenbNode] = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        nodes.append(
            OpenbNode(
                name=_name(path, line, row, "sn", seen),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpus=_int(path, line, row, "gpu"),
                model=(row.get("model") or "").strip(),
            )
        )
    if not nodes:
        raise ConfigError("no nodes", path=str(path))
    if sum(n.gpus for n in nodes) == 0:
        raise ConfigError("no node has a GPU", path=str(path), field="gpu")
    return tuple(nodes)


def load_pods(path: Path) -> tuple[OpenbPod, ...]:
    """A pod list (`openb_pod_list_*.csv`): name, cpu_milli, memory_mib, num_gpu, gpu_milli and
    an optional gpu_spec. Other columns (qos, phase, times) are not used by the protocol."""
    pods: list[OpenbPod] = []
    seen: set[str] = set()
    for line, row in _rows(path, POD_COLUMNS):
        num_gpu = _int(path, line, row, "num_gpu")
        gpu_milli = min(_int(path, line, row, "gpu_milli"), MILLI_PER_GPU) if num_gpu else 0
        if num_gpu and gpu_milli == 0:
            raise ConfigError(
                "a pod with num_gpu > 0 must ask for gpu_milli > 0",
                path=str(path),
                line=line,
                field="gpu_milli",
            )
        if num_gpu > 1 and gpu_milli != MILLI_PER_GPU:
            raise ConfigError(
                f"a multi-GPU pod must ask for whole GPUs (gpu_milli={MILLI_PER_GPU})",
                path=str(path),
                line=line,
                field="gpu_milli",
            )
        pods.append(
            OpenbPod(
                name=_name(path, line, row, "name", seen),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=(row.get("gpu_spec") or "").strip() if num_gpu else "",
            )
        )
    if not pods:
        raise ConfigError("no pods", path=str(path))
    return tuple(pods)
