"""Health checks: poll, remember recent samples, judge each node with the pure core.

`SampleHistory` is the one keeper of recent health samples per node: the last few, only what
the rules look back at (`gpuctl.core.health.look_back_sample`), so a temperature spike is told
from sustained heat. It keeps them in memory (the control loop, the dashboard, the metrics
server) or in the state folder's `health-history.json` (`SampleHistory.in_state_dir`: written
atomically, mode 0600, folder 0700, one writer at a time), so separate one-shot runs (cron,
Nagios) share them. `check_health` polls `samples` times, `interval_s` apart, and returns the
verdicts of the last poll.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from gpuctl.adapters.files import write_atomic
from gpuctl.core.health import HealthRules, NodeVerdict, evaluate_fleet, look_back_sample
from gpuctl.core.model import (
    FleetSnapshot,
    GpuSnapshot,
    Inventory,
    NodeSnapshot,
    NodeSpec,
    NodeState,
    Observation,
    Reach,
)
from gpuctl.errors import StateError, UsageError

HISTORY_FILE = "health-history.json"
SCHEMA = 1
DEFAULT_KEEP = 10  # samples per node
DEFAULT_MAX_AGE_S = 24 * 3600.0  # samples older than this (before the newest) are dropped
MAX_HISTORY_BYTES = 64 << 20
MAX_SAMPLES = 100

History = dict[str, tuple[NodeSnapshot, ...]]


class FleetGatherer(Protocol):
    def gather(self, nodes: Sequence[NodeSpec]) -> FleetSnapshot: ...


class HistoryKeeper(Protocol):
    def record(self, nodes: Sequence[NodeSnapshot]) -> History:
        """Add one poll's snapshots; return each node's earlier samples (before this poll)."""
        ...


class SampleHistory:
    """Recent samples per node: at most `keep`, none older than `max_age_s` before the newest
    sample of the last poll, at most one per `spacing_s` (a dashboard polling every second
    still keeps few), only the GPUs at or above `hot_from_c` when set. In memory, or in `file`.
    """

    def __init__(
        self,
        *,
        keep: int = DEFAULT_KEEP,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        spacing_s: float = 0.0,
        hot_from_c: int | None = None,
        file: HistoryFile | None = None,
    ) -> None:
        self.keep = keep
        self.max_age_s = max_age_s
        self.spacing_s = spacing_s
        self.hot_from_c = hot_from_c
        self.backing: _Memory | HistoryFile = _Memory() if file is None else file

    @classmethod
    def in_state_dir(
        cls, state_dir: Path, *, keep: int = DEFAULT_KEEP, max_age_s: float = DEFAULT_MAX_AGE_S
    ) -> SampleHistory:
        """The history that `gpuctl health`, report, reconcile and playbooks share, in the state
        folder."""
        return cls(keep=keep, max_age_s=max_age_s, file=HistoryFile(state_dir / HISTORY_FILE))

    def load(self) -> History:
        return self.backing.load()

    def record(self, nodes: Sequence[NodeSnapshot]) -> History:
        with self.backing.locked():
            before = self.backing.load()
            self.backing.save(self._add(before, nodes))
        return before

    def _add(self, history: History, nodes: Sequence[NodeSnapshot]) -> History:
        after = dict(history)
        newest = max((n.taken_at for n in nodes if n.taken_at is not None), default=None)
        for node in nodes:
            now = node.taken_at
            if now is None:
                continue
            kept = after.get(node.name, ())
            last = kept[-1].taken_at if kept else None
            if last is not None and 0 <= now - last < self.spacing_s:
                continue  # too soon after the last one kept (a clock stepped back keeps it)
            after[node.name] = (*kept, look_back_sample(node, self.hot_from_c))[-self.keep :]
        if newest is None:
            return after
        oldest = newest - self.max_age_s
        for name, samples in list(after.items()):
            if (samples[0].taken_at or 0.0) < oldest:  # kept in the order they came
                kept = tuple(s for s in samples if (s.taken_at or 0.0) >= oldest)
                if kept:
                    after[name] = kept
                else:
                    del after[name]
        return after


class _Memory:
    """A history kept only as long as its process runs."""

    def __init__(self) -> None:
        self.samples: History = {}

    def load(self) -> History:
        return self.samples

    def save(self, history: History) -> None:
        self.samples = history

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        yield


class HistoryFile:
    """A history in a JSON file (schema `SCHEMA`): read whole, replaced whole, one writer at a
    time (a cron check and an operator's run may overlap)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> History:
        try:
            with self.path.open("rb") as fh:
                raw = fh.read(MAX_HISTORY_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StateError(
                f"{self.path}: cannot read the health history: {exc.strerror}"
            ) from None
        if len(raw) > MAX_HISTORY_BYTES:
            raise self._corrupt(f"larger than {MAX_HISTORY_BYTES >> 20} MiB")
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise self._corrupt("not valid JSON") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise self._corrupt(f"not a version {SCHEMA} health history")
        try:
            return {
                str(name): tuple(_sample_from_dict(str(name), s) for s in samples)
                for name, samples in data["nodes"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError):
            raise self._corrupt("a sample is malformed") from None

    def _corrupt(self, what: str) -> StateError:
        return StateError(
            f"{self.path}: the health history is unreadable ({what})",
            hint=f"remove {self.path} to start a new history (it holds only recent samples)",
        )

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateError(f"{lock}: cannot open the lock file: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def save(self, history: History) -> None:
        doc = {
            "schema": SCHEMA,
            "nodes": {
                name: [_sample_to_dict(s) for s in samples] for name, samples in history.items()
            },
        }
        body = json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False) + "\n"
        try:
            write_atomic(self.path, body)
        except OSError as exc:
            raise StateError(
                f"{self.path}: cannot write the health history: {exc.strerror}"
            ) from None


def _sample_to_dict(node: NodeSnapshot) -> dict[str, Any]:
    obs = node.observation
    return {
        "taken_at": node.taken_at,
        "reach": node.reach.value,
        "nvml_ok": None if obs is None else obs.nvml_ok,
        "gpus": [[g.index, g.uuid, g.temp_c] for g in (obs.gpus if obs else ())],
    }


def _sample_from_dict(name: str, data: Mapping[str, Any]) -> NodeSnapshot:
    taken_at = data["taken_at"]
    if not isinstance(taken_at, int | float) or isinstance(taken_at, bool):
        raise ValueError("taken_at")
    if not math.isfinite(taken_at):
        raise ValueError("taken_at")
    reach = Reach(data["reach"])
    nvml_ok = data["nvml_ok"]
    gpus = []
    for index, uuid, temp_c in data["gpus"]:
        if not isinstance(index, int) or not isinstance(temp_c, int | None):
            raise ValueError("gpus")
        gpus.append(
            GpuSnapshot(index=index, uuid=None if uuid is None else str(uuid), temp_c=temp_c)
        )
    observation = None if nvml_ok is None else Observation(gpus=tuple(gpus), nvml_ok=bool(nvml_ok))
    state = NodeState.READY if reach is Reach.OK else NodeState.DOWN
    return NodeSnapshot(
        name=name, reach=reach, state=state, observation=observation, taken_at=float(taken_at)
    )


# --- the service ---------------------------------------------------------------------------------


def default_interval_s(rules: HealthRules, samples: int) -> float:
    """Spread `samples` polls over the rules' sustained-heat window (0 for one sample)."""
    if samples <= 1:
        return 0.0
    return rules.temperature.sustained_window_s / (samples - 1)


def check_health(
    nodes: Inventory | Sequence[NodeSpec],
    gatherer: FleetGatherer,
    history: HistoryKeeper,
    rules: HealthRules,
    *,
    samples: int = 1,
    interval_s: float | None = None,
    last_reset_uptime_s: Mapping[str, float] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_sample: Callable[[int, int], None] | None = None,
) -> list[NodeVerdict]:
    """Poll `nodes` `samples` times, `interval_s` apart (default: spread over the sustained-heat
    window); record each poll in `history`; return the verdicts of the last poll, in the
    nodes' order. `on_sample(n, samples)` is called before each poll."""
    specs = nodes.nodes if isinstance(nodes, Inventory) else tuple(nodes)
    if not 1 <= samples <= MAX_SAMPLES:
        raise UsageError(f"--samples must be 1 to {MAX_SAMPLES}, got {samples}")
    interval = default_interval_s(rules, samples) if interval_s is None else interval_s
    if not (math.isfinite(interval) and interval >= 0):
        raise UsageError(f"--interval must be 0 or more seconds, got {interval:g}")
    expected = {s.name: s.expected_gpus for s in specs}
    verdicts: tuple[NodeVerdict, ...] = ()
    for n in range(1, samples + 1):
        if n > 1 and interval > 0:
            sleep(interval)
        if on_sample is not None:
            on_sample(n, samples)
        fleet = gatherer.gather(specs)
        earlier = history.record(fleet.nodes)
        verdicts = evaluate_fleet(
            fleet,
            earlier,
            expected_gpus=expected,
            rules=rules,
            last_reset_uptime_s=last_reset_uptime_s,
        )
    return list(verdicts)
