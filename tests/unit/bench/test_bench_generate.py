"""Workloads along the paper's four knobs: each reaches its share, keeps what the paper keeps, and
the same seed gives the same trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuctl.bench import generate as gen
from gpuctl.bench.openb import OpenbNode, OpenbPod, load_pods
from gpuctl.errors import UsageError

NODES = [OpenbNode(f"n{i}", 96_000, 393_216, 8, "G2") for i in range(10)]


def base() -> list[OpenbPod]:
    pods = []
    for i in range(400):
        kind = i % 10
        if kind < 2:
            pods.append(OpenbPod(f"p{i}", 8000, 16_384, 0, 0))
        elif kind < 5:
            pods.append(OpenbPod(f"p{i}", 6000, 12_288, 1, 460 if kind < 4 else 250))
        elif kind < 9:
            pods.append(OpenbPod(f"p{i}", 12_000, 24_576, 1, 1000))
        else:
            pods.append(OpenbPod(f"p{i}", 48_000, 65_536, 8 if i % 20 == 9 else 2, 1000))
    return pods


def share(pods: tuple[OpenbPod, ...], test: object) -> float:
    gpu = sum(p.gpu_request_milli for p in pods)
    return sum(p.gpu_request_milli for p in pods if test(p)) / gpu  # type: ignore[operator]


@pytest.mark.parametrize("pct", [40, 60, 10])
def test_gpushare_sets_the_sharing_pods_share_of_gpu_and_keeps_the_pod_count(pct: int) -> None:
    made = gen.generate(base(), "gpushare", pct, 1)
    assert len(made) == 400
    assert share(made, lambda p: p.num_gpu == 1 and p.gpu_milli < 1000) == pytest.approx(
        pct / 100, abs=0.02
    )


def test_multigpu_adds_multi_gpu_pods_until_their_share_and_keeps_every_other_pod() -> None:
    pods = base()
    made = gen.generate(pods, "multigpu", 50, 1)
    assert share(made, lambda p: p.num_gpu > 1) == pytest.approx(0.5, abs=0.02)
    singles = [(p.cpu_milli, p.num_gpu, p.gpu_milli) for p in made if p.num_gpu < 2]
    assert singles == [(p.cpu_milli, p.num_gpu, p.gpu_milli) for p in pods if p.num_gpu < 2]


def test_gpuspec_pins_that_share_of_gpu_pods_to_specs_from_the_source() -> None:
    source = [
        OpenbPod("s0", 1000, 1024, 1, 1000, "T4"),
        OpenbPod("s1", 1000, 1024, 1, 500, "P100|T4"),
    ]
    made = gen.generate(base(), "gpuspec", 25, 1, specs=source)
    gpu = [p for p in made if p.num_gpu]
    pinned = [p for p in gpu if p.gpu_spec]
    assert len(pinned) == round(0.25 * len(gpu))
    assert {p.gpu_spec for p in pinned} == {"T4", "P100|T4"}
    assert [(p.cpu_milli, p.gpu_milli) for p in made] == [
        (p.cpu_milli, p.gpu_milli) for p in base()
    ]


def test_cpu_sets_the_cpu_only_pods_cpu_and_keeps_the_gpu_pods() -> None:
    for nnn in (50, 250):
        made = gen.generate(base(), "cpu", nnn, 1, nodes=NODES)
        asked = sum(p.cpu_milli for p in made if p.num_gpu == 0)
        target = nnn / 50 * gen.CPU050_SHARE * 960_000
        assert target - 8000 < asked <= target
        assert [p for p in made if p.num_gpu] != []
        assert len([p for p in made if p.num_gpu]) == len([p for p in base() if p.num_gpu])


def test_the_same_seed_gives_the_same_trace_and_names_follow_the_order(tmp_path: Path) -> None:
    one = gen.generate(base(), "multigpu", 70, 7)
    assert one == gen.generate(base(), "multigpu", 70, 7)
    assert one != gen.generate(base(), "multigpu", 70, 8)
    assert [p.name for p in one[:3]] == ["openb-pod-0000", "openb-pod-0001", "openb-pod-0002"]
    path = tmp_path / "openb_pod_list_multigpu70.csv"
    gen.write_pods(path, one)
    assert load_pods(path) == one


def test_a_workload_name_is_read_or_refused() -> None:
    assert gen.parse_family("cpu050") == ("cpu", 50.0)
    assert gen.parse_family("gpuspec33") == ("gpuspec", 33.0)
    with pytest.raises(UsageError, match="cannot read workload 'tetris9'"):
        gen.parse_family("tetris9")
    with pytest.raises(UsageError, match="no pod with a gpu_spec"):
        gen.generate(base(), "gpuspec", 10, 1, specs=base())
