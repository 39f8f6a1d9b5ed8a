"""VerdictMemo: a verdict given again from the poll before is always the verdict judged anew."""

import dataclasses

import pytest

from gpuctl.config.health_rules import load_rules
from gpuctl.core.health import HealthRules, VerdictMemo, evaluate, evaluate_fleet
from gpuctl.core.model import (
    FleetSnapshot,
    GpuSnapshot,
    NodeFacts,
    NodeSnapshot,
    NodeState,
    Observation,
    Reach,
    XidEvent,
)

T0 = 1_000_000.0
GPU_FIELDS = [f.name for f in dataclasses.fields(GpuSnapshot) if f.name != "index"]
ALTERNATIVES: dict[str, list[object]] = {
    "bool": [None, True, False],
    "float": [None, 0.0, 350.5],
    "int": [None, 0, 1, 3, 70, 84, 85, 95, 200],  # temperatures on both sides of the limit
    "str": [None, "", "GPU-other", "00000000:99:00.0"],
}


@pytest.fixture(scope="module")
def rules() -> HealthRules:
    return load_rules()


def gpu(index: int) -> GpuSnapshot:
    return GpuSnapshot(
        index=index,
        uuid=f"GPU-{index}",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        mem_total_mib=81_559,
        mem_used_mib=1000,
        util_pct=50,
        temp_c=60,
        ecc_volatile_uncorrected=0,
        retired_pages_pending=False,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
    )


def node(taken_at: float = T0, **gpu_fields: object) -> NodeSnapshot:
    gpus = (gpu(0), dataclasses.replace(gpu(1), **gpu_fields), gpu(2))
    obs = Observation(gpus=gpus, facts=NodeFacts(hostname="n1"))
    return NodeSnapshot("n1", Reach.OK, NodeState.READY, observation=obs, taken_at=taken_at)


def alternatives(field: str) -> list[object]:
    kind = {f.name: str(f.type) for f in dataclasses.fields(GpuSnapshot)}[field]
    return next(v for k, v in ALTERNATIVES.items() if k in kind)


def both(
    memo: VerdictMemo, snap: NodeSnapshot, rules: HealthRules, **kw: object
) -> tuple[object, object]:
    args: dict[str, object] = {"expected_gpus": None, "rules": rules, **kw}
    return memo.evaluate(snap, (), **args), evaluate(snap, (), **args)  # type: ignore[arg-type]


def test_every_gpu_field_alone_either_changes_nothing_or_is_seen(rules: HealthRules) -> None:
    for field in GPU_FIELDS:
        for value in alternatives(field):
            memo = VerdictMemo()
            memo.evaluate(node(), (), expected_gpus=None, rules=rules)
            kept, fresh = both(memo, node(T0 + 1, **{field: value}), rules)
            assert kept == fresh, (field, value)


def test_what_the_node_says_besides_its_gpus_is_seen(rules: HealthRules) -> None:
    base = node()
    assert base.observation is not None
    obs = base.observation
    changed = [
        dataclasses.replace(base, reach=Reach.TIMEOUT, error="no answer"),
        dataclasses.replace(base, state=NodeState.UNKNOWN),
        dataclasses.replace(base, observation=None),
        dataclasses.replace(base, observation=dataclasses.replace(obs, nvml_ok=False)),
        dataclasses.replace(
            base, observation=dataclasses.replace(obs, nvml_ok=False, notes=("boom",))
        ),
        dataclasses.replace(base, observation=dataclasses.replace(obs, gpus=obs.gpus[:2])),
        dataclasses.replace(
            base,
            observation=dataclasses.replace(
                obs, xids=(XidEvent(xid=79, pci_bus_id="0000:19:00", message="x", at="5.0"),)
            ),
        ),
    ]
    for snap in changed:
        for expected, reset in ((None, None), (3, None), (8, 10.0)):
            memo = VerdictMemo()
            memo.evaluate(base, (), expected_gpus=expected, rules=rules, last_reset_uptime_s=reset)
            kept, fresh = both(memo, snap, rules, expected_gpus=expected, last_reset_uptime_s=reset)
            assert kept == fresh
    memo = VerdictMemo()
    memo.evaluate(base, (), expected_gpus=None, rules=rules)
    kept, fresh = both(memo, base, rules, expected_gpus=7)  # the inventory now expects more
    assert kept == fresh


def test_a_hot_gpu_is_judged_with_its_history_every_time(rules: HealthRules) -> None:
    limit = rules.temperature.limit_c
    samples = [node(T0 + 30 * i, temp_c=limit + 3) for i in range(6)]
    memo = VerdictMemo()
    for i, snap in enumerate(samples):
        earlier = tuple(samples[:i])
        kept = memo.evaluate(snap, earlier, expected_gpus=None, rules=rules)
        assert kept == evaluate(snap, earlier, expected_gpus=None, rules=rules)
    assert memo.reused == 0
    rules_hit = {r.rule for r in kept.reasons}
    assert "temp_sustained" in rules_hit  # the history made it sustained, not a spike


def test_an_unchanged_node_gets_its_verdict_again_with_the_new_sample_time(
    rules: HealthRules,
) -> None:
    memo = VerdictMemo()
    fleet = FleetSnapshot(T0, (node(T0),))
    first = evaluate_fleet(fleet, {}, expected_gpus={}, rules=rules, memo=memo)
    later = FleetSnapshot(T0 + 5, (node(T0 + 5, util_pct=99, temp_c=70, mem_used_mib=9),))
    second = evaluate_fleet(later, {}, expected_gpus={}, rules=rules, memo=memo)
    assert second[0].taken_at == T0 + 5
    assert second[0].gpus is first[0].gpus  # given again, not judged anew
    assert second == evaluate_fleet(later, {}, expected_gpus={}, rules=rules)
