"""What the probe reads, exported per GPU with dcgm-exporter's labels, and the per-job series, from
a real nvidia-smi capture (tests/fixtures/nvidia-smi, MIT) run through the probe's parser."""

import dataclasses
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuctl.adapters.probe import parse_probe
from gpuctl.adapters.probe.script import frame_probe_output
from gpuctl.config.jobspec import spec_from_data
from gpuctl.core.jobs.model import (
    Checkpoint,
    Event,
    Incarnation,
    IncarnationState,
    Job,
    JobState,
)
from gpuctl.core.model import FleetSnapshot, NodeSnapshot, NodeState, Observation, Reach
from gpuctl.ops.metrics import exposition, read_fleet, read_store
from gpuctl.testing.memstore import MemoryStore
from gpuctl.testing.promtool import check_metrics, promtool

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
NOW = 2_000_000.0
MIB = 1 << 20
UUID = "GPU-00000000-0000-0000-0000-000000000000"  # the capture's (masked by its project)
CARD = {"node": "n1", "Hostname": "gpu-node-07", "gpu": "0", "UUID": UUID}
FACTS = b"hostname=gpu-node-07\nclock_s=1784016758\ncpu_count=20\n"
# the capture's H100 is at 00000000:00:09.0; the XID of 0000:18:00 is another card's
XIDS = (
    b"source=dmesg\n"
    b"[  812.500001] NVRM: Xid (PCI:0000:00:09): 13, pid=11345, name=gpu_burn, Graphics "
    b"SM Warp Exception\n"
    b"[  900.100000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has "
    b"fallen off the bus.\n"
    b"[  901.000000] NVRM: Xid (PCI:0000:00:09): 31, pid=11345, name=gpu_burn, MMU Fault\n"
    b"[  950.250000] NVRM: Xid (PCI:0000:00:09): 13, pid=11345, name=gpu_burn, Graphics "
    b"Exception\n"
    b"[  960.000000] NVRM: Xid (PCI:0000:00:09): 43, pid=11345, name=gpu_burn, Ch 00000010\n"
)


def observation(scenario: str, xids: bytes = b"source=dmesg\n") -> Observation:
    out = frame_probe_output(
        [
            ("facts", FACTS, b"", 0),
            ("gpu", (FIXTURES / scenario / "query-gpu-load.csv").read_bytes(), b"", 0),
            ("apps", (FIXTURES / scenario / "compute-apps-load.csv").read_bytes(), b"", 0),
            ("version", (FIXTURES / scenario / "version.txt").read_bytes(), b"", 0),
            ("xid", xids, b"", 0),
        ]
    )
    return parse_probe(out, 0)


def fleet(obs: Observation) -> FleetSnapshot:
    node = NodeSnapshot("n1", Reach.OK, NodeState.READY, observation=obs, taken_at=NOW)
    return FleetSnapshot(taken_at=NOW, nodes=(node,))


def parse(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
    }


def value(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return got.get((name, tuple(sorted(labels.items()))))


def names(
    got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> list[dict[str, str]]:
    return [dict(lbls) for n, lbls in got if n == name]


# --- the probe's readings, per GPU ---------------------------------------------------------------


def test_the_h100_capture_exports_power_ecc_rows_slowdown_and_xids_under_dcgm_labels() -> None:
    got = parse(exposition(read_fleet(fleet(observation("h100", XIDS)), None, NOW, ())))
    assert value(got, "gpuctl_gpu_power_watts", **CARD) == 631.95
    assert value(got, "gpuctl_gpu_power_limit_watts", **CARD) == 700.0
    for kind in ("corrected", "uncorrected"):
        assert value(got, "gpuctl_gpu_ecc_volatile_errors", **CARD, kind=kind) == 0
        assert value(got, "gpuctl_gpu_ecc_aggregate_errors_total", **CARD, kind=kind) == 0
    assert value(got, "gpuctl_gpu_remapped_rows", **CARD, kind="correctable") == 0
    assert value(got, "gpuctl_gpu_remapped_rows", **CARD, kind="uncorrectable") == 0
    assert value(got, "gpuctl_gpu_remapped_rows_pending", **CARD) == 0
    assert value(got, "gpuctl_gpu_remap_failure", **CARD) == 0
    assert value(got, "gpuctl_gpu_thermal_slowdown", **CARD, kind="hardware") == 0
    assert value(got, "gpuctl_gpu_thermal_slowdown", **CARD, kind="software") == 0
    assert names(got, "gpuctl_gpu_retired_pages") == []  # H100 reports rows, not pages: N/A
    assert value(got, "gpuctl_gpu_last_xid", **CARD) == 43  # the newest of this card's
    assert value(got, "gpuctl_gpu_xid_errors", **CARD, xid="13") == 2
    assert value(got, "gpuctl_gpu_xid_errors", **CARD, xid="31") == 1
    assert value(got, "gpuctl_gpu_xid_errors", **CARD, xid="43") == 1
    assert len(names(got, "gpuctl_gpu_xid_errors")) == 3  # 0000:18:00's XID 79 is not this card's
    assert value(got, "gpuctl_gpu_memory_observed_bytes", **CARD) == 19818 * MIB
    assert (
        value(got, "gpuctl_gpu_info", **CARD, model="NVIDIA H100 80GB HBM3",
              pci_bus_id="00000000:00:09.0") == 1
    )  # fmt: skip


def test_errors_the_card_counts_show_with_their_kinds_and_a_quiet_log_reads_last_xid_0() -> None:
    obs = observation("h100")
    worn = dataclasses.replace(
        obs.gpus[0],
        ecc_volatile_corrected=3,
        ecc_aggregate_corrected=117,
        ecc_aggregate_uncorrected=1,
        remapped_rows_correctable=2,
        remapped_rows_pending=True,
        thermal_slowdown_hw=True,
        retired_pages_sbe=4,
        retired_pages_dbe=0,
        retired_pages_pending=False,
    )
    got = parse(
        exposition(read_fleet(fleet(dataclasses.replace(obs, gpus=(worn,))), None, NOW, ()))
    )
    assert value(got, "gpuctl_gpu_ecc_volatile_errors", **CARD, kind="corrected") == 3
    assert value(got, "gpuctl_gpu_ecc_aggregate_errors_total", **CARD, kind="corrected") == 117
    assert value(got, "gpuctl_gpu_ecc_aggregate_errors_total", **CARD, kind="uncorrected") == 1
    assert value(got, "gpuctl_gpu_remapped_rows", **CARD, kind="correctable") == 2
    assert value(got, "gpuctl_gpu_remapped_rows_pending", **CARD) == 1
    assert value(got, "gpuctl_gpu_thermal_slowdown", **CARD, kind="hardware") == 1
    assert value(got, "gpuctl_gpu_retired_pages", **CARD, cause="sbe") == 4
    assert value(got, "gpuctl_gpu_retired_pages", **CARD, cause="dbe") == 0
    assert value(got, "gpuctl_gpu_retired_pages_pending", **CARD) == 0
    assert value(got, "gpuctl_gpu_last_xid", **CARD) == 0  # dcgm-exporter's "none"
    assert names(got, "gpuctl_gpu_xid_errors") == []
    types = {f.name: f.type for f in text_string_to_metric_families(
        exposition(read_fleet(fleet(obs), None, NOW, ())).decode())}  # fmt: skip
    assert types["gpuctl_gpu_ecc_aggregate_errors"] == "counter"  # kept by the card for life
    assert types["gpuctl_gpu_ecc_volatile_errors"] == "gauge"  # a driver reload resets it


def test_what_a_mig_card_does_not_report_has_no_sample() -> None:
    got = parse(exposition(read_fleet(fleet(observation("h200-mig")), None, NOW, ())))
    card = {**CARD}
    assert value(got, "gpuctl_gpu_power_watts", **card) == 295.01
    assert names(got, "gpuctl_gpu_remapped_rows") == []  # N/A under MIG
    assert names(got, "gpuctl_gpu_utilization_ratio") == []


# --- jobs ----------------------------------------------------------------------------------------


def job(jid: str, state: JobState, *, submitted: float, **kw: object) -> Job:
    spec = spec_from_data(
        {"name": jid, "command": ["sleep", "1"], "resources": {"mem_per_gpu": "8GiB"}}
    )
    return Job(
        jid, f"{jid}-name", spec, state, 0, "standard", submitted, updated_at=submitted, **kw
    )  # type: ignore[arg-type]


def store_with_jobs() -> MemoryStore:
    """train: running on the capture's H100 (its pid is the capture's gpu_burn, 15690 MiB), a
    checkpoint 10 minutes old, incarnation 3 after 2 restarts; waiting: queued; stuck: held;
    done: succeeded (no series)."""
    store = MemoryStore()
    store.add_job(
        job("train", JobState.QUEUED, submitted=NOW - 7200),
        Event(NOW - 7200, "u", "submit", "s", "train"),
    )
    store.update_job("train", restarts=2)
    for n in (1, 2, 3):
        at = NOW - 3600 + n
        inc = Incarnation("train", n, "n1", (0,), (UUID,), 20480, False,
                          IncarnationState.LAUNCHING, at, f"/runs/{n}")  # fmt: skip
        launched = Event(NOW, "gpuctl", "launch", "l", "train")
        store.begin_launch(inc, capacity_mib={("n1", 0): 81559}, event=launched)
        if n < 3:
            store.update_incarnation("train", n, state=IncarnationState.EXITED, ended_at=NOW)
            store.update_job("train", state=JobState.QUEUED)
    store.update_incarnation("train", 3, state=IncarnationState.RUNNING, pid=11345)
    store.add_checkpoint(Checkpoint("train", 3, 40, "/ckpt/40", NOW - 600, "shared"))
    store.add_job(
        job("waiting", JobState.QUEUED, submitted=NOW - 60),
        Event(NOW - 60, "u", "submit", "s", "waiting"),
    )
    store.add_job(
        job("stuck", JobState.QUEUED, submitted=NOW - 60),
        Event(NOW - 60, "u", "submit", "s", "stuck"),
    )
    store.update_job("stuck", state=JobState.HELD, reason="crash loop")
    store.add_job(
        job("done", JobState.QUEUED, submitted=NOW - 90000), Event(NOW, "u", "submit", "s", "done")
    )
    store.update_job("done", state=JobState.SUCCEEDED)
    return store


def test_live_jobs_have_state_cards_memory_checkpoint_age_incarnation_and_restarts() -> None:
    store = store_with_jobs()
    got = parse(exposition(read_fleet(fleet(observation("h100")), store, NOW, ())))
    train = {"job_id": "train", "job_name": "train-name"}
    assert value(got, "gpuctl_job_state", **train, state="running", tier="standard", node="n1") == 1
    assert value(got, "gpuctl_job_state", job_id="waiting", job_name="waiting-name",
                 state="queued", tier="standard", node="") == 1  # fmt: skip
    assert value(got, "gpuctl_job_state", job_id="stuck", job_name="stuck-name",
                 state="held", tier="standard", node="") == 1  # fmt: skip
    assert {d["job_id"] for d in names(got, "gpuctl_job_state")} == {"train", "waiting", "stuck"}
    assert value(got, "gpuctl_held_jobs") == 1
    assert value(got, "gpuctl_job_cards", **train, node="n1") == 1
    assert value(got, "gpuctl_job_memory_allocated_bytes", **train, node="n1") == 20480 * MIB
    assert value(got, "gpuctl_job_memory_observed_bytes", **train, node="n1") == 15690 * MIB
    assert value(got, "gpuctl_job_checkpoint_age_seconds", **train) == 600
    assert value(got, "gpuctl_job_incarnation", **train) == 3
    assert value(got, "gpuctl_job_restarts", **train) == 2
    assert value(got, "gpuctl_job_incarnation", job_id="waiting", job_name="waiting-name") == 0
    assert names(got, "gpuctl_job_checkpoint_age_seconds") == [train]  # running jobs only
    assert value(got, "gpuctl_gpu_job_info", **CARD, **train) == 1
    assert len(names(got, "gpuctl_gpu_job_info")) == 1


def test_from_the_store_jobs_have_series_but_no_observed_memory_and_promtool_passes() -> None:
    store = store_with_jobs()
    page = exposition(read_store(store, NOW))
    got = parse(page)
    train = {"job_id": "train", "job_name": "train-name", "node": "n1"}
    assert value(got, "gpuctl_job_memory_allocated_bytes", **train) == 20480 * MIB
    assert names(got, "gpuctl_job_memory_observed_bytes") == []  # needs a poll
    assert names(got, "gpuctl_gpu_job_info") == []  # no GPUs without a poll
    check_metrics(page)
    check_metrics(exposition(read_fleet(fleet(observation("h100", XIDS)), store, NOW, ())))


def test_label_values_are_quoted_as_the_text_format_wants() -> None:
    obs = observation("h100")
    odd = dataclasses.replace(obs.gpus[0], model='H100 "SXM" \\ 5')
    page = exposition(read_fleet(fleet(dataclasses.replace(obs, gpus=(odd,))), None, NOW, ()))
    check_metrics(page)
    got = parse(page)
    assert value(got, "gpuctl_gpu_info", **CARD, model='H100 "SXM" \\ 5',
                 pci_bus_id="00000000:00:09.0") == 1  # fmt: skip


# --- joining dcgm-exporter -----------------------------------------------------------------------

DEPLOY = Path(__file__).parents[3] / "deploy" / "prometheus"


def test_dcgm_series_join_gpuctls_on_their_own_labels_in_promtools_rule_tests() -> None:
    assert "SUCCESS: 3 rules found" in promtool("check", "rules", DEPLOY / "gpuctl-dcgm.yml")
    assert "SUCCESS" in promtool("test", "rules", "gpuctl-dcgm.test.yml", cwd=DEPLOY)
    # the test's gpuctl series carry the labels a real exposition has
    got = parse(exposition(read_fleet(fleet(observation("h100")), store_with_jobs(), NOW, ())))
    (info,) = names(got, "gpuctl_gpu_job_info")
    assert set(info) == {"node", "Hostname", "gpu", "UUID", "job_id", "job_name"}
