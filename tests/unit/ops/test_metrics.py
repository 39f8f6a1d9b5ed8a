"""The metrics collector: the exposition parsed with Prometheus' own text parser carries exactly
the figures `fleetstatus.numbers` computes for the same state, per node and per GPU."""

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from gpuctl.config.health_rules import load_rules
from gpuctl.config.jobspec import spec_from_data
from gpuctl.core.jobs.model import (
    Checkpoint,
    EndReason,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
    NodeLiveness,
)
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
from gpuctl.errors import StateError, TransportTimeout
from gpuctl.ops import fleetstatus
from gpuctl.ops.metrics import (
    FleetCollector,
    Reading,
    Refresher,
    exposition,
    read_fleet,
    read_store,
)
from gpuctl.testing.fakerunner import ManualClock
from gpuctl.testing.memstore import MemoryStore
from gpuctl.testing.promtool import check_metrics, promtool

NOW = 1_000_000.0
MIB = 1 << 20
CAP = 81559
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def gpu(
    index: int, *, used: int = 0, util: int = 0, temp: int = 40, model: str = "H100"
) -> GpuSnapshot:
    return GpuSnapshot(
        index=index,
        uuid=f"GPU-n1-{index}",
        model=model,
        mem_total_mib=CAP,
        mem_used_mib=used,
        util_pct=util,
        temp_c=temp,
    )


def snapshot(*gpus: GpuSnapshot, at: float = NOW) -> FleetSnapshot:
    up = NodeSnapshot(
        name="n1",
        reach=Reach.OK,
        state=NodeState.READY,
        observation=Observation(gpus=gpus),
        taken_at=at,
    )
    down = NodeSnapshot(
        name="n2", reach=Reach.REFUSED, state=NodeState.DOWN, error="n2: refused", taken_at=at
    )
    return FleetSnapshot(taken_at=at, nodes=(up, down))


INVENTORY = Inventory(
    nodes=(NodeSpec("n1", "127.0.0.1", 2201, expected_gpus=2), NodeSpec("n2", "127.0.0.1", 2202))
)


def job(jid: str, *, submitted: float, tier: str = "standard") -> Job:
    spec = spec_from_data(
        {"name": jid, "command": ["sleep", "1"], "resources": {"mem_per_gpu": "8GiB"}}
    )
    return Job(jid, jid, spec, JobState.QUEUED, 0, tier, submitted, updated_at=submitted)


def launch(store: MemoryStore, jid: str, n: int, card: int, mib: int, at: float) -> None:
    inc = Incarnation(jid, n, "n1", (card,), (f"GPU-n1-{card}",), mib, False,
                      IncarnationState.LAUNCHING, at, f"/runs/{jid}/{n}")  # fmt: skip
    store.begin_launch(
        inc, capacity_mib={("n1", card): CAP}, event=Event(at, "gpuctl", "launch", "l", jid)
    )
    store.update_incarnation(jid, n, state=IncarnationState.RUNNING, pid=100 + n)


def history(store: MemoryStore, now: float = NOW) -> None:
    """A standard job with a checkpoint, a spot job preempted and running again, a queued job,
    an old job (so the preemption rate spans the whole window), and audit events."""
    ev = lambda kind, jid=None: Event(now - 60, "gpuctl", kind, kind, jid, "n1")  # noqa: E731
    store.add_job(job("old", submitted=now - 30 * 3600), ev("submit", "old"))
    launch(store, "old", 1, 0, 8192, now - 29 * 3600)
    store.update_incarnation("old", 1, state=IncarnationState.EXITED, ended_at=now - 28 * 3600,
                             exit_code=0, end_reason=EndReason.EXITED)  # fmt: skip
    store.update_job("old", state=JobState.SUCCEEDED)
    store.add_job(job("a", submitted=now - 7200), ev("submit", "a"))
    launch(store, "a", 1, 0, 8192, now - 7200 + 30)
    store.add_checkpoint(Checkpoint("a", 1, 10, "/ckpt/10", now - 600, "shared"))
    store.add_job(job("b", submitted=now - 3600, tier="spot"), ev("submit", "b"))
    launch(store, "b", 1, 1, 16384, now - 3600 + 90)
    store.update_incarnation("b", 1, state=IncarnationState.KILLED, ended_at=now - 1800,
                             end_reason=EndReason.PREEMPTED)  # fmt: skip
    store.update_job("b", state=JobState.QUEUED)
    launch(store, "b", 2, 1, 16384, now - 1700)
    store.add_job(job("c", submitted=now - 300), ev("submit", "c"))
    for kind in ("failover", "preempt", "preempt", "drain", "launch"):
        store.append_event(ev(kind))


def parse(text: str | bytes) -> dict[str, Samples]:
    """family name -> {(sample name, sorted labels): value}"""
    if isinstance(text, bytes):
        text = text.decode()
    out: dict[str, Samples] = {}
    for family in text_string_to_metric_families(text):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(families: dict[str, Samples], name: str, **labels: str) -> float | None:
    """The value of sample `name` with exactly `labels` (None: no such sample)."""
    for samples in families.values():
        for (sample, lbls), v in samples.items():
            if sample == name and dict(lbls) == labels:
                return v
    return None


def verdicts(snap: FleetSnapshot) -> Sequence[Any]:
    from gpuctl.core.health import evaluate_fleet

    return evaluate_fleet(snap, {}, expected_gpus={"n1": 2, "n2": None}, rules=load_rules())


# --- the five numbers ----------------------------------------------------------------------------


def test_fleet_gauges_equal_the_status_numbers_for_the_same_state() -> None:
    store = MemoryStore()
    history(store)
    snap = snapshot(gpu(0, used=8000, util=50), gpu(1, used=20000, util=70))
    numbers = fleetstatus.numbers(snap, store, NOW)
    got = parse(exposition(read_fleet(snap, store, NOW, verdicts(snap))))
    assert numbers.allocated_mib == 8192 + 16384  # the history is what we think it is
    assert value(got, "gpuctl_utilization_ratio") == pytest.approx(numbers.utilization_pct / 100)
    assert value(got, "gpuctl_memory_allocated_bytes") == numbers.allocated_mib * MIB
    assert value(got, "gpuctl_memory_capacity_bytes") == numbers.capacity_mib * MIB == 2 * CAP * MIB
    assert value(got, "gpuctl_observed_utilization_ratio") == pytest.approx(0.60)
    assert value(got, "gpuctl_queue_wait_p50_seconds") == numbers.jobs.queue_wait_p50_s
    assert value(got, "gpuctl_queue_wait_p95_seconds") == numbers.jobs.queue_wait_p95_s
    assert numbers.jobs.queue_wait_p95_s == 90.0
    assert value(got, "gpuctl_queue_waiting_jobs") == numbers.jobs.queue_waiting == 1
    assert value(got, "gpuctl_queue_oldest_wait_seconds") == numbers.jobs.queue_oldest_wait_s == 300
    assert (
        value(got, "gpuctl_checkpoint_age_seconds", stat="max") == numbers.jobs.checkpoint_age_max_s
    )
    assert (
        value(got, "gpuctl_checkpoint_age_seconds", stat="p95") == numbers.jobs.checkpoint_age_p95_s
    )
    assert value(got, "gpuctl_running_jobs") == numbers.jobs.checkpoint_running_jobs == 2
    assert value(got, "gpuctl_checkpoint_missing_jobs") == numbers.jobs.checkpoint_missing == 1
    assert (
        value(got, "gpuctl_failover_success_ratio")
        == numbers.jobs.failover_success_pct / 100
        == 1.0
    )
    assert value(got, "gpuctl_preemptions_per_hour") == numbers.jobs.preemptions_per_hour == 1 / 24
    assert value(got, "gpuctl_spot_preempted_ratio") == numbers.jobs.spot_preempted_pct / 100
    assert value(got, "gpuctl_utilization_band", band=numbers.band) == 1.0
    assert sum(v for v in got["gpuctl_utilization_band"].values()) == 1.0


def test_an_undefined_number_has_no_sample_never_a_zero() -> None:
    snap = snapshot(gpu(0), gpu(1))
    numbers = fleetstatus.numbers(snap, None, NOW)
    got = parse(exposition(read_fleet(snap, None, NOW, verdicts(snap))))
    assert numbers.jobs.failover_success_pct is None
    assert got["gpuctl_failover_success_ratio"] == {}
    frag = value(got, "gpuctl_fragmentation_ratio")  # defined: measured on the free cards
    assert frag == pytest.approx(numbers.fragmentation_pct / 100)
    assert got["gpuctl_queue_wait_p50_seconds"] == {}
    assert "gpuctl_queue_wait_seconds" not in got  # no store read: no histogram
    assert value(got, "gpuctl_utilization_ratio") == 0.0  # defined: nothing allocated
    assert "gpuctl_failovers" not in got  # no store read: no counters rather than zeros


# --- queue wait: a histogram --------------------------------------------------------------------


def started(store: MemoryStore, jid: str, wait_s: float, at: float) -> None:
    """A job that first started `wait_s` after it was submitted, at `at`, and finished."""
    store.add_job(job(jid, submitted=at - wait_s), Event(at - wait_s, "gpuctl", "submit", "s", jid))
    launch(store, jid, 1, 0, 8192, at)
    store.update_incarnation(jid, 1, state=IncarnationState.EXITED, ended_at=at + 1,
                             exit_code=0, end_reason=EndReason.EXITED)  # fmt: skip
    store.update_job(jid, state=JobState.SUCCEEDED)


def test_queue_wait_is_a_histogram_of_every_started_job_from_seconds_to_days() -> None:
    store = MemoryStore()
    waits = {"w1": 0.5, "w2": 1.0, "w3": 45.0, "w4": 4000.0, "w5": 2 * 86400.0, "w6": 9 * 86400.0}
    for i, (jid, wait) in enumerate(waits.items()):
        # two of them started 10 days ago: out of status's 24-hour window, in the histogram
        started(store, jid, wait, NOW - (10 * 86400 if i < 2 else 100 + i))
    store.add_job(job("queued", submitted=NOW - 50), Event(NOW - 50, "gpuctl", "submit", "s"))
    for reading in (read_store(store, NOW), read_fleet(snapshot(gpu(0), gpu(1)), store, NOW, ())):
        got = parse(exposition(reading))
        assert next(f for f in text_string_to_metric_families(exposition(reading).decode())
                    if f.name == "gpuctl_queue_wait_seconds").type == "histogram"  # fmt: skip
        buckets = {
            dict(lbls)["le"]: v
            for (name, lbls), v in got["gpuctl_queue_wait_seconds"].items()
            if name == "gpuctl_queue_wait_seconds_bucket"
        }
        assert buckets == {
            "1.0": 2, "5.0": 2, "15.0": 2, "30.0": 2, "60.0": 3, "300.0": 3, "900.0": 3,
            "1800.0": 3, "3600.0": 3, "7200.0": 4, "21600.0": 4, "43200.0": 4, "86400.0": 4,
            "172800.0": 5, "604800.0": 5, "+Inf": 6,
        }  # fmt: skip
        assert value(got, "gpuctl_queue_wait_seconds_count") == 6  # the queued job: not yet
        assert value(got, "gpuctl_queue_wait_seconds_sum") == sum(waits.values())
        assert value(got, "gpuctl_queue_wait_p50_seconds") == 4000.0  # the window's 4 starts


def test_the_queue_wait_histogram_keeps_its_last_counts_while_the_store_refuses() -> None:
    store = MemoryStore()
    started(store, "a", 30.0, NOW - 100)
    r = refresher(CountingGatherer([snapshot(gpu(0), gpu(1))]), store, ManualClock(NOW))
    assert value(parse(exposition(r.refresh())), "gpuctl_queue_wait_seconds_count") == 1
    r._open_store = lambda: (_ for _ in ()).throw(StateError("store: corrupt"))  # type: ignore[method-assign]
    got = parse(exposition(r.refresh()))
    assert value(got, "gpuctl_queue_wait_seconds_count") == 1  # a counter never drops to nothing
    assert value(got, "gpuctl_queue_wait_seconds_sum") == 30.0


# --- promtool: the exposition and the example alert rules validate -----------------------------


def test_promtool_check_metrics_passes_on_every_kind_of_exposition() -> None:
    store = MemoryStore()
    history(store)
    store.set_liveness(NodeLiveness("n1", NOW - 5, None))
    snap = snapshot(gpu(0, used=8000, util=50), gpu(1, used=20000, util=70, temp=90))
    for reading in (
        read_fleet(snap, store, NOW, verdicts(snap)),  # a poll and the store
        read_fleet(snap, None, NOW, verdicts(snap)),  # no store
        read_store(store, NOW),  # --from-store
    ):
        check_metrics(exposition(reading))


DEPLOY = Path(__file__).parents[3] / "deploy" / "prometheus"


def test_the_example_alert_rules_pass_promtool_check_and_their_unit_tests() -> None:
    assert "SUCCESS: 6 rules found" in promtool("check", "rules", DEPLOY / "gpuctl-alerts.yml")
    assert "SUCCESS" in promtool("test", "rules", "gpuctl-alerts.test.yml", cwd=DEPLOY)


# --- nodes and GPUs ------------------------------------------------------------------------------


def test_per_node_and_per_gpu_gauges_show_reach_health_and_both_memory_views() -> None:
    store = MemoryStore()
    history(store)
    snap = snapshot(gpu(0, used=8000, util=50, temp=41), gpu(1, used=20000, util=70, temp=90))
    got = parse(exposition(read_fleet(snap, store, NOW, verdicts(snap))))
    assert value(got, "gpuctl_node_up", node="n1") == 1.0
    assert value(got, "gpuctl_node_up", node="n2") == 0.0
    assert value(got, "gpuctl_node_schedulable", node="n2") == 0.0
    assert value(got, "gpuctl_node_health", node="n1", verdict="degraded") == 1.0  # one hot GPU
    assert value(got, "gpuctl_node_health", node="n1", verdict="healthy") == 0.0
    assert value(got, "gpuctl_node_health", node="n2", verdict="unknown") == 1.0
    card0 = {"node": "n1", "Hostname": "n1", "gpu": "0", "UUID": "GPU-n1-0"}
    card1 = {"node": "n1", "Hostname": "n1", "gpu": "1", "UUID": "GPU-n1-1"}
    assert value(got, "gpuctl_gpu_memory_allocated_bytes", **card0) == 8192 * MIB
    assert value(got, "gpuctl_gpu_memory_observed_bytes", **card0) == 8000 * MIB
    assert value(got, "gpuctl_gpu_memory_total_bytes", **card0) == CAP * MIB
    assert value(got, "gpuctl_gpu_memory_allocated_bytes", **card1) == 16384 * MIB
    assert value(got, "gpuctl_gpu_memory_ghost_bytes", **card1) == (20000 - 16384) * MIB
    assert value(got, "gpuctl_gpu_utilization_ratio", **card1) == pytest.approx(0.70)
    assert value(got, "gpuctl_gpu_temperature_celsius", **card1) == 90.0
    assert value(got, "gpuctl_gpu_health", **card1, verdict="degraded") == 1.0
    assert value(got, "gpuctl_gpu_health", **card0, verdict="healthy") == 1.0
    assert value(got, "gpuctl_gpu_info", **card0, model="H100", pci_bus_id="") == 1.0
    assert not any(lbls and dict(lbls).get("node") == "n2" for _, lbls in got["gpuctl_gpu_info"])


def test_label_values_from_node_output_lose_control_characters() -> None:
    snap = snapshot(gpu(0, model="H100\x1b[31m\x07 evil"), gpu(1))
    text = exposition(read_fleet(snap, None, NOW, verdicts(snap))).decode()
    assert "\x1b" not in text and "\x07" not in text
    assert value(parse(text), "gpuctl_gpu_info", node="n1", Hostname="n1", gpu="0",
                 UUID="GPU-n1-0", model="H100[31m evil", pci_bus_id="") == 1.0  # fmt: skip


# --- counters ------------------------------------------------------------------------------------


def test_counters_count_failover_preempt_and_drain_events_of_the_audit_log() -> None:
    store = MemoryStore()
    history(store)
    snap = snapshot(gpu(0), gpu(1))
    got = parse(exposition(read_fleet(snap, store, NOW, verdicts(snap))))
    assert value(got, "gpuctl_failovers_total") == 1.0
    assert value(got, "gpuctl_preemptions_total") == 2.0
    assert value(got, "gpuctl_drains_total") == 1.0
    for name in ("gpuctl_failovers", "gpuctl_preemptions", "gpuctl_drains"):
        assert next(f for f in text_string_to_metric_families(
            exposition(read_fleet(snap, store, NOW, ())).decode()) if f.name == name
        ).type == "counter"  # fmt: skip


def test_every_family_has_help_text_and_the_docs_describe_it() -> None:
    store = MemoryStore()
    history(store)
    snap = snapshot(gpu(0), gpu(1))
    families = list(text_string_to_metric_families(
        exposition(read_fleet(snap, store, NOW, verdicts(snap))).decode()))  # fmt: skip
    docs = (Path(__file__).parents[3] / "docs" / "metrics.md").read_text()
    assert len(families) > 30
    for f in families:
        assert f.documentation, f.name
        exposed = f.name + ("_total" if f.type == "counter" else "")
        assert f"`{exposed}" in docs, f"docs/metrics.md does not describe {exposed}"


# --- refreshing and scraping ---------------------------------------------------------------------


class CountingGatherer:
    def __init__(self, snaps: Sequence[FleetSnapshot]) -> None:
        self.snaps = list(snaps)
        self.calls = 0

    def gather(self, nodes: Sequence[NodeSpec]) -> FleetSnapshot:
        self.calls += 1
        item = self.snaps[min(self.calls, len(self.snaps)) - 1]
        if isinstance(item, Exception):
            raise item
        return item


def refresher(gatherer: CountingGatherer, store: Any, clock: ManualClock) -> Refresher:
    def opener() -> Any:
        if isinstance(store, Exception):
            raise store
        return store

    return Refresher(open_store=opener, clock=clock, rules=load_rules(), inventory=INVENTORY,
                     gatherer=gatherer)  # fmt: skip


def test_a_scrape_reads_the_latest_values_and_never_polls() -> None:
    gatherer = CountingGatherer([snapshot(gpu(0), gpu(1))])
    collector = FleetCollector()
    collector.update(refresher(gatherer, MemoryStore(), ManualClock(NOW)).refresh())
    first = parse(exposition(collector.latest))
    for _ in range(3):
        assert value(parse(collector.render()[1]), "gpuctl_node_up", node="n1") == 1.0
    assert gatherer.calls == 1
    assert value(first, "gpuctl_refresh_timestamp_seconds") == NOW
    assert not any(m.name.startswith("gpuctl") for m in REGISTRY.collect())  # our own registry


def test_health_across_refreshes_tells_sustained_heat_from_a_spike() -> None:
    clock = ManualClock(NOW)
    snaps = [snapshot(gpu(0), gpu(1, temp=95), at=NOW + 30 * i) for i in range(3)]
    r = refresher(CountingGatherer(snaps), MemoryStore(), clock)
    seen = []
    for _ in snaps:
        reading = r.refresh()
        seen.append(next(g.verdict for g in reading.gpus if g.index == 1).value)
        clock.advance(30)
    assert seen == ["degraded", "degraded", "unhealthy"]  # a spike warns; sustained heat drains


def test_an_unreadable_store_keeps_the_fleet_gauges_and_the_last_counts() -> None:
    store = MemoryStore()
    history(store)
    snap = snapshot(gpu(0), gpu(1))
    good = refresher(CountingGatherer([snap]), store, ManualClock(NOW))
    assert good.refresh().counters == {"failover": 1, "preempt": 2, "drain": 1}
    good._open_store = lambda: (_ for _ in ()).throw(StateError("store: corrupt"))  # type: ignore[method-assign]
    reading = good.refresh()
    got = parse(exposition(reading))
    assert reading.store_error == "store: corrupt"
    assert value(got, "gpuctl_store_readable") == 0.0
    assert value(got, "gpuctl_failovers_total") == 1.0  # the last counts read
    assert value(got, "gpuctl_utilization_ratio") == 0.0  # the poll still counts
    assert value(got, "gpuctl_node_up", node="n1") == 1.0


def test_a_failed_refresh_keeps_serving_the_previous_values_and_says_why() -> None:
    snaps: list[Any] = [snapshot(gpu(0), gpu(1)), TransportTimeout("poll took too long")]
    r = refresher(CountingGatherer(snaps), MemoryStore(), ManualClock(NOW))
    collector, stop = FleetCollector(), threading.Event()
    log: list[tuple[Reading | None, str | None]] = []

    def on_refresh(reading: Reading | None, error: str | None) -> None:
        log.append((reading, error))
        if len(log) == 2:
            stop.set()

    r.run(collector, 0.0, stop, on_refresh)
    assert log[0][0] is not None and log[0][1] is None
    assert log[1] == (None, "poll took too long")
    assert collector.latest is log[0][0]


def test_from_the_store_only_job_figures_counters_and_liveness_are_shown() -> None:
    store = MemoryStore()
    history(store)
    store.set_liveness(NodeLiveness("n1", NOW - 5, None))
    store.set_liveness(NodeLiveness("n2", NOW - 900, NOW - 900, down=True))
    numbers = fleetstatus.numbers(snapshot(gpu(0), gpu(1)), store, NOW)
    got = parse(exposition(read_store(store, NOW)))
    assert got["gpuctl_utilization_ratio"] == {}  # needs a poll
    assert got["gpuctl_gpu_memory_total_bytes"] == {}
    assert value(got, "gpuctl_queue_waiting_jobs") == numbers.jobs.queue_waiting == 1
    assert value(got, "gpuctl_failover_success_ratio") == 1.0
    assert value(got, "gpuctl_node_up", node="n1") == 1.0
    assert value(got, "gpuctl_node_up", node="n2") == 0.0
    assert value(got, "gpuctl_preemptions_total") == 2.0


def test_before_the_first_refresh_the_exposition_is_empty() -> None:
    assert exposition(None) == b""
