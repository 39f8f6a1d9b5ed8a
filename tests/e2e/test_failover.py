"""Failover on a lab fleet: a training job on a node, the node killed, the control loop restarts
it elsewhere from its newest committed checkpoint (same job id, incarnation 2), and fences the
stale copy when the node comes back."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gpuctl.adapters.clock import SystemClock
from gpuctl.adapters.node import SshJobRunner
from gpuctl.adapters.protocols import Store
from gpuctl.adapters.ssh import SshTransport
from gpuctl.adapters.store import open_store
from gpuctl.config.jobspec_files import load_specs
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.core.model import Inventory
from gpuctl.ops import jobs as service
from gpuctl.ops.gather import Gatherer
from gpuctl.ops.invariants import check_invariants
from gpuctl.ops.loop import Reconciler, ReconcileSettings
from gpuctl.testing import waiting
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import shared_dir

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
T = TypeVar("T")


wait_for = functools.partial(waiting.wait_for, timeout_s=30.0, every_s=0.3)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(tmp_path / "state", write=True)
    yield s
    s.close()


def test_a_killed_node_s_job_runs_again_elsewhere_from_its_checkpoint_and_is_fenced_later(
    own_lab: LabFleet, store: Store, tmp_path: Path
) -> None:
    ckpt = shared_dir(own_lab)
    spec = tmp_path / "train.yaml"
    spec.write_text(
        "name: train\n"
        f"command: [{PYTHON}, train.py, --steps, '100000', --checkpoint-every, '5',"
        " --step-seconds, '0.05']\n"
        f"workdir: {REPO / 'examples'}\n"
        "resources: {gpus: 1, mem_per_gpu: 8GiB}\n"
        f"checkpoint: {{dir: '{ckpt}/{{job_id}}', sync: shared}}\n"
        "env: {PYTHONDONTWRITEBYTECODE: '1'}\n"
        "grace_s: 5\n"
    )
    (job,) = service.submit(store, load_specs([spec]), actor="test", clock=SystemClock())
    inventory = Inventory(nodes=own_lab.specs(connect_timeout_s=1.0, command_timeout_s=15.0))
    with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as transport:
        runner = SshJobRunner(transport)
        loop = Reconciler(
            store,
            Gatherer(transport),
            runner,
            inventory,
            SystemClock(),
            ReconcileSettings(grace_s=2.0, checkpoint_scan_s=0.0),
            state_dir=str(tmp_path / "state"),
        )
        specs = inventory.by_name()
        try:
            loop.run_once()
            first = store.incarnations(job.id)[0]
            assert first.state is IncarnationState.RUNNING, store.events(job_id=job.id)

            def checkpointed() -> bool:
                loop.run_once()
                return bool(store.checkpoints(job.id))

            assert wait_for(checkpointed), "no committed checkpoint was recorded"
            own_lab.kill(first.node)

            def restarted() -> bool:
                loop.run_once()
                found = store.job(job.id)
                return (
                    found is not None
                    and found.incarnation == 2
                    and found.state is (JobState.RUNNING)
                )

            assert wait_for(restarted), [e.message for e in store.events(job_id=job.id)]
            second = store.incarnations(job.id)[1]
            assert second.node != first.node and second.state is IncarnationState.RUNNING
            assert second.resume_step is not None and second.resume_step >= 5
            assert store.incarnations(job.id)[0].state is IncarnationState.LOST

            def resumed() -> str:
                log, _ = runner.logs(specs[second.node], job.id, 2)
                text = log.decode("utf-8", "replace")
                return text if re.search(r"^step \d+ ", text, re.M) else ""

            text = wait_for(resumed)
            assert f"resumed from step {second.resume_step} (incarnation 1)" in text
            steps = [int(s) for s in re.findall(r"^step (\d+) ", text, re.M)]
            assert steps[0] == second.resume_step + 1  # no step lost beyond the checkpoint

            own_lab.revive(first.node)

            def fenced() -> bool:
                loop.run_once()
                return not store.incarnations(job.id)[0].state.holds_cards

            assert wait_for(fenced)
            assert [i.n for i in store.incarnations(job.id, holding=True)] == [2]
            assert "fence" in [e.kind for e in store.events(job_id=job.id)]
            assert check_invariants(store) == []
        finally:
            for inc in store.incarnations(job.id):
                try:
                    runner.signal(specs[inc.node], job.id, inc.n, "KILL")
                except Exception:  # a dead node has nothing left to stop
                    continue
