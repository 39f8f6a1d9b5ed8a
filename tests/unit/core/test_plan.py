"""Plans as values: JSON round trip, text, diff, apply (and refusing a stale plan)."""

import dataclasses
import json

import pytest

from gpuctl.core.placement import (
    Card,
    FleetState,
    JobRequest,
    JobShape,
    PlacementNode,
    Settings,
    Tier,
)
from gpuctl.core.placement.engine import plan
from gpuctl.core.placement.plan import (
    Placed,
    apply_plan,
    diff_plans,
    plan_from_dict,
    plan_to_dict,
    render_diff,
)
from gpuctl.core.placement.policies import DEFAULT_POLICY
from gpuctl.core.placement.render import render_placement
from gpuctl.core.units import MemPerCard
from gpuctl.errors import PlanError

GIB = 1024
OPEN = Settings(band_max=1.0, headroom=0.0)


def state(version: str = "v1", cordon_b: bool = False) -> FleetState:
    def n(name: str, model: str, **kw: object) -> PlacementNode:
        cards = tuple(Card(i, 80 * GIB, f"GPU-{name}-{i}", model) for i in range(2))
        return PlacementNode(name=name, cards=cards, labels={"zone": "eu"}, **kw)  # type: ignore[arg-type]

    b = {"schedulable": False, "reason": "cordoned"} if cordon_b else {}
    return FleetState(
        nodes=(
            n("gpu-a", "NVIDIA H100 80GB HBM3"),
            n("gpu-b", "NVIDIA A100-SXM4-80GB", **b),
            n("gpu-c", "NVIDIA A100-SXM4-80GB"),
        ),
        version=version,
    )


JOBS = (
    JobRequest("train", JobShape(2, MemPerCard.whole_card(), ("H100",)), priority=5),
    JobRequest("infer", JobShape(1, MemPerCard.of_mib(24 * GIB))),
    JobRequest("sweep", JobShape(1, MemPerCard.of_fraction(0.25)), tier=Tier.SPOT),
    JobRequest("huge", JobShape(4, MemPerCard.whole_card())),
)


def test_a_plan_survives_a_json_round_trip() -> None:
    p = plan(state(), JOBS, OPEN)
    doc = json.loads(json.dumps(plan_to_dict(p)))
    assert plan_from_dict(doc) == p


def test_the_json_document_names_node_cards_score_runner_up_and_reasons() -> None:
    doc = plan_to_dict(plan(state(), JOBS, OPEN))
    assert doc["version"] == "v1"
    assert doc["summary"] == {
        "jobs": 4,
        "placed": 3,
        "unplaced": 1,
        "nodes": 3,
        "schedulable_nodes": 3,
    }
    train = doc["jobs"][0]
    assert (train["job"], train["node"], train["cards"], train["whole"]) == (
        "train",
        "gpu-a",
        [0, 1],
        True,
    )
    infer = next(j for j in doc["jobs"] if j["job"] == "infer")
    assert set(infer["runner_up"]) == {"node", "score"}
    huge = next(j for j in doc["jobs"] if j["job"] == "huge")
    assert huge["placed"] is False
    assert huge["reason"].startswith("no node can take 4 × whole cards")
    assert huge["rejections"][0] == {
        "constraint": "gpu_count",
        "summary": "fewer than 4 usable cards",
        "count": 3,
        "nodes": ["gpu-a", "gpu-b", "gpu-c"],
    }


def test_something_that_is_not_a_plan_is_refused() -> None:
    with pytest.raises(PlanError, match="not a gpuctl plan"):
        plan_from_dict({"nodes": []})
    doc = plan_to_dict(plan(state(), JOBS, OPEN))
    del doc["jobs"][0]["allocation"]
    with pytest.raises(PlanError, match="not a valid plan"):
        plan_from_dict(doc)


def test_the_text_shows_each_job_and_why_one_was_not_placed() -> None:
    text = render_placement(plan(state(), JOBS, OPEN), explain=False)
    lines = text.splitlines()
    assert lines[0].startswith(f"fleet version v1 · policy {DEFAULT_POLICY} · utilization 0.0% -> ")
    assert lines[1].split() == [
        "JOB",
        "TIER",
        "PRIORITY",
        "NODE",
        "CARDS",
        "MEM/CARD",
        "SCORE",
        "RUNNER-UP",
    ]
    assert lines[2].split()[:6] == ["train", "standard", "5", "gpu-a", "0,1", "whole"]
    assert "3 of 4 job(s) placed" in text
    assert "  huge: no node can take 4 × whole cards: 3 nodes: fewer than 4 usable cards" in text


def test_explain_adds_the_shape_the_runner_up_and_the_band() -> None:
    text = render_placement(plan(state(), JOBS, Settings()), explain=True)
    assert "infer -> gpu-" in text
    assert "  shape: 1 × 24.0 GiB slice" in text
    assert "runner-up gpu-" in text
    assert "band: standard-tier work is admitted while allocated/total GPU memory stays at or " in (
        text
    )
    assert "3 nodes [gpu_count] fewer than 4 usable cards: gpu-a, gpu-b, gpu-c" in text


def test_wide_text_adds_card_uuids() -> None:
    text = render_placement(plan(state(), JOBS, OPEN), explain=False, wide=True)
    assert "GPU-gpu-a-0,GPU-gpu-a-1" in text


def test_a_diff_lists_moved_and_newly_unplaced_jobs() -> None:
    before = plan(state(), JOBS, OPEN)
    after = plan(state("v2", cordon_b=True), JOBS, OPEN)
    diff = diff_plans(before, after)
    kinds = {c.job: c.kind for c in diff.changes}
    assert diff.version_before == "v1"
    assert diff.version_after == "v2"
    assert "train" not in kinds  # still on gpu-a
    assert set(kinds.values()) <= {"moved", "now_unplaced", "reason_changed"}
    assert kinds["huge"] == "reason_changed"
    assert render_diff(diff).startswith("fleet version v1 -> v2\n")
    assert diff_plans(before, before).same
    assert render_diff(diff_plans(before, before)) == "no changes\n"


def test_applying_a_plan_adds_its_allocations_and_moves_the_version_on() -> None:
    s = state()
    p = plan(s, JOBS, OPEN)
    after = apply_plan(s, p)
    assert {a.job for a in after.allocations} == {"train", "infer", "sweep"}
    assert after.version == p.version_after != s.version
    train = next(o for o in p.placed if o.job == "train")
    assert isinstance(train, Placed)
    assert [c.allocated_mib for c in after.node("gpu-a").cards] == [80 * GIB, 80 * GIB]


def test_a_stale_plan_is_refused() -> None:
    p = plan(state("v1"), JOBS, OPEN)
    with pytest.raises(PlanError, match="computed from fleet version v1, the fleet is now at v2"):
        apply_plan(state("v2"), p)
    applied = apply_plan(state("v1"), p)
    with pytest.raises(PlanError, match="computed from fleet version"):
        apply_plan(applied, p)


def test_a_plan_that_no_longer_fits_its_state_is_refused() -> None:
    s = state()
    p = plan(s, JOBS, OPEN)
    shrunk = dataclasses.replace(
        s,
        nodes=tuple(
            dataclasses.replace(n, cards=tuple(c._replace(ghost_mib=GIB) for c in n.cards))
            for n in s.nodes
        ),
    )
    with pytest.raises(PlanError, match="cannot take it"):
        apply_plan(shrunk, p)
