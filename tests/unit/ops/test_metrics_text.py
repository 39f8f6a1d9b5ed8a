"""The per-node, per-GPU and per-job families written fast are the same text as before, sample by
sample: a seeded fixture fleet (values missing here and there, floats, flags, XIDs, jobs on cards,
label values with quotes, backslashes, `%`, control characters and non-ASCII text) against the
exposition the straightforward writer made of it, kept in tests/fixtures/metrics/series.prom.

When a change adds or changes series on purpose, write the file again and review its diff:

    python tests/unit/ops/test_metrics_text.py
"""

import random
from pathlib import Path

from gpuctl.core.health import Verdict
from gpuctl.core.model import GpuSnapshot
from gpuctl.ops.metrics import GpuReading, JobReading, NodeReading, Reading, exposition
from gpuctl.ops.metrics._write import labelled
from gpuctl.testing.promtool import check_metrics

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "metrics" / "series.prom"
NOW = 2_000_000_000.0
CAP = 81559
NODES = ("gpu01", "gpu02", "gpu-%d", 'odd"name\\', "n\x07bell", "nœud-é")
JOB_NAMES = ("train", "eval 50%", 'q"uote', "back\\slash", "模型-7b", "ctl\x1bchar", "x" * 140)


def maybe(rng: random.Random, value: object, p: float = 0.15) -> object:
    return None if rng.random() < p else value


def fixture_reading(seed: int = 16) -> Reading:
    rng = random.Random(seed)
    nodes, gpus, jobs = [], [], []
    states = ("ready", "cordoned", "draining", "down", "unknown")
    for n, name in enumerate(NODES):
        nodes.append(
            NodeReading(
                name,
                maybe(rng, rng.random() < 0.8),  # type: ignore[arg-type]
                maybe(rng, rng.random() < 0.7),  # type: ignore[arg-type]
                maybe(rng, rng.choice(list(Verdict))),  # type: ignore[arg-type]
                maybe(rng, rng.choice(states)),  # type: ignore[arg-type]
            )
        )
        for i in range(4):
            card = GpuSnapshot(
                index=i,
                **{
                    k: maybe(rng, v)
                    for k, v in {
                        "uuid": f"GPU-{n:04x}-{i:04x}",
                        "model": rng.choice(("NVIDIA H100 80GB HBM3", 'A100 "SXM"', "L40S")),
                        "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
                        "mem_total_mib": CAP,
                        "mem_used_mib": rng.randrange(0, CAP),
                        "util_pct": rng.randrange(0, 101),
                        "temp_c": rng.randrange(30, 90),
                        "power_w": rng.choice((round(rng.uniform(60, 700), 2), 700.0, 1e-05)),
                        "power_limit_w": rng.choice((700.0, 350.5, 1e22)),
                        "ecc_volatile_corrected": rng.choice((0, 3, 10**12)),
                        "ecc_volatile_uncorrected": rng.choice((0, 1)),
                        "ecc_aggregate_corrected": rng.choice((0, 117)),
                        "ecc_aggregate_uncorrected": rng.choice((0, 2)),
                        "retired_pages_sbe": rng.choice((0, 4)),
                        "retired_pages_dbe": rng.choice((0, 1)),
                        "retired_pages_pending": rng.random() < 0.3,
                        "remapped_rows_correctable": rng.choice((0, 1)),
                        "remapped_rows_uncorrectable": rng.choice((0, 5)),
                        "remapped_rows_pending": rng.random() < 0.3,
                        "remapped_rows_failure": rng.random() < 0.2,
                        "thermal_slowdown_hw": rng.random() < 0.2,
                        "thermal_slowdown_sw": rng.random() < 0.2,
                    }.items()
                },  # type: ignore[arg-type]
            )
            held = tuple(
                (f"{name}-j{k}", rng.choice(JOB_NAMES)) for k in range(rng.choice((0, 0, 1, 2)))
            )
            gpus.append(
                GpuReading(
                    node=name,
                    index=i,
                    uuid=card.uuid,
                    model=card.model,
                    total_mib=card.mem_total_mib,
                    observed_mib=card.mem_used_mib,
                    allocated_mib=maybe(rng, rng.choice((0, 16384, CAP))),  # type: ignore[arg-type]
                    ghost_mib=maybe(rng, rng.choice((0, 512))),  # type: ignore[arg-type]
                    util_pct=card.util_pct,
                    temp_c=card.temp_c,
                    verdict=maybe(rng, rng.choice(list(Verdict))),  # type: ignore[arg-type]
                    hostname=maybe(rng, f"{name}.cluster.local"),  # type: ignore[arg-type]
                    pci_bus_id=card.pci_bus_id,
                    card=maybe(rng, card),  # type: ignore[arg-type]
                    last_xid=maybe(rng, rng.choice((0, 0, 13, 79))),  # type: ignore[arg-type]
                    xids=tuple(
                        (code, rng.randrange(1, 9)) for code in (13, 31) if rng.random() < 0.2
                    ),
                    jobs=held,
                )
            )
        for k in range(3):
            state = rng.choice(("queued", "running", "held"))
            placed = state == "running"
            jobs.append(
                JobReading(
                    id=f"{name}-j{k}",
                    name=rng.choice(JOB_NAMES),
                    state=state,
                    tier=rng.choice(("standard", "spot")),
                    incarnation=rng.randrange(0, 4),
                    restarts=rng.randrange(0, 3),
                    node=name if placed else None,
                    cards=rng.choice((1, 2)) if placed else None,
                    allocated_mib=rng.choice((16384, 2 * CAP)) if placed else None,
                    observed_mib=maybe(rng, rng.randrange(0, CAP), 0.4) if placed else None,  # type: ignore[arg-type]
                    checkpoint_age_s=maybe(rng, rng.choice((0.0, 12.5, 3600.25)), 0.3)  # type: ignore[arg-type]
                    if placed
                    else None,
                )
            )
    return Reading(
        taken_at=NOW,
        duration_s=1.25,
        source="gather",
        numbers=None,
        nodes=tuple(nodes),
        gpus=tuple(gpus),
        counters={"failover": 2, "preempt": 1},
        queue_waits=(3.0, 70.5, 4000.0),
        jobs=tuple(jobs),
    )


def samples(text: str) -> dict[str, str]:
    """`name{labels}` -> the value as written, and each HELP/TYPE line as itself."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            out[line] = ""
        else:
            key, _, value = line.rpartition(" ")
            assert key not in out, f"sample written twice: {key}"
            out[key] = value
    return out


def test_the_exposition_is_the_same_text_as_before_sample_by_sample() -> None:
    got = exposition(fixture_reading()).decode()
    want = GOLDEN.read_text(encoding="utf-8")
    got_samples, want_samples = samples(got), samples(want)
    missing = [k for k in want_samples if k not in got_samples]
    extra = [k for k in got_samples if k not in want_samples]
    changed = [
        f"{k}: {want_samples[k]} -> {got_samples[k]}"
        for k in want_samples
        if k in got_samples and got_samples[k] != want_samples[k]
    ]
    assert (missing[:5], extra[:5], changed[:5]) == ([], [], [])
    assert len(got_samples) == len(want_samples) > 500
    assert got == want  # and in the same order
    check_metrics(got.encode())


def test_a_second_exposition_of_another_reading_is_its_own_text() -> None:
    """Whatever the writer keeps between expositions never leaks one reading into the next."""
    first, second = fixture_reading(16), fixture_reading(17)
    assert exposition(first) == exposition(first)
    other = exposition(second)
    assert other != exposition(first)
    assert exposition(second) == other
    check_metrics(other)


def test_a_value_equal_to_the_last_one_but_written_otherwise_is_written_as_itself() -> None:
    """A run's text is kept while its values stay the same, but 1 == 1.0 and -0.0 == 0.0."""
    out: list[bytes] = []
    for value in (1, 1, 1.0, 1.0, 1, -0.0, 0.0, 0, 0):
        labelled("gpuctl_test", ['node="n1"'], [value], out)
    assert [line.rsplit(b" ", 1)[1] for line in out] == [
        b"1\n",
        b"1\n",
        b"1.0\n",
        b"1.0\n",
        b"1\n",
        b"-0.0\n",
        b"0.0\n",
        b"0\n",
        b"0\n",
    ]


if __name__ == "__main__":
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_bytes(exposition(fixture_reading()))
