"""One refresh as values: node states, why jobs wait, alerts, a store that cannot be read."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from gpuctl.core.jobs.model import Cordon, Event, JobState
from gpuctl.core.model import Reach
from gpuctl.errors import StateError
from gpuctl.ops import fleetstatus
from gpuctl.ops.dashboard import HealthKeeper, Services, collect
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore

from .conftest import ScriptedSource, fleet, node, populate, submit


def cordon(store: MemoryStore, name: str, at: float, kind: str = "cordon") -> None:
    store.cordon(
        Cordon(name, "maintenance", "bob", "operator", at),
        Event(at, "bob", kind, f"{kind} {name}", node=name),
    )


def test_node_states_come_from_the_answer_and_the_store(
    services: Services, store: MemoryStore, clock: ManualClock, source: ScriptedSource
) -> None:
    made = populate(store, clock)  # a job runs on gpu-01, another on gpu-03
    cordon(store, "gpu-01", clock.now(), kind="drain")  # drained, its job still there
    cordon(store, "gpu-02", clock.now())
    nodes = list(source.snapshot.nodes)
    nodes[2] = node("gpu-03", reach=Reach.REFUSED, error="connection refused")
    source.snapshot = fleet(*nodes)
    data = collect(services)
    assert [(n.name, n.state) for n in data.nodes] == [
        ("gpu-01", "draining"),
        ("gpu-02", "cordoned"),
        ("gpu-03", "down"),
    ]
    assert data.node("gpu-01").jobs == (made["train"].id,)  # type: ignore[union-attr]
    assert data.alerts[0].text == "gpu-03 refused: connection refused"


def test_a_queued_job_that_fits_waits_for_the_control_loop(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    job = submit(store, clock, "small", {"mem_per_gpu": "10GiB"})
    line = collect(services).job(job.id)
    assert line is not None
    assert line.why is not None and line.why.startswith("fits on gpu-0")
    assert line.why.endswith("waits for the control loop")


def test_numbers_are_the_fleet_status_numbers_and_alerts_name_held_jobs(
    services: Services, store: MemoryStore, clock: ManualClock, source: ScriptedSource
) -> None:
    made = populate(store, clock)
    store.update_job(made["big"].id, state=JobState.HELD, reason="crash loop")
    data = collect(services)
    assert data.numbers == fleetstatus.numbers(source.snapshot, store, clock.now())
    assert f"job {made['big'].id} held: crash loop" in [a.text for a in data.alerts]


def test_a_store_that_cannot_be_read_leaves_the_fleet_view_and_says_why(
    services: Services, source: ScriptedSource
) -> None:
    @contextlib.contextmanager
    def broken(write: bool) -> Iterator[MemoryStore]:
        raise StateError("state.db: database disk image is malformed")
        yield MemoryStore()  # pragma: no cover

    data = collect(dataclasses.replace(services, open_store=broken))
    assert [n.name for n in data.nodes] == ["gpu-01", "gpu-02", "gpu-03"]
    assert data.store_error == "state.db: database disk image is malformed"
    assert data.numbers == fleetstatus.numbers(source.snapshot, None, data.now)
    assert data.alerts[0].severity == "critical"
    assert "job figures unavailable" in data.alerts[0].text


def test_a_second_by_second_dashboard_still_tells_a_heat_spike_from_sustained_heat(
    services: Services, source: ScriptedSource
) -> None:
    def hot_at(t: float) -> None:
        source.snapshot = fleet(node("gpu-01", temp_c=92, taken_at=t), taken_at=t)

    health = HealthKeeper()
    for t in range(10):  # ten hot seconds: a spike, not sustained heat
        hot_at(1_000_000.0 + t)
        spike = collect(services, health).node("gpu-01")
    assert spike is not None and spike.verdict is not None
    assert spike.verdict.severity.value == "warn"
    for t in range(10, 61):  # a minute of heat, polled every second
        hot_at(1_000_000.0 + t)
        sustained = collect(services, health).node("gpu-01")
    assert sustained is not None and sustained.verdict is not None
    assert sustained.verdict.severity.value == "critical"
    assert sustained.verdict.action.value == "drain"


def test_heat_that_cooled_off_in_between_is_a_new_spike(
    services: Services, source: ScriptedSource
) -> None:
    def at(t: float, temp: int) -> None:
        source.snapshot = fleet(node("gpu-01", temp_c=temp, taken_at=t), taken_at=t)

    health = HealthKeeper()
    for t in range(61):  # a minute of heat: sustained
        at(1_000_000.0 + t, 92)
        verdict = collect(services, health).node("gpu-01")
    assert verdict is not None and verdict.verdict is not None
    assert verdict.verdict.severity.value == "critical"
    for t in range(61, 121):  # a minute cool
        at(1_000_000.0 + t, 50)
        collect(services, health)
    for t in range(121, 126):  # hot again for five seconds
        at(1_000_000.0 + t, 92)
        verdict = collect(services, health).node("gpu-01")
    assert verdict is not None and verdict.verdict is not None
    assert verdict.verdict.severity.value == "warn"  # a spike: the cool samples ended the streak


def test_why_jobs_wait_is_left_out_unless_asked_for(
    services: Services, store: MemoryStore, clock: ManualClock
) -> None:
    made = populate(store, clock)
    data = collect(services, reasons=False)
    assert not data.reasons
    assert data.job(made["big"].id).why is None  # type: ignore[union-attr]


def test_memory_beyond_allocations_is_one_alert_per_node_naming_its_gpus(
    services: Services, source: ScriptedSource
) -> None:
    source.snapshot = fleet(
        node("gpu-01", used_mib=(20_480, 0, 10_240)),
        node("gpu-02", used_mib=(0, 4_096)),
        node("gpu-03"),
    )
    ghosts = [a for a in collect(services).alerts if a.key.startswith("ghost:")]
    assert [(a.key, a.text) for a in ghosts] == [
        ("ghost:gpu-01", "gpu-01 GPUs 0,2: 30.0 GiB ghost memory"),
        ("ghost:gpu-02", "gpu-02 GPU 1: 4.0 GiB ghost memory"),
    ]
