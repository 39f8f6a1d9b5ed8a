"""The largest job spec gpuctl accepts starts on a real node: sshd and the node's shell take its
launch command line, with the longest contract values, and the job gets its argument whole."""

import os
from pathlib import Path

import pytest

from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.ssh import SshTransport
from gpuctl.config.jobspec_files import load_specs
from gpuctl.testing import waiting
from gpuctl.testing.lab import LabFleet
from tests.unit.adapters.test_launch_size import largest_argument, worst_request

pytestmark = pytest.mark.e2e

PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
JOB = "import sys; a = sys.argv[1]; print('argument', len(a), a == a[0] * len(a), flush=True)"


@pytest.mark.parametrize("char", ["x", "'"])
def test_the_largest_spec_accepted_starts_on_a_lab_node(
    lab: LabFleet, transport: SshTransport, tmp_path: Path, char: str
) -> None:
    arg = largest_argument(char, [PYTHON, "-c", JOB])
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\ncommand: [{PYTHON}, -c, {JOB!r}, {arg!r}]\nresources: {{}}\n")
    (loaded,) = load_specs([path], require_command=True)
    job_id = f"{'j' * 57}-{os.urandom(3).hex()}"
    runner = SshJobRunner(transport)
    node = lab.spec("lab-01")
    started = runner.launch(node, worst_request(loaded.spec, job_id=job_id, incarnation=1))
    assert started.pid is not None
    expected = f"argument {len(arg)} True".encode()
    assert waiting.wait_for(
        lambda: expected in runner.logs(node, job_id, 1)[0], timeout_s=15.0, every_s=0.05
    )
