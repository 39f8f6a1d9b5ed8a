"""Checkpoint age on a lab fleet: a job committing about every second, a pass about every second
with the default 30 s checkpoint scan, and the age `gpuctl jobs show -o json` reports stays
within a pass and a commit period (it ran up to 30 s behind when the loop read checkpoints only
at its scan)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuctl.ops.jobs import service
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import gpuctl, rig

pytestmark = pytest.mark.e2e

INTERVAL_S = 1.0  # between two passes, as `reconcile --watch --interval 1`
COMMIT_S = 1.0  # the job commits every 20 steps of 0.05 s
MARGIN_S = 3.0  # a pass's own time and a loaded machine


def test_the_checkpoint_age_stays_within_a_pass_and_a_commit_period(
    lab: LabFleet, tmp_path: Path
) -> None:
    with rig(lab, tmp_path, checkpoint_scan_s=30.0) as r:
        job = r.train("train", every=20)
        r.until(lambda: r.store.checkpoints(job.id), "a recorded checkpoint", timeout_s=60.0)
        ages = []
        end = time.monotonic() + 12.0  # past a third of the scan: it read nothing new since
        while time.monotonic() < end:
            time.sleep(INTERVAL_S)
            r.run_pass()
            view = service.list_jobs(r.store)[0]  # what `jobs list/show` and the numbers read
            ages.append(service.job_summary(view, time.time())["checkpoint"]["age_s"])
        assert max(ages) < INTERVAL_S + COMMIT_S + MARGIN_S, ages
        shown = gpuctl(r.state_dir, None, "jobs", "show", job.id, "-o", "json")
        assert shown.returncode == 0, shown.stderr
        age = json.loads(shown.stdout)["checkpoint"]["age_s"]
        # read a moment after the last pass, by another process
        assert age < INTERVAL_S + COMMIT_S + MARGIN_S + 5.0, age
        r.check()
