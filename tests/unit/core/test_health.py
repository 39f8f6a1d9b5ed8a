"""Health verdicts: every XID class of the rules file, ECC, retired pages, row remapping, heat,
missing and unreadable GPUs, resets, and a node clock that is off."""

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuctl.core.health
from gpuctl.adapters.probe import parse_probe
from gpuctl.adapters.probe.script import frame_probe_output
from gpuctl.config.health_rules import load_rules
from gpuctl.core.health import (
    Action,
    HealthRules,
    NodeVerdict,
    Severity,
    Verdict,
    evaluate,
    evaluate_fleet,
    worst,
)
from gpuctl.core.model import (
    GpuSnapshot,
    NodeFacts,
    NodeSnapshot,
    NodeState,
    Observation,
    Reach,
    XidEvent,
)

RULES_FILE = Path(gpuctl.core.health.__file__).parent / "rules.yaml"
TABLE = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
XID_CASES = [
    pytest.param(name, xid, spec["action"], spec["severity"], id=f"xid{xid}-{name}")
    for name, spec in TABLE["xid_classes"].items()
    for xid in spec["xids"]
]
T0 = 1_700_000_000.0  # gpuctl's clock at the latest sample


@pytest.fixture(scope="module")
def rules() -> HealthRules:
    return load_rules()


def pci(index: int) -> str:
    return f"00000000:{0x18 + index:02X}:00.0"


def gpu(index: int, **fields: object) -> GpuSnapshot:
    base: dict[str, object] = {
        "uuid": f"GPU-{index:04d}",
        "pci_bus_id": pci(index),
        "temp_c": 40,
        "ecc_volatile_uncorrected": 0,
        "retired_pages_pending": False,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
    }
    return GpuSnapshot(index=index, **{**base, **fields})  # type: ignore[arg-type]


def xid(number: int, index: int = 0, at: str | None = "1234.500000") -> XidEvent:
    kernel_pci = f"0000:{0x18 + index:02x}:00"  # the kernel log's spelling of the same device
    return XidEvent(xid=number, pci_bus_id=kernel_pci, message="test event.", at=at)


def node(
    *gpus: GpuSnapshot,
    xids: tuple[XidEvent, ...] = (),
    taken_at: float = T0,
    clock_s: float | None = T0,
    nvml_ok: bool = True,
    notes: tuple[str, ...] = (),
    name: str = "gpu01",
) -> NodeSnapshot:
    obs = Observation(
        gpus=gpus if gpus or not nvml_ok else (gpu(0), gpu(1)),
        xids=xids,
        facts=NodeFacts(hostname=name, clock_s=clock_s),
        notes=notes,
        nvml_ok=nvml_ok,
    )
    return NodeSnapshot(
        name=name,
        reach=Reach.OK,
        state=NodeState.READY if nvml_ok else NodeState.UNKNOWN,
        observation=obs,
        taken_at=taken_at,
    )


def judge(
    snap: NodeSnapshot,
    rules: HealthRules,
    history: tuple[NodeSnapshot, ...] = (),
    expected_gpus: int | None = None,
    reset: float | None = None,
) -> NodeVerdict:
    return evaluate(
        snap, history, expected_gpus=expected_gpus, rules=rules, last_reset_uptime_s=reset
    )


# --- XIDs: table-driven from the rules file ------------------------------------------------------


@pytest.mark.parametrize(("cls", "number", "action", "severity"), XID_CASES)
def test_each_xid_of_the_rules_table_takes_its_class_action(
    rules: HealthRules, cls: str, number: int, action: str, severity: str
) -> None:
    verdict = judge(node(gpu(0), gpu(1), xids=(xid(number, index=1),)), rules)
    assert verdict.action is Action(action)
    assert verdict.severity is Severity(severity)
    [reason] = verdict.reasons
    assert (reason.rule, reason.gpu) == (f"xid_{cls}", 1)  # tied to its GPU by the PCI address
    assert f"XID {number}" in reason.text
    assert verdict.gpus[1].severity is Severity(severity)
    assert verdict.gpus[0].verdict is Verdict.HEALTHY


def test_the_rules_table_blames_application_xids_on_the_job_and_drains_hardware_ones() -> None:
    by_action: dict[str, set[int]] = {}
    for spec in TABLE["xid_classes"].values():
        by_action.setdefault(spec["action"], set()).update(spec["xids"])
    assert {13, 31, 43, 45, 68, 109} <= by_action["none"]
    assert {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120} <= by_action["drain"]


def test_an_application_xid_leaves_the_node_healthy_and_names_the_job_as_the_cause(
    rules: HealthRules,
) -> None:
    verdict = judge(node(xids=(xid(13),)), rules)
    assert (verdict.verdict, verdict.action, verdict.alert) == (Verdict.HEALTHY, Action.NONE, False)
    assert "blamed on the job" in verdict.reasons[0].text


@pytest.mark.parametrize("number", [1, 8, 32, 999])
def test_an_xid_missing_from_the_table_cordons_and_alerts(rules: HealthRules, number: int) -> None:
    assert all(number not in spec["xids"] for spec in TABLE["xid_classes"].values())
    verdict = judge(node(xids=(xid(number),)), rules)
    assert (verdict.action, verdict.alert) == (Action.CORDON, True)
    assert (verdict.severity, verdict.verdict) == (Severity.WARN, Verdict.DEGRADED)
    assert verdict.reasons[0].rule == "xid_unknown"


def test_repeated_xids_are_one_reason_with_a_count(rules: HealthRules) -> None:
    verdict = judge(node(xids=(xid(79), xid(79), xid(79))), rules)
    [reason] = verdict.reasons
    assert "XID 79 x3" in reason.text


def test_an_xid_of_a_device_that_is_no_gpu_on_the_list_is_the_nodes(rules: HealthRules) -> None:
    verdict = judge(node(gpu(0), xids=(xid(79, index=5),)), rules)
    assert verdict.reasons[0].gpu is None
    assert verdict.action is Action.DRAIN
    assert verdict.gpus[0].verdict is Verdict.HEALTHY


def test_xids_logged_before_the_last_verified_reset_are_ignored(rules: HealthRules) -> None:
    events = (xid(79, at="100.000000"), xid(48, at="5000.250000"))
    before = judge(node(xids=events), rules)
    assert before.action is Action.DRAIN
    assert {r.text.split(" x")[0] for r in before.reasons} == {"XID 48", "XID 79"}

    after_first = judge(node(xids=events), rules, reset=4000.0)
    assert [r.text.split(" x")[0] for r in after_first.reasons] == ["XID 48"]
    assert after_first.xids_ignored == 1

    after_both = judge(node(xids=events), rules, reset=5000.25)
    assert (after_both.verdict, after_both.action, after_both.reasons) == (
        Verdict.HEALTHY,
        Action.NONE,
        (),
    )
    assert after_both.xids_ignored == 2


def test_an_xid_whose_stamp_is_no_uptime_still_counts_after_a_reset(rules: HealthRules) -> None:
    verdict = judge(node(xids=(xid(79, at="Tue Mar  3 10:00:00 2026"),)), rules, reset=9e9)
    assert verdict.action is Action.DRAIN


# --- ECC, retired pages, row remapping -----------------------------------------------------------


def test_volatile_uncorrectable_ecc_drains_and_names_the_gpu(rules: HealthRules) -> None:
    verdict = judge(node(gpu(0), gpu(1, ecc_volatile_uncorrected=4)), rules)
    assert (verdict.verdict, verdict.severity, verdict.action) == (
        Verdict.UNHEALTHY,
        Severity.CRITICAL,
        Action.DRAIN,
    )
    [reason] = verdict.reasons
    assert (reason.rule, reason.gpu) == ("ecc_uncorrected", 1)
    assert reason.text.startswith("4 volatile uncorrectable ECC error(s)")
    assert [g.verdict for g in verdict.gpus] == [Verdict.HEALTHY, Verdict.UNHEALTHY]


def test_aggregate_ecc_errors_from_before_alone_do_not_drain(rules: HealthRules) -> None:
    verdict = judge(node(gpu(0, ecc_aggregate_uncorrected=3, ecc_volatile_corrected=7)), rules)
    assert verdict.verdict is Verdict.HEALTHY


@pytest.mark.parametrize(
    ("fields", "rule", "verdict", "action"),
    [
        ({"retired_pages_pending": True}, "retired_pages_pending", Verdict.DEGRADED, Action.ALERT),
        (
            {"retired_pages_sbe": 20, "retired_pages_dbe": 40},
            "retired_pages_exhausted",
            Verdict.UNHEALTHY,
            Action.DRAIN,
        ),
        ({"remapped_rows_pending": True}, "row_remap_pending", Verdict.DEGRADED, Action.ALERT),
        (
            {"remapped_rows_pending": True, "remapped_rows_failure": True},
            "row_remap_failure",
            Verdict.UNHEALTHY,
            Action.DRAIN,
        ),
    ],
)
def test_pending_page_retirement_or_row_remap_degrades_and_failure_drains(
    rules: HealthRules, fields: dict[str, object], rule: str, verdict: Verdict, action: Action
) -> None:
    result = judge(node(gpu(0, **fields)), rules)
    assert [r.rule for r in result.reasons] == [rule]
    assert (result.verdict, result.action) == (verdict, action)


def test_a_few_retired_pages_without_pending_are_healthy(rules: HealthRules) -> None:
    assert judge(node(gpu(0, retired_pages_sbe=2, retired_pages_dbe=1)), rules).reasons == ()


# --- temperature: spike versus sustained ---------------------------------------------------------


def hot_history(*temps_and_ages: tuple[int, float]) -> tuple[NodeSnapshot, ...]:
    return tuple(node(gpu(0, temp_c=t), taken_at=T0 - age) for t, age in temps_and_ages)


def test_one_hot_sample_is_a_spike_that_warns_but_does_not_drain(rules: HealthRules) -> None:
    verdict = judge(node(gpu(0, temp_c=95)), rules, history=hot_history((50, 30), (50, 60)))
    assert [r.rule for r in verdict.reasons] == ["temp_spike"]
    assert (verdict.verdict, verdict.action) == (Verdict.DEGRADED, Action.ALERT)
    assert "95 C" in verdict.reasons[0].text


def test_heat_sustained_over_the_window_drains(rules: HealthRules) -> None:
    verdict = judge(node(gpu(0, temp_c=95)), rules, history=hot_history((91, 60), (93, 30)))
    assert [r.rule for r in verdict.reasons] == ["temp_sustained"]
    assert (verdict.verdict, verdict.action) == (Verdict.UNHEALTHY, Action.DRAIN)
    assert "for 3 samples over 60s" in verdict.reasons[0].text


@pytest.mark.parametrize(
    "history",
    [
        pytest.param(((91, 20), (93, 10)), id="three-samples-in-20s-short-of-the-window"),
        pytest.param(((91, 90), (60, 60), (93, 30)), id="a-cool-sample-breaks-the-streak"),
        pytest.param(((91, 960), (93, 660)), id="samples-too-far-apart"),
        pytest.param(((93, 30),), id="too-few-samples"),
    ],
)
def test_heat_without_enough_consecutive_evidence_stays_a_spike(
    rules: HealthRules, history: tuple[tuple[int, float], ...]
) -> None:
    verdict = judge(node(gpu(0, temp_c=95)), rules, history=hot_history(*history))
    assert [r.rule for r in verdict.reasons] == ["temp_spike"]


def test_heat_of_a_replaced_card_in_the_same_slot_does_not_count(rules: HealthRules) -> None:
    old_card = tuple(node(gpu(0, temp_c=95, uuid="GPU-old"), taken_at=T0 - age) for age in (60, 30))
    verdict = judge(node(gpu(0, temp_c=95)), rules, history=old_card)
    assert [r.rule for r in verdict.reasons] == ["temp_spike"]


def test_history_order_and_other_nodes_samples_do_not_matter(rules: HealthRules) -> None:
    history = hot_history((91, 60), (93, 30))
    other = node(gpu(0, temp_c=20), taken_at=T0 - 45, name="gpu02")
    later = node(gpu(0, temp_c=20), taken_at=T0 + 10)
    current = node(gpu(0, temp_c=95))
    one = judge(current, rules, history=history)
    assert judge(current, rules, history=(later, *reversed(history), other)) == one


def test_thermal_slowdown_warns(rules: HealthRules) -> None:
    verdict = judge(node(gpu(0, thermal_slowdown_hw=True)), rules)
    assert [r.text for r in verdict.reasons] == ["hardware thermal slowdown active"]
    assert verdict.action is Action.ALERT


# --- missing, unreadable, unreachable ------------------------------------------------------------


def test_fewer_gpus_than_the_inventory_expects_drains(rules: HealthRules) -> None:
    verdict = judge(node(gpu(0), gpu(1)), rules, expected_gpus=4)
    [reason] = verdict.reasons
    assert (reason.rule, reason.gpu) == ("gpu_missing", None)
    assert reason.text == "2 GPU(s) missing: the inventory expects 4, the node shows 2"
    assert (verdict.verdict, verdict.action) == (Verdict.UNHEALTHY, Action.DRAIN)
    assert judge(node(gpu(0), gpu(1)), rules, expected_gpus=2).reasons == ()


def _probe(*sections: tuple[str, bytes, bytes, int | str]) -> NodeSnapshot:
    obs = parse_probe(frame_probe_output([("facts", b"clock_s=1\n", b"", 0), *sections]), 0)
    return NodeSnapshot(
        name="gpu01", reach=Reach.OK, state=NodeState.UNKNOWN, observation=obs, taken_at=T0
    )


@pytest.mark.parametrize(
    ("snapshot", "why"),
    [
        pytest.param(
            NodeSnapshot(
                name="gpu01",
                reach=Reach.OK,
                state=NodeState.UNKNOWN,
                observation=parse_probe(b"\xff\x1b[2Jgarbage, 0, GPU-\n\x00", 0),
                taken_at=T0,
            ),
            "no gpuctl header",
            id="garbage",
        ),
        pytest.param(_probe(("gpu", b"", b"", 124)), "timed out", id="hung-nvidia-smi"),
        pytest.param(
            _probe(("gpu", b"", b"NVIDIA-SMI has failed", 9)), "NVIDIA-SMI has failed", id="failed"
        ),
    ],
)
def test_unreadable_gpus_are_unknown_and_cordon_without_touching_running_jobs(
    rules: HealthRules, snapshot: NodeSnapshot, why: str
) -> None:
    assert snapshot.observation is not None and not snapshot.observation.nvml_ok
    verdict = judge(snapshot, rules, expected_gpus=8)
    assert (verdict.verdict, verdict.severity, verdict.action) == (
        Verdict.UNKNOWN,
        Severity.UNKNOWN,
        Action.CORDON,
    )
    assert [r.rule for r in verdict.reasons] == ["unreadable"]  # not "8 GPUs missing"
    assert why in verdict.reasons[0].text
    assert verdict.gpus == ()


def test_an_xid_that_drains_still_drains_when_nvidia_smi_cannot_answer(rules: HealthRules) -> None:
    snap = node(nvml_ok=False, notes=("nvidia-smi GPU query failed",), xids=(xid(79),))
    verdict = judge(snap, rules)
    assert (verdict.severity, verdict.action) == (Severity.CRITICAL, Action.DRAIN)
    assert {r.rule for r in verdict.reasons} == {"unreadable", "xid_hardware"}


def test_a_node_that_does_not_answer_is_unknown_and_left_to_liveness(rules: HealthRules) -> None:
    down = NodeSnapshot(
        name="gpu01",
        reach=Reach.TIMEOUT,
        state=NodeState.DOWN,
        error="gpu01 (10.0.0.1:22): timeout (connect) after 5s",
        taken_at=T0,
    )
    verdict = judge(down, rules, expected_gpus=8)
    assert (verdict.verdict, verdict.action) == (Verdict.UNKNOWN, Action.NONE)
    assert verdict.reasons[0].text == (
        "node did not answer (timeout): gpu01 (10.0.0.1:22): timeout (connect) after 5s"
    )


# --- clocks, fleets, determinism -----------------------------------------------------------------


@pytest.mark.parametrize("offset_s", [3600.0, -3600.0])
def test_a_node_clock_off_by_an_hour_changes_no_verdict(
    rules: HealthRules, offset_s: float
) -> None:
    def shifted(snap: NodeSnapshot) -> NodeSnapshot:
        assert snap.observation is not None
        facts = dataclasses.replace(snap.observation.facts, clock_s=T0 + offset_s)
        return dataclasses.replace(
            snap, observation=dataclasses.replace(snap.observation, facts=facts)
        )

    cases = [
        (node(gpu(0, temp_c=95)), hot_history((91, 60), (93, 30))),  # sustained
        (node(gpu(0, temp_c=95)), hot_history((50, 30))),  # spike
        (node(xids=(xid(79, at="100.0"), xid(13, at="6000.0"))), ()),  # reset at 5000
        (node(gpu(0)), ()),
    ]
    for current, history in cases:
        expected = judge(current, rules, history=history, reset=5000.0)
        moved = judge(shifted(current), rules, history=tuple(map(shifted, history)), reset=5000.0)
        assert moved == expected


def test_only_differences_of_gpuctls_own_sample_times_matter(rules: HealthRules) -> None:
    history = hot_history((91, 60), (93, 30))
    current = node(gpu(0, temp_c=95))
    expected = judge(current, rules, history=history)
    later = [dataclasses.replace(h, taken_at=(h.taken_at or 0) + 86400) for h in history]
    moved = judge(dataclasses.replace(current, taken_at=T0 + 86400), rules, history=tuple(later))
    assert dataclasses.replace(moved, taken_at=T0) == expected


def test_the_fleet_is_judged_node_by_node_in_its_order(rules: HealthRules) -> None:
    fleet = (
        node(gpu(0), gpu(1), name="b"),
        node(gpu(0, ecc_volatile_uncorrected=1), name="a"),
        node(gpu(0), name="c"),
    )
    verdicts = evaluate_fleet(fleet, {}, expected_gpus={"b": 2, "a": 1, "c": 2}, rules=rules)
    assert [(v.name, v.verdict) for v in verdicts] == [
        ("b", Verdict.HEALTHY),
        ("a", Verdict.UNHEALTHY),
        ("c", Verdict.UNHEALTHY),  # one of two GPUs missing
    ]
    assert worst(verdicts).nagios == 2


@pytest.mark.parametrize(
    ("severities", "expected"),
    [
        ([], Severity.OK),
        ([Severity.OK, Severity.WARN], Severity.WARN),
        ([Severity.WARN, Severity.UNKNOWN], Severity.UNKNOWN),
        ([Severity.UNKNOWN, Severity.CRITICAL, Severity.WARN], Severity.CRITICAL),
    ],
)
def test_the_worst_node_sets_the_nagios_status(
    rules: HealthRules, severities: list[Severity], expected: Severity
) -> None:
    verdicts = [
        NodeVerdict(
            name=f"n{i}", verdict=s.verdict, severity=s, action=Action.NONE, reasons=(), gpus=()
        )
        for i, s in enumerate(severities)
    ]
    assert worst(verdicts) is expected
    assert [s.nagios for s in Severity] == [0, 1, 2, 3]


gpus_strategy = st.lists(
    st.builds(
        gpu,
        st.integers(0, 3),
        temp_c=st.none() | st.integers(20, 110),
        ecc_volatile_uncorrected=st.none() | st.integers(0, 3),
        retired_pages_pending=st.none() | st.booleans(),
        remapped_rows_pending=st.none() | st.booleans(),
        remapped_rows_failure=st.none() | st.booleans(),
    ),
    max_size=4,
    unique_by=lambda g: g.index,
)


@settings(max_examples=60, deadline=None)
@given(
    gpus=gpus_strategy,
    xids=st.lists(st.builds(xid, st.integers(1, 200), st.integers(0, 5)), max_size=4),
    expected=st.none() | st.integers(0, 5),
)
def test_the_node_verdict_is_the_worst_of_its_reasons_and_the_same_every_time(
    gpus: list[GpuSnapshot], xids: list[XidEvent], expected: int | None
) -> None:
    rules = load_rules()
    snap = node(*gpus, xids=tuple(xids)) if gpus else node(gpu(0), xids=tuple(xids))
    verdict = judge(snap, rules, expected_gpus=expected)
    assert verdict == judge(snap, rules, expected_gpus=expected)
    assert verdict.severity is max(
        (r.severity for r in verdict.reasons), key=lambda s: s.rank, default=Severity.OK
    )
    assert verdict.verdict is verdict.severity.verdict
    assert verdict.action.rank == max((r.action.rank for r in verdict.reasons), default=0)
    for g in verdict.gpus:
        assert all(r.gpu == g.index for r in g.reasons)
        assert g.severity.rank <= verdict.severity.rank
