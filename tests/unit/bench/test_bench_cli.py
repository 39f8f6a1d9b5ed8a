"""`gpuctl bench placement` on a tiny trace: the JSON shape, the table, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpuctl.cli.main import app

FIXTURES = Path(__file__).parents[2] / "fixtures" / "openb"
ARGS = ["bench", "placement", "--nodes", str(FIXTURES / "nodes.csv")]


def run(*extra: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [*ARGS, *extra])
    return result.exit_code, result.stdout, result.stderr


def test_json_has_one_object_per_policy_with_the_kpis() -> None:
    code, out, err = run(
        "--pods", str(FIXTURES / "pods.csv"), "--policy", "best-fit,fgd,default",
        "--seeds", "1-3", "-o", "json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc) == ["best-fit", "fgd", "default"]
    for entry in doc.values():
        for key in ("alloc_100", "alloc_130"):
            assert set(entry[key]) == {"mean", "std", "ci95", "per_seed"}
            assert len(entry[key]["per_seed"]) == 3
        assert "frag_ratio_100" in entry
        assert entry["seconds_per_run"] >= 0
        assert entry["seeds"] == [1, 2, 3]


def test_the_table_shows_published_numbers_beside_ours(tmp_path: Path) -> None:
    published = tmp_path / "published.csv"
    published.write_text(
        "workload,policy,x,mean,std,seeds\n"
        "pods,FGD,100,90.00,0.10,10\npods,FGD,130,91.00,0.10,10\n"
        "pods,BestFit,100,88.00,0.20,10\npods,BestFit,130,89.00,0.20,10\n"
    )
    code, out, _ = run(
        "--pods", str(FIXTURES / "pods.csv"), "--policy", "best-fit,fgd",
        "--seeds", "5", "--published", str(published), "--no-progress",
    )  # fmt: skip
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("workload pods, tune 1.3, seeds 5 (1 run per policy)")
    assert "PUBLISHED@100" in lines[1] and "VS FGD@130" in lines[1]
    assert "88.00 ± 0.20" in lines[2] and "90.00 ± 0.10" in lines[3]


def test_progress_goes_to_stderr_and_data_to_stdout() -> None:
    code, out, err = run(
        "--pods", str(FIXTURES / "pods.csv"), "--policy", "fgd", "--seeds", "1", "--progress"
    )
    assert code == 0
    assert err.startswith("[1/1] fgd seed 1:")
    assert "[1/1]" not in out


def test_a_bad_csv_exits_2_naming_file_and_column_without_a_traceback() -> None:
    code, out, err = run("--pods", str(FIXTURES / "bad_pods.csv"))
    assert code == 2
    assert out == ""
    assert "bad_pods.csv:3: cpu_milli: expected a non-negative integer" in err
    assert "Traceback" not in err


def test_an_unknown_policy_or_bad_seeds_exit_2() -> None:
    pods = str(FIXTURES / "pods.csv")
    code, _, err = run("--pods", pods, "--policy", "tetris")
    assert code == 2 and "unknown policy 'tetris'" in err
    code, _, err = run("--pods", pods, "--seeds", "51-42")
    assert code == 2 and "--seeds: bad range" in err


def test_parallel_jobs_give_the_same_numbers_as_one_process() -> None:
    pods = str(FIXTURES / "pods.csv")
    one = run("--pods", pods, "--policy", "fgd,gpuctl", "--seeds", "1-2", "-o", "json")
    two = run("--pods", pods, "--policy", "fgd,gpuctl", "--seeds", "1-2", "-o", "json", "-j", "2")
    assert one[0] == two[0] == 0
    docs = [json.loads(r[1]) for r in (one, two)]
    for doc in docs:
        for entry in doc.values():
            entry.pop("seconds_per_run")
    assert docs[0] == docs[1]


def test_a_run_that_never_reaches_x_100_reports_not_available() -> None:
    pods = str(FIXTURES / "pods.csv")
    code, out, err = run(
        "--pods", pods, "--policy", "fgd", "--seeds", "1-2", "--tune", "0.5", "-o", "wide"
    )
    assert code == 0, err
    assert "N/A" in out.splitlines()[2]
    assert "fgd per seed (@100/@130): 1: N/A/N/A, 2: N/A/N/A" in out
    code, out, _ = run(
        "--pods", pods, "--policy", "fgd", "--seeds", "1", "--tune", "0.5", "-o", "json"
    )
    assert json.loads(out)["fgd"]["alloc_130"] == {
        "mean": None, "std": None, "ci95": None, "per_seed": [None]
    }  # fmt: skip


def test_bound_shows_each_policys_gap_to_the_upper_bound() -> None:
    pods = str(FIXTURES / "pods.csv")
    code, out, err = run("--pods", pods, "--policy", "fgd", "--seeds", "1-3", "--bound")
    assert code == 0, err
    lines = out.splitlines()
    assert "GAP@100" in lines[1] and "GAP@130" in lines[1]
    assert lines[-1].startswith("upper bound (no placement of the arrivals allocates more")
    code, out, err = run(
        "--pods", pods, "--policy", "fgd", "--seeds", "1-3", "--bound", "-o", "json"
    )
    entry = json.loads(out)["fgd"]
    assert set(entry["bound"]) == {"alloc_100", "alloc_130", "alloc_end", "seconds_per_run"}
    bounds = entry["bound"]["alloc_end"]["per_seed"]
    gaps = [b - a for b, a in zip(bounds, entry["alloc_end"]["per_seed"], strict=True)]
    assert entry["gap_to_bound"]["alloc_end"] == round(sum(gaps) / 3, 3)
    assert min(gaps) >= 0


def test_trace_order_reports_the_allocation_after_the_last_pod_with_a_95pct_interval() -> None:
    pods = str(FIXTURES / "pods.csv")
    code, out, err = run("--pods", pods, "--policy", "fgd", "--seeds", "1-2", "--order", "trace")
    assert code == 0, err
    assert out.splitlines()[0].startswith("workload pods, trace order, seeds 1-2")
    assert out.splitlines()[1].split()[:2] == ["POLICY", "ALLOC@END"]
    code, out, _ = run("--pods", pods, "--seeds", "1-2", "--order", "trace", "-o", "json")
    doc = json.loads(out)
    assert all(e["order"] == "trace" and e["alloc_end"]["ci95"] >= 0 for e in doc.values())
    code, _, err = run("--pods", pods, "--order", "shuffled")
    assert code == 2 and "--order must be one of paper, trace" in err
