"""The launch command line and its size limits: the job spec's limit (`MAX_LAUNCH_BYTES`, checked
when a spec is read) leaves room below what a node's shell takes (`MAX_COMMAND_LINE_BYTES`, the
launch's own guard), whatever the text and the checkpoint contract's values."""

from pathlib import Path

import pytest

from gpuctl.adapters.node._launch import MAX_COMMAND_LINE_BYTES, command_line_bytes, launch_command
from gpuctl.config.jobspec_files import MAX_LAUNCH_BYTES, launch_bytes, load_specs
from gpuctl.core.jobs.model import LaunchRequest
from gpuctl.core.jobs.spec import JobSpec
from gpuctl.core.placement.model import JobRequest
from gpuctl.errors import UsageError

JOB_ID = "j" * 57 + "-0a1b2c"  # 64 characters: the longest id gpuctl gives


def largest_argument(char: str, before: list[str]) -> str:
    """`char` repeated as often as the spec limit allows after the arguments `before`."""
    room = MAX_LAUNCH_BYTES - sum(launch_bytes(a) for a in before)
    lo, hi = 0, room
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if launch_bytes(char * mid) <= room else (lo, mid)
    return char * lo


def worst_request(spec: JobSpec, **changes: object) -> LaunchRequest:
    """The spec's launch with the longest contract values: id, incarnation, 64 cards, MPS, and a
    resume point of a 255-character folder name."""
    ckpt = "~/.gpuctl/checkpoints/" + JOB_ID
    fields: dict[str, object] = {
        "job_id": JOB_ID,
        "incarnation": 999_999,
        "argv": tuple(spec.command or ()),
        "cuda_visible_devices": ",".join(str(i) for i in range(64)),
        "mib_per_card": 10**7,
        "checkpoint_dir": ckpt,
        "resume_from": f"{ckpt}/{'s' * 255}",
        "workdir": spec.workdir,
        "env": {**spec.env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        "mps_limit_mib": 10**6,
        **changes,
    }
    return LaunchRequest(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("char", ["x", "'", "é", " "])
def test_the_largest_spec_allowed_launches_within_the_node_shell_limit_with_room_to_spare(
    tmp_path: Path, char: str
) -> None:
    arg = largest_argument(char, ["python", "train.py"])
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\ncommand: [python, train.py, {arg!r}]\nresources: {{}}\n")
    (loaded,) = load_specs([path], require_command=True)  # at the limit: accepted
    size = command_line_bytes(launch_command(worst_request(loaded.spec)).command)
    assert size <= MAX_COMMAND_LINE_BYTES - 16 * 1024


def test_a_launch_command_too_long_for_the_node_shell_is_refused_before_it_is_sent() -> None:
    spec = JobSpec(JobRequest("j"), command=("python", "x" * 70_000))
    with pytest.raises(UsageError) as err:
        launch_command(worst_request(spec))
    assert str(err.value) == (
        f"job {JOB_ID}: the launch command line is 149,913 bytes, over the 131,071 a node's shell "
        "takes: its command, env, workdir or checkpoint dir is too long"
    )
