"""Consolidation as a service: inputs from the store, a stale plan refused, the maintenance window,
and moves carried out by the migration primitive over a scripted fleet."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpuctl.core.consolidation import ConsolidationPlan, FleetFigures, Migration
from gpuctl.core.fleet.workload import workload_key
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.core.jobs.model import Cordon, Event, IncarnationState
from gpuctl.core.placement.fit import Demand
from gpuctl.core.placement.fragmentation import default_workload
from gpuctl.core.placement.model import Tier
from gpuctl.errors import PlanError, UsageError
from gpuctl.ops.moves import consolidate as service
from gpuctl.ops.moves.consolidate import MoveResult, OutsideWindow, Window
from gpuctl.testing.drainkit import Kit
from gpuctl.testing.memstore import MemoryStore

GIB = 1024


def apart(**specs: dict[str, object]) -> Kit:
    """One running job per node, in the order given (n1, n2, ...), with the other nodes cordoned
    while each is placed; the cordons are lifted after."""
    names = list(specs)
    nodes = tuple(f"n{i + 1}" for i in range(max(2, len(names))))
    kit = Kit.make(MemoryStore(), nodes, health=AutoDrainPolicy(enabled=False))
    for i, (name, spec) in enumerate(specs.items()):
        others = [n for n in nodes if n != nodes[i]]
        for n in others:
            kit.store.cordon(Cordon(n, "test", "t", "operator", 0.0), _ev("cordon", n))
        kit.submit(name, **spec)
        kit.step()
        for n in others:
            kit.store.uncordon(n, _ev("uncordon", n))
    return kit


def _ev(kind: str, node: str) -> Event:
    return Event(0.0, "t", kind, kind, node=node)


def _plan(kit: Kit, **kw: object) -> ConsolidationPlan:
    now = kit.clock.now()
    inputs = service.gather_inputs(kit.fleet.gather(kit.loop.inventory), kit.store, now)
    kw.setdefault("max_moves", 5)
    return service.plan(inputs, now=now, **kw)  # type: ignore[arg-type]


def _version(kit: Kit) -> str:
    return service.current_version(kit.fleet.gather(kit.loop.inventory), kit.store)


def test_a_slice_is_moved_onto_the_other_nodes_card_through_the_migration_primitive() -> None:
    kit = apart(a={}, b={})
    kit.clock.advance(3600)
    plan = _plan(kit)
    assert len(plan.moves) == 1 and plan.after.whole_free_nodes == plan.before.whole_free_nodes + 1
    (move,) = plan.moves
    migrator = service.loop_migrator(kit.loop, operator="alice", sleep=kit.clock.advance)
    result = service.apply(plan, current_version=_version(kit), migrator=migrator)
    assert result.complete, result
    inc = kit.inc(move.job)
    assert (inc.n, inc.node, inc.cards, inc.state) == (
        2,
        move.to_node,
        move.to_cards,
        IncarnationState.RUNNING,
    )
    reserve = kit.store.events(job_id=move.job, kinds=["reserve"])[0]
    assert reserve.actor == "alice" and reserve.data["source"] == "consolidate"
    assert _plan(kit).moves == ()  # nothing left to gain


def test_a_stale_plan_is_refused_before_anything_moves() -> None:
    kit = apart(a={}, b={})
    kit.clock.advance(3600)
    plan = _plan(kit)
    kit.submit("c")
    kit.step()
    called: list[Sequence[Migration]] = []

    def migrator(moves: Sequence[Migration]) -> list[MoveResult]:
        called.append(moves)
        return []

    with pytest.raises(PlanError, match=r"^stale plan: recompute") as err:
        service.apply(plan, current_version=_version(kit), migrator=migrator)
    assert err.value.hint == "run `gpuctl consolidate` again"
    assert called == []


def test_facts_come_from_the_spec_the_incarnation_and_the_checkpoints() -> None:
    kit = apart(a={"disruptible": False}, b={"min_runtime_between_moves": "2h"})
    kit.runner.checkpoint(kit.store.jobs()[1].id, 1)
    kit.step()  # the loop records the committed checkpoint
    kit.clock.advance(100)
    plan = _plan(kit)
    assert plan.moves == ()
    reasons = sorted(p.reason for p in plan.pinned)
    assert reasons[0] == "disruptible: false"
    assert reasons[1].startswith("started ") and reasons[1].endswith("2h00m between moves")
    (facts_b,) = [
        f for f in service.facts_for(kit.store, kit.clock.now()) if f.job == kit.store.jobs()[1].id
    ]
    assert facts_b.min_runtime_between_moves_s == 7200.0
    assert facts_b.checkpoint_age_s is not None and 100 <= facts_b.checkpoint_age_s < 200


def test_the_workload_is_the_shapes_of_recent_jobs_else_the_default() -> None:
    kit = apart(a={"resources": {"gpus": 1, "mem_per_gpu": "20GiB"}})
    state = service.fleet_state(kit.fleet.gather(kit.loop.inventory), kit.store)
    default = dict(default_workload(80 * GIB))
    assert dict(service.workload_for(state, [], kit.clock.now())) == default
    seen = dict(service.workload_for(state, kit.store.jobs(), kit.clock.now()))
    quarter = Demand(1, 20 * GIB)  # also one of the default shapes (a quarter card, 15 %)
    assert seen == {**{d: p / 2 for d, p in default.items()}, quarter: 0.5 + 0.15 / 2}


def _move(job: str, src: str, dst: str) -> Migration:
    return Migration(job, Tier.STANDARD, src, (0,), dst, (1,), 100, False, 10.0, 1.0)


FIG = FleetFigures(0, 0, 0, 0.0, 0)


def _fake_plan(*moves: Migration) -> ConsolidationPlan:
    return ConsolidationPlan("v1", "v2", "s", 5, moves, FIG, FIG, (), "test")


def test_a_move_that_does_not_land_stops_the_run_and_the_rest_are_skipped() -> None:
    plan = _fake_plan(_move("a", "n1", "n2"), _move("b", "n3", "n2"), _move("c", "n4", "n5"))

    def migrator(moves: Sequence[Migration]) -> list[MoveResult]:
        return [
            MoveResult(m.job, "failed", "rolled_back: no checkpoint came")
            if m.job == "b"
            else MoveResult(m.job, "moved", "ok", m.to_node, m.to_cards)
            for m in moves
        ]

    result = service.apply(plan, current_version="v1", migrator=migrator)
    assert [(r.job, r.outcome) for r in result.results] == [
        ("a", "moved"),
        ("b", "failed"),
        ("c", "skipped"),
    ]
    assert not result.complete
    assert result.to_dict()["moved"] == 1


def test_a_move_placed_elsewhere_than_planned_is_reported_so() -> None:
    plan = _fake_plan(_move("a", "n1", "n2"))
    result = service.apply(
        plan,
        current_version="v1",
        migrator=lambda moves: [MoveResult("a", "moved", "ok", "n9", (0,))],
    )
    assert result.results[0].outcome == "elsewhere" and "planned: n2" in result.results[0].message


def test_parallel_moves_never_share_a_wave_with_a_move_leaving_their_target_node() -> None:
    moves = [_move("a", "n1", "n2"), _move("b", "n3", "n4"), _move("c", "n5", "n1")]
    waves = service.waves(moves, 3)
    assert [[m.job for m in w] for w in waves] == [["a", "b"], ["c"]]
    assert [[m.job for m in w] for w in service.waves(moves, 1)] == [["a"], ["b"], ["c"]]


@pytest.mark.parametrize(
    ("window", "minute", "inside"),
    [
        ("22:00-04:00", 23 * 60 + 30, True),
        ("22:00-04:00", 3 * 60 + 59, True),
        ("22:00-04:00", 4 * 60, False),
        ("22:00-04:00", 12 * 60, False),
        ("01:30-05:00", 90, True),
        ("01:30-05:00", 89, False),
    ],
)
def test_the_window_is_local_time_start_included_end_excluded_and_may_wrap(
    window: str, minute: int, inside: bool
) -> None:
    assert Window.parse(window).contains(minute) is inside


def test_outside_the_window_nothing_is_applied() -> None:
    plan = _fake_plan(_move("a", "n1", "n2"))
    with pytest.raises(OutsideWindow) as err:
        service.apply(
            plan,
            current_version="v1",
            migrator=lambda moves: pytest.fail("nothing may move"),
            window=Window.parse("22:00-04:00"),
            minute_of_day=12 * 60 + 5,
        )
    assert str(err.value) == (
        "outside the maintenance window 22:00-04:00 (local time now 12:05): nothing applied"
    )


@pytest.mark.parametrize("text", ["25:00-01:00", "22:00", "22:00-22:00", "9:00-10:00"])
def test_a_bad_window_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="--window"):
        Window.parse(text)


def test_fragmentation_asked_again_is_the_same_as_worked_out_anew() -> None:
    """The fleet numbers keep the last workload and its index between polls; whatever changes
    (a new job of another shape, a job ageing out of the recent week), the figures are the ones
    worked out from scratch."""
    from gpuctl.ops import fleetstatus

    kit = apart(a={"resources": {"gpus": 1, "mem_per_gpu": "20GiB"}})

    def both(now: float) -> tuple[dict[str, object], dict[str, object]]:
        state = service.fleet_state(kit.fleet.gather(kit.loop.inventory), kit.store)
        kept = fleetstatus.fragmentation(state, kit.store, now)
        fleetstatus._WORKLOADS.clear()
        fleetstatus._INDEXES.clear()
        return kept, fleetstatus.fragmentation(state, kit.store, now)

    now = kit.clock.now()
    kept, fresh = both(now)
    assert kept == fresh
    kit.submit("b", resources={"gpus": 1, "mem_per_gpu": "60GiB"})  # another shape, queued
    kept, fresh = both(now)
    assert kept == fresh
    kept, fresh = both(now + 8 * 24 * 3600)  # a week on: the running job is no longer recent
    assert kept == fresh
    state = service.fleet_state(kit.fleet.gather(kit.loop.inventory), kit.store)
    assert workload_key(state, kit.store.jobs(), now) != workload_key(
        state, kit.store.jobs(), now + 8 * 24 * 3600
    )
