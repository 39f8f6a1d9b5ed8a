"""Job spec keys for consolidation: `disruptible` and `min_runtime_between_moves`."""

from pathlib import Path

import pytest

from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.errors import JobSpecError


def _spec(tmp_path: Path, extra: str) -> JobSpec:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\nresources: {{gpus: 1}}\n{extra}")
    (loaded,) = load_specs([path])
    return loaded.spec


def test_jobs_are_disruptible_and_wait_30_minutes_between_moves_by_default(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "")
    assert (spec.policy.disruptible, spec.policy.min_runtime_between_moves_s) == (True, 1800.0)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("45s", 45.0),
        ("30m", 1800.0),
        ("10min", 600.0),
        ("1.5h", 5400.0),
        ("1d", 86400.0),
        ("0", 0.0),
    ],
)
def test_the_minimum_runtime_reads_seconds_or_a_unit(
    tmp_path: Path, text: str, seconds: float
) -> None:
    spec = _spec(tmp_path, f"disruptible: false\nmin_runtime_between_moves: {text}\n")
    assert (spec.policy.disruptible, spec.policy.min_runtime_between_moves_s) == (False, seconds)


def test_the_keys_survive_the_stores_round_trip(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "disruptible: false\nmin_runtime_between_moves: 2h\n")
    again = JobSpec.from_dict(spec.to_dict())
    assert (again.policy.disruptible, again.policy.min_runtime_between_moves_s) == (False, 7200.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "soon",
            "must be a duration: seconds (1800) or a number with s, m, h or d (30m) (got 'soon')",
        ),
        ("8d", "must be from 0 to 7 days (got '8d')"),
        ("-5", "must be from 0 to 7 days (got -5)"),
        ("true", "must be a duration: seconds (1800) or a number with s, m, h or d (30m)"),
    ],
)
def test_a_bad_minimum_runtime_names_the_file_line_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(JobSpecError) as err:
        _spec(tmp_path, f"min_runtime_between_moves: {text}\n")
    assert str(err.value) == f"{tmp_path / 'job.yaml'}:3: min_runtime_between_moves: {message}"
