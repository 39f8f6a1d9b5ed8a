"""The consolidation benchmark on tiny traces: the baseline is the placement replay itself, passes
move what they plan and stay within the move budget, the ceiling, the report, the exact model."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest

from gpuctl.bench import consolidation as bench
from gpuctl.bench import consolidation_exact as exact
from gpuctl.bench import consolidation_report as report
from gpuctl.bench.openb import OpenbNode, OpenbPod, load_nodes, load_pods
from gpuctl.bench.protocol import target_workload
from gpuctl.bench.replay import replay
from gpuctl.bench.rng import NumpyRng
from gpuctl.bench.runner import bench_policy
from gpuctl.core.placement.fit import Demand, Workload
from gpuctl.core.placement.fragmentation import default_workload
from gpuctl.errors import UsageError

FIXTURES = Path(__file__).parents[2] / "fixtures" / "openb"
NODES = load_nodes(FIXTURES / "nodes.csv")
PODS = load_pods(FIXTURES / "pods.csv")


def pod(name: str, gpus: int, milli: int, cpu: int = 1000) -> OpenbPod:
    return OpenbPod(name, cpu, 1024, gpus, milli if gpus else 0)


@pytest.mark.parametrize("name", ["best-fit", "fgd", "gpuctl"])
def test_without_consolidation_the_replay_is_the_placement_benchmarks_own(name: str) -> None:
    policy, spec = bench_policy(name)
    for seed in range(7, 27):  # on some seeds only does the policy see the nodes' kinds matter
        theirs = replay(NODES, PODS, policy, NumpyRng(seed), seed=seed, workload=spec)
        ours = bench.run_one(NODES, PODS, name, seed, 0, 0.0)
        assert (ours.curve, ours.placed, ours.pods) == (theirs.curve, theirs.placed, theirs.pods)
        assert any(v is not None for v in ours.curve)
        assert (ours.moves, ours.passes) == (0, 0)


def test_a_pass_moves_a_slice_so_a_whole_card_pod_fits() -> None:
    nodes = [OpenbNode("a", 8000, 8192, 1, "T4"), OpenbNode("b", 8000, 8192, 1, "T4")]
    cluster = bench.Cluster(nodes)
    cluster.place(0, pod("s1", 1, 300), (0,))
    cluster.place(1, pod("s2", 1, 300), (0,))
    whole = Demand(gpus=1, mib_per_card=1000, whole=True, cpu_milli=1000, mem_mib=1024)
    assert cluster.feasible(whole).size == 0
    workload = ((whole, 0.5), (Demand(gpus=1, mib_per_card=300), 0.5))
    moved = bench.consolidate(cluster, workload, 5, {"a": 0, "b": 1})
    assert moved == 1
    assert sorted(cluster.free) == [[400], [1000]]
    assert cluster.feasible(whole).size == 1
    assert bench.consolidate(cluster, workload, 0, {"a": 0, "b": 1}) == 0


def test_making_room_moves_a_slice_and_places_the_pod_that_found_no_room() -> None:
    nodes = [OpenbNode("a", 8000, 8192, 1, "T4"), OpenbNode("b", 8000, 8192, 1, "T4")]
    cluster = bench.Cluster(nodes)
    cluster.place(0, pod("s1", 1, 300), (0,))
    cluster.place(1, pod("s2", 1, 600), (0,))
    big = pod("big", 1, 800)
    workload = ((Demand(gpus=1, mib_per_card=300), 1.0),)
    assert bench.make_room(cluster, big, workload, 0, {"a": 0, "b": 1}) is None
    assert bench.make_room(cluster, big, workload, 1, {"a": 0, "b": 1}) == 1
    assert sorted(cluster.free) == [[100], [200]]
    assert cluster.where["big"][0] == 0 and cluster.where["s1"][0] == 1


@pytest.mark.parametrize("pct", [0.0, 10.0, 50.0])
def test_a_run_making_room_places_at_least_as_many_within_its_share(pct: float) -> None:
    base = bench.run_one(NODES, PODS, "fgd", 3, 0, 0.0)
    run = bench.run_one(NODES, PODS, "fgd", 3, 0, pct, room_moves=2)
    assert run.moves <= pct * run.placed / 100
    assert run.placed >= base.placed and run.passes == 0
    if pct == 0.0:
        assert (run.curve, run.room_plans) == (base.curve, 0)


@pytest.mark.parametrize("pct", [0.0, 10.0, 50.0])
def test_a_run_never_moves_more_than_its_share_of_placed_pods(pct: float) -> None:
    run = bench.run_one(NODES, PODS, "fgd", 3, 2, pct)
    assert run.moves <= pct * run.placed / 100
    assert run.passes == run.pods // 2


def test_the_ceiling_counts_holes_beside_large_slices_and_the_small_pods_to_fill_them() -> None:
    placed = [pod("big", 1, 810), pod("whole", 1, 1000), pod("mid", 1, 500)]
    arrivals = [*placed, pod("tiny", 1, 100), pod("small", 1, 250)]
    assert bench.ceiling(placed, arrivals, 3000) == round(100 * (3000 - 190 + 100) / 3000, 2)
    assert bench.ceiling([], arrivals, 3000) == 100.0


def test_the_report_has_each_policy_with_and_without_consolidation() -> None:
    rows = report.run_matrix(NODES, PODS, ["fgd"], [1, 2], every=3, max_moves_pct=20.0)
    assert [(r.policy, r.every) for r in rows] == [("fgd", 0), ("fgd", 3)]
    doc = report.report_document(rows, "tiny", 1.3)
    assert json.loads(json.dumps(doc))["rows"][1]["consolidate_every"] == 3
    assert doc["rows"][0]["alloc_130"]["per_seed"] == [r.alloc_130 for r in rows[0].runs]  # type: ignore[index]
    table = report.render_table(rows, "tiny").splitlines()
    assert table[0] == "workload tiny, seeds 1-2"
    assert table[4].startswith("| fgd | none | N/A | 100.00 ± 0.00 | 0 (0.00%) |")
    assert table[5].startswith("| fgd | every 3, ≤ 20% moved | N/A | ")
    with pytest.raises(UsageError, match="--consolidate-every"):
        report.run_matrix(NODES, PODS, ["fgd"], [1], every=0, max_moves_pct=5.0)


def test_the_exact_model_is_never_worse_than_greedy_or_says_ortools_is_missing() -> None:
    policy, spec = bench_policy("fgd")
    inst = exact.small_fleet(NODES, PODS, policy, target_workload(PODS, spec), n_nodes=3, seed=1)
    assert len(inst.pods) > 0 and len(inst.state.nodes) == 3
    if not exact.available():
        with pytest.raises(UsageError, match="OR-Tools is not installed"):
            exact.gap(inst, 2)
        return
    row = exact.gap(inst, 2, time_limit_s=10.0)
    assert row.optimum <= row.greedy + 1e-6 and row.greedy <= row.before + 1e-6
    assert row.optimum_moves <= 2 and row.lower_bound <= row.optimum + 1e-6


def test_the_exact_model_counts_dead_holes_as_the_planner_does() -> None:
    # two 400-milli slices on two one-card nodes: putting them on one card frees a card but
    # leaves 200 that only the 100-milli slices fit, 3 % of the card-sharing ones
    nodes = [OpenbNode(f"n{i}", 8000, 65536, 1, "A10") for i in (1, 2)]
    cluster = bench.Cluster(nodes)
    pods = {
        p.name: p for p in (OpenbPod("a", 1000, 1024, 1, 400), OpenbPod("b", 1000, 1024, 1, 400))
    }
    for i, p in enumerate(pods.values()):
        cluster.place(i, p, (0,))
    workload = ((Demand(1, 100), 0.01), *default_workload(1000))
    inst = exact.Instance("two halves", cluster.fleet_state(), pods, workload)
    if not exact.available():
        with pytest.raises(UsageError, match="OR-Tools is not installed"):
            exact.gap(inst, 1)
        return
    row = exact.gap(inst, 1, time_limit_s=10.0)
    assert (row.greedy_moves, row.optimum_moves) == (0, 0)  # the merge costs more than it frees
    assert row.optimum == row.greedy == row.before


def test_the_exact_model_counts_cards_the_host_cannot_feed_as_the_planner_does() -> None:
    # the work is 1-card jobs of 8 cores; "hog" takes a card and 24 of n1's 32 cores, leaving 3
    # cards that 8 cores feed one of (2 unfed); on n2 (40 cores) it would leave 16 for 3 (1)
    nodes = [OpenbNode("n1", 32_000, 65536, 4, "A10"), OpenbNode("n2", 40_000, 65536, 4, "A10")]
    cluster = bench.Cluster(nodes)
    pods = {"hog": OpenbPod("hog", 24_000, 1024, 1, 1000)}
    cluster.place(0, pods["hog"], (0,))
    workload: Workload = ((Demand(1, 1000, whole=True, cpu_milli=8000), 1.0),)
    inst = exact.Instance("hungry", cluster.fleet_state(), pods, workload)
    if not exact.available():
        with pytest.raises(UsageError, match="OR-Tools is not installed"):
            exact.gap(inst, 1)
        return
    best = exact.exact(inst, 1, time_limit_s=10.0)  # no hint: the model finds the move alone
    assert (best.cost, best.moves, best.lower_bound) == (1000, 1, 1000)  # and proves it best
    row = exact.gap(inst, 1, time_limit_s=10.0)
    assert (row.before, row.greedy, row.greedy_moves) == (2000, 1000, 1)


def test_without_ortools_the_benchmark_says_so_and_skips_the_exact_part(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.import_module

    def no_ortools(name: str, *args: Any) -> Any:
        if name.startswith("ortools"):
            raise ImportError(name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_ortools)
    assert not exact.available()
    script = importlib.util.spec_from_file_location(
        "consolidation_run", Path(__file__).parents[3] / "benchmarks" / "consolidation" / "run.py"
    )
    assert script is not None and script.loader is not None
    module = importlib.util.module_from_spec(script)
    script.loader.exec_module(module)
    code = module.main(
        [
            "--nodes", str(FIXTURES / "nodes.csv"), "--pods", str(FIXTURES / "pods.csv"),
            "--skip-replay", "--exact-nodes", "3",
        ]
    )  # fmt: skip
    assert code == 0
    assert capsys.readouterr().out == exact.MISSING + "\n"


def test_bench_placement_consolidate_every_prints_both_rows_per_policy() -> None:
    from typer.testing import CliRunner

    from gpuctl.cli.main import app

    args = ["bench", "placement", "--nodes", str(FIXTURES / "nodes.csv")]
    args += ["--pods", str(FIXTURES / "pods.csv"), "--policy", "fgd,gpuctl", "--seeds", "1,2"]
    result = CliRunner().invoke(app, [*args, "--consolidate-every", "3", "--max-moves-pct", "20"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "workload pods, seeds 1-2"
    assert [line.split(" | ")[:2] for line in lines[4:]] == [
        ["| fgd", "none"],
        ["| fgd", "every 3, ≤ 20% moved"],
        ["| gpuctl", "none"],
        ["| gpuctl", "every 3, ≤ 20% moved"],
    ]
    result = CliRunner().invoke(app, [*args, "--consolidate-every", "3", "-o", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(r["policy"], r["consolidate_every"]) for r in doc["rows"]] == [
        ("fgd", None),
        ("fgd", 3),
        ("gpuctl", None),
        ("gpuctl", 3),
    ]
    assert doc["rows"][1]["max_moves_pct"] == 5.0
    result = CliRunner().invoke(app, [*args, "--consolidate-every", "3", "--max-moves-pct", "101"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --max-moves-pct must be from 0 to 100, got 101.0")


def test_the_report_gives_every_ceiling_and_the_gap_closed_against_each() -> None:
    def run(every: int, alloc: float, *ceilings: float) -> bench.ConsolidationRun:
        return bench.ConsolidationRun(
            "gpuctl", 42, every, 5.0, alloc, alloc, 0, 0, 1, 1, 1.0, 0.0, *ceilings
        )

    rows = [
        # the baseline's own kept ceiling (96.30) binds only runs that place all its pods
        report.Row("gpuctl", 0, 0.0, (run(0, 95.97, 97.09, 96.46, 96.41, 96.30),)),
        # the consolidating run's is the pair's: over the pods both placed
        report.Row("gpuctl", 100, 5.0, (run(100, 96.26, 97.08, 96.45, 96.40, 96.39),)),
    ]
    doc = report.report_document(rows, "default", 1.3)
    entries: Any = doc["rows"]
    assert entries[0]["packing_ceiling_pct"]["per_seed"] == [96.46]
    assert entries[0]["lowest_ceiling_pct"]["per_seed"] == [96.30]
    # against the baseline's ceilings: (96.26 - 95.97) / (97.09 - 95.97), / (96.46 - 95.97),
    # ..., and against the pair's kept ceiling (96.39), the lowest of the pair
    assert entries[1]["gap_closed_pct"] == {
        "ceiling": 25.9,
        "packing_ceiling": 59.2,
        "forced_ceiling": 65.9,
        "kept_ceiling": 69.0,
        "lowest_ceiling": 69.0,
    }
    assert set(entries[0]["gap_closed_pct"].values()) == {None}
    # a consolidating run without its pair's kept ceiling is never measured to the baseline's
    unpaired = [rows[0], report.Row("gpuctl", 100, 5.0, (run(100, 96.26, 97.08, 96.45, 96.40),))]
    assert report.gap_closed(unpaired, unpaired[1], "lowest_ceiling_pct") == pytest.approx(
        100 * (96.26 - 95.97) / (96.41 - 95.97)
    )
    table = report.render_table(rows, "default").splitlines()
    assert "| kept ceiling@130 | gap closed (lowest ceiling) |" in table[2]
    assert table[4].endswith("| 97.09 | 96.46 | 96.41 | 96.30 | - | 1 |")
    assert table[5].endswith("| 97.08 | 96.45 | 96.40 | 96.39 | 69% | 1 |")


def test_the_kept_ceiling_of_a_pair_binds_both_runs_where_one_turned_a_pod_away() -> None:
    # One card; 700, 500 and 450 milli arrive. The run without consolidation placed the 700
    # (its own kept ceiling: 70 %, nothing else fits beside it); the run with consolidation
    # placed the 500 and the 450 instead (95 %). The pair's ceiling forces neither: 95 %.
    nodes = [OpenbNode("a", 32_000, 131_072, 1, "T4")]
    prefix = (pod("a", 1, 700), pod("b", 1, 500), pod("c", 1, 450))

    def run(every: int, placed: set[str]) -> bench.ConsolidationRun:
        return bench.ConsolidationRun(
            "gpuctl", 1, every, 5.0, 0.0, 0.0, 0, 0, len(placed), 3, 1.0, 0.0, 100.0,
            prefix=prefix, placed_names=frozenset(placed),
        )  # fmt: skip

    base, other = run(0, {"a"}), run(3, {"b", "c"})
    assert bench.kept_ceiling(nodes, prefix, base.placed_names) == 70.0
    both = bench.paired(nodes, base, other)
    assert (both.kept_ceiling_pct, both.dropped) == (95.0, 1)
    assert bench.paired(nodes, base, run(3, {"a"})).kept_ceiling_pct == 70.0


def test_the_replay_bounds_its_allocation_with_the_slices_before_its_first_failure() -> None:
    # One card, slices of 600 arriving: the first fits, the next fails, so the first is placed
    # by any run and no other can share its card: the packing ceiling is 60%, where `ceiling`
    # sees no large slice (100%).
    nodes = [OpenbNode("a", 32_000, 131_072, 1, "T4")]
    run = bench.run_one(tuple(nodes), (pod("a", 1, 600),), "fgd", 1, 0, 0.0)
    assert run.placed == 1 and run.pods > 1 and run.ceiling_pct == 100.0
    assert run.packing_ceiling_pct == 60.0
