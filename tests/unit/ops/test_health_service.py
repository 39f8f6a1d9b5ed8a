"""The health service: samples over time, a history that outlives one run, private files."""

import json
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuctl.config.health_rules import load_rules
from gpuctl.core.health import Action, HealthRules, Verdict
from gpuctl.core.model import (
    FleetSnapshot,
    GpuSnapshot,
    NodeSnapshot,
    NodeSpec,
    NodeState,
    Observation,
    Reach,
)
from gpuctl.errors import StateError, UsageError
from gpuctl.ops.health import HISTORY_FILE, SampleHistory, check_health, default_interval_s

SPECS = (
    NodeSpec(name="gpu01", host="10.0.0.1", expected_gpus=2),
    NodeSpec(name="gpu02", host="10.0.0.2", expected_gpus=2),
)


class ScriptedGatherer:
    """Answers each poll with the next temperatures of gpu01's first card; the clock moves 30s."""

    def __init__(self, temps: Sequence[int], start: float = 1_700_000_000.0) -> None:
        self.temps = list(temps)
        self.now = start
        self.polls = 0

    def gather(self, nodes: Sequence[NodeSpec]) -> FleetSnapshot:
        temp = self.temps[self.polls]
        self.polls += 1
        self.now += 30
        snaps = []
        for spec in nodes:
            hot = temp if spec.name == "gpu01" else 40
            gpus = (
                GpuSnapshot(index=0, uuid=f"GPU-{spec.name}-0", temp_c=hot),
                GpuSnapshot(index=1, uuid=f"GPU-{spec.name}-1", temp_c=40),
            )
            snaps.append(
                NodeSnapshot(
                    name=spec.name,
                    reach=Reach.OK,
                    state=NodeState.READY,
                    observation=Observation(gpus=gpus),
                    taken_at=self.now,
                )
            )
        return FleetSnapshot(taken_at=self.now, nodes=tuple(snaps))


@pytest.fixture(scope="module")
def rules() -> HealthRules:
    return load_rules()


def test_three_samples_tell_sustained_heat_from_a_spike(rules: HealthRules, tmp_path: Path) -> None:
    sleeps: list[float] = []
    verdicts = check_health(
        SPECS,
        ScriptedGatherer([95, 95, 95]),
        SampleHistory.in_state_dir(tmp_path),
        rules,
        samples=3,
        sleep=sleeps.append,
    )
    assert sleeps == [30.0, 30.0]  # the 60 s window spread over three polls
    by_name = {v.name: v for v in verdicts}
    assert (by_name["gpu01"].verdict, by_name["gpu01"].action) == (
        Verdict.UNHEALTHY,
        Action.DRAIN,
    )
    assert by_name["gpu02"].verdict is Verdict.HEALTHY

    spike = check_health(
        SPECS,
        ScriptedGatherer([40, 40, 95], start=1_800_000_000.0),
        SampleHistory.in_state_dir(tmp_path / "other"),
        rules,
        samples=3,
        sleep=sleeps.append,
    )
    assert [r.rule for r in spike[0].reasons] == ["temp_spike"]


def test_one_shot_runs_remember_earlier_samples_through_the_history_file(
    rules: HealthRules, tmp_path: Path
) -> None:
    gatherer = ScriptedGatherer([95, 95, 95])
    results = [
        check_health(SPECS, gatherer, SampleHistory.in_state_dir(tmp_path), rules)[0]
        for _ in range(3)
    ]
    assert [v.action for v in results] == [Action.ALERT, Action.ALERT, Action.DRAIN]


def test_the_history_file_is_private_small_and_keeps_the_last_samples(
    rules: HealthRules, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    history = SampleHistory.in_state_dir(state, keep=4)
    gatherer = ScriptedGatherer([50] * 6)
    for _ in range(6):
        check_health(SPECS, gatherer, history, rules)
    path = state / HISTORY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    data = json.loads(path.read_text())
    assert sorted(data["nodes"]) == ["gpu01", "gpu02"]
    assert len(data["nodes"]["gpu01"]) == 4
    assert data["nodes"]["gpu01"][-1] == {
        "taken_at": gatherer.now,
        "reach": "ok",
        "nvml_ok": True,
        "gpus": [[0, "GPU-gpu01-0", 50], [1, "GPU-gpu01-1", 40]],
    }
    loaded = history.load()
    assert [s.taken_at for s in loaded["gpu01"]] == [gatherer.now - 30 * i for i in (3, 2, 1, 0)]


def test_samples_older_than_the_age_limit_are_dropped(tmp_path: Path) -> None:
    history = SampleHistory.in_state_dir(tmp_path, max_age_s=3600)
    old = ScriptedGatherer([50], start=1_000.0).gather(SPECS)
    new = ScriptedGatherer([50], start=1_000.0 + 7200).gather(SPECS[:1])
    history.record(old.nodes)
    assert set(history.record(new.nodes)) == {"gpu01", "gpu02"}
    assert {name: len(s) for name, s in history.load().items()} == {"gpu01": 1}


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"schema": 99, "nodes": {}}', b'{"schema": 1, "nodes": {"a": [{"x": 1}]}}'],
)
def test_an_unreadable_history_is_refused_with_a_hint_not_silently_replaced(
    tmp_path: Path, body: bytes
) -> None:
    (tmp_path / HISTORY_FILE).write_bytes(body)
    with pytest.raises(StateError) as caught:
        SampleHistory.in_state_dir(tmp_path).load()
    assert caught.value.message.startswith(f"{tmp_path / HISTORY_FILE}: the health history is")
    assert caught.value.hint == f"remove {tmp_path / HISTORY_FILE} to start a new history " + (
        "(it holds only recent samples)"
    )
    assert (tmp_path / HISTORY_FILE).read_bytes() == body


def test_an_unreadable_sample_breaks_a_hot_streak_in_the_history(
    rules: HealthRules, tmp_path: Path
) -> None:
    actions = {}
    for case in ("seen", "blind"):
        history = SampleHistory.in_state_dir(tmp_path / case)
        hot = ScriptedGatherer([95, 95, 95])
        for _ in range(2):  # hot at +30 s and +60 s
            history.record(hot.gather(SPECS).nodes)
        if case == "blind":  # nvidia-smi did not answer at +75 s
            blind = NodeSnapshot(
                name="gpu01",
                reach=Reach.OK,
                state=NodeState.UNKNOWN,
                observation=Observation(nvml_ok=False, notes=("nvidia-smi timed out",)),
                taken_at=hot.now + 15,
            )
            history.record([blind])
        actions[case] = check_health(SPECS, hot, history, rules)[0].action  # hot at +90 s
    assert actions == {"seen": Action.DRAIN, "blind": Action.ALERT}


def test_a_history_in_memory_judges_as_the_history_file_does(
    rules: HealthRules, tmp_path: Path
) -> None:
    """The control loop keeps its samples in memory, one-shot runs in the file: one keeper."""
    temps = [95, 95, 40, 95, 95, 95, 95]
    actions = {}
    for where, history in (
        ("memory", SampleHistory()),
        ("file", SampleHistory.in_state_dir(tmp_path)),
    ):
        gatherer = ScriptedGatherer(temps)
        actions[where] = [check_health(SPECS, gatherer, history, rules)[0].action for _ in temps]
    assert actions["memory"] == actions["file"]
    assert actions["memory"][-1] is Action.DRAIN and actions["memory"][3] is Action.ALERT


def test_a_dashboard_history_keeps_a_sample_per_spacing_and_only_hot_gpus(
    rules: HealthRules,
) -> None:
    history = SampleHistory(keep=10, spacing_s=20.0, hot_from_c=85)
    start = 1_000_000.0
    for t in range(61):  # polled every second for a minute, gpu01's card 0 hot
        nodes = [
            NodeSnapshot(
                name="gpu01",
                reach=Reach.OK,
                state=NodeState.READY,
                observation=Observation(
                    gpus=(
                        GpuSnapshot(index=0, uuid="GPU-a", temp_c=92, power_w=300.0),
                        GpuSnapshot(index=1, uuid="GPU-b", temp_c=40),
                    )
                ),
                taken_at=start + t,
                labels={"rack": "r1"},
            )
        ]
        history.record(nodes)
    kept = history.load()["gpu01"]
    assert [s.taken_at - start for s in kept] == [0.0, 20.0, 40.0, 60.0]
    assert {s.gpus for s in kept} == {(GpuSnapshot(index=0, uuid="GPU-a", temp_c=92),)}
    assert all(s.labels == {} for s in kept)


def test_a_node_gone_from_the_polls_ages_out_of_a_history_in_memory(tmp_path: Path) -> None:
    history = SampleHistory(max_age_s=3600)
    history.record(ScriptedGatherer([50], start=1_000.0).gather(SPECS).nodes)
    history.record(ScriptedGatherer([50], start=1_000.0 + 7200).gather(SPECS[:1]).nodes)
    assert {name: len(s) for name, s in history.load().items()} == {"gpu01": 1}


def test_bad_sample_counts_and_intervals_are_usage_errors(
    rules: HealthRules, tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match="--samples must be 1 to 100"):
        check_health(
            SPECS, ScriptedGatherer([]), SampleHistory.in_state_dir(tmp_path), rules, samples=0
        )
    with pytest.raises(UsageError, match="--interval must be 0 or more"):
        check_health(
            SPECS,
            ScriptedGatherer([]),
            SampleHistory.in_state_dir(tmp_path),
            rules,
            interval_s=-1.0,
        )
    assert default_interval_s(rules, 1) == 0.0
    assert default_interval_s(rules, 4) == 20.0
