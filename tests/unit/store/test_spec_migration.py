"""Schema v4: job specs stored typed. A v3 store (specs kept with the spec file's keys) reads as
before while it is opened read-only, and is migrated on write after a backup: every spec rewritten
to `JobSpec.to_dict`, read back to the same values. A spec that cannot be read stops the
migration and leaves the store as it was."""

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.opening import open_connection
from gpuctl.adapters.store.schema import MIGRATIONS
from gpuctl.adapters.store.sqlite import SqliteStore
from gpuctl.config.jobspec import JobSpecModel, to_spec
from gpuctl.core.jobs.spec import (
    CheckpointPolicy,
    CheckpointSync,
    JobPolicy,
    JobSpec,
    SecretRef,
    SliceEnforcement,
)
from gpuctl.core.placement.model import JobRequest, JobShape, LabelRequirement, Tier
from gpuctl.core.units import MemPerCard
from gpuctl.errors import ExitCode, StateError

V3 = 3
# as gpuctl before schema v4 stored them (the spec file model's JSON dump), every key set
FULL_V3 = {
    "name": "train",
    "command": ["python", "train.py"],
    "resources": {
        "gpus": 1,
        "mem_per_gpu": "24GiB",
        "gpu_models": ["H100"],
        "cpu": "500m",
        "host_mem": "64GiB",
    },
    "tier": "spot",
    "priority": 5,
    "group": "llama",
    "labels": {"team": "nlp"},
    "affinity": {
        "nodes": {"zone": ["eu-1", "eu-2"]},
        "avoid_nodes": {"maintenance": "*"},
        "avoid_jobs": ["eval"],
        "avoid_groups": ["serving"],
    },
    "workdir": "/shared/w",
    "env": {"EPOCHS": "3"},
    "secret_env": ["API_KEY", "HF_TOKEN"],
    "secret_files": {"HF_TOKEN": "/home/al/.hf_token"},
    "checkpoint": {"dir": "/shared/ckpt/{job_id}", "sync": "shared"},
    "restart_budget": 5,
    "grace_s": 45.0,
    "slice_enforcement": "stop",
    "disruptible": False,
    "min_runtime_between_moves": 7200.0,
}
FULL = JobSpec(
    request=JobRequest(
        "train",
        JobShape(1, MemPerCard.of_mib(24576), ("H100",), cpu_milli=500, host_mem_mib=65536),
        tier=Tier.SPOT,
        priority=5,
        labels={"team": "nlp"},
        node_affinity=(LabelRequirement("zone", ("eu-1", "eu-2")),),
        node_anti_affinity=(LabelRequirement("maintenance"),),
        group="llama",
        avoid_jobs=("eval",),
        avoid_groups=("serving",),
    ),
    policy=JobPolicy(
        grace_s=45.0,
        restart_budget=5,
        checkpoint=CheckpointPolicy("/shared/ckpt/{job_id}", CheckpointSync.SHARED),
        slice_enforcement=SliceEnforcement.STOP,
        disruptible=False,
        min_runtime_between_moves_s=7200.0,
    ),
    command=("python", "train.py"),
    workdir="/shared/w",
    env={"EPOCHS": "3"},
    secrets=(SecretRef("API_KEY"), SecretRef("HF_TOKEN", "/home/al/.hf_token")),
)
# as an early gpuctl stored it: before secret files, disruptible and the time between moves
EARLY_V3 = {
    "name": "old",
    "command": ["sleep", "1"],
    "resources": {"gpus": 1, "mem_per_gpu": 0.5, "gpu_models": [], "cpu": None, "host_mem": None},
    "tier": "standard",
    "priority": 0,
    "group": None,
    "labels": {},
    "affinity": {"nodes": {}, "avoid_nodes": {}, "avoid_jobs": [], "avoid_groups": []},
    "workdir": None,
    "env": {},
    "secret_env": [],
    "checkpoint": {"dir": None, "sync": "pull"},
    "restart_budget": 3,
    "grace_s": 30.0,
    "slice_enforcement": "observe",
}
EARLY = JobSpec(JobRequest("old", JobShape(1, MemPerCard.of_fraction(0.5))), command=("sleep", "1"))


def v3_store(state_dir: Path, specs: dict[str, dict[str, Any]]) -> None:
    """A store at schema v3 with one queued job per spec, its row written as v3 wrote it."""
    SqliteStore(open_connection(state_dir, write=True, migrations=MIGRATIONS[:V3])).close()
    with sqlite3.connect(state_dir / "state.db") as conn:
        for i, (job_id, spec) in enumerate(specs.items()):
            conn.execute(
                "INSERT INTO jobs (id, name, spec, state, priority, tier, submitted_at) "
                "VALUES (?, ?, ?, 'queued', 0, 'standard', ?)",
                (job_id, spec["name"], json.dumps(spec, sort_keys=True), float(i)),
            )
    conn.close()


def stored(path: Path) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    try:
        return {r[0]: json.loads(r[1]) for r in conn.execute("SELECT id, spec FROM jobs")}
    finally:
        conn.close()


def test_the_v3_form_reads_as_the_spec_file_it_came_from() -> None:
    assert to_spec(JobSpecModel.model_validate(FULL_V3)) == FULL
    assert to_spec(JobSpecModel.model_validate(EARLY_V3)) == EARLY


def test_a_v3_store_reads_its_specs_and_is_migrated_on_write_after_a_backup(
    tmp_path: Path,
) -> None:
    d = tmp_path / "state"
    v3_store(d, {"train-000001": FULL_V3, "old-000002": EARLY_V3})
    with open_store(d, write=False) as ro:  # a read never migrates, and reads the old form
        assert ro.schema_version == V3
        assert [j.spec for j in ro.jobs()] == [FULL, EARLY]
    with open_store(d, write=True) as rw:
        assert rw.schema_version == len(MIGRATIONS) > V3
        assert [j.spec for j in rw.jobs()] == [FULL, EARLY]
        assert rw.check() == []
    assert stored(d / "state.db") == {
        "train-000001": FULL.to_dict(),
        "old-000002": EARLY.to_dict(),
    }
    assert stored(d / "state.db.v3.bak") == {"train-000001": FULL_V3, "old-000002": EARLY_V3}


def test_a_spec_the_migration_cannot_read_stops_it_and_leaves_the_store_at_v3(
    tmp_path: Path,
) -> None:
    d = tmp_path / "state"
    bad = {**EARLY_V3, "name": "bad", "resources": {"gpus": 1, "mem_per_gpu": "24 parsecs"}}
    v3_store(d, {"train-000001": FULL_V3, "bad-000002": bad})
    with pytest.raises(StateError) as err:
        open_store(d, write=True)
    assert err.value.exit_code is ExitCode.STATE
    assert err.value.message.startswith(
        "cannot migrate the store to schema v4: job bad-000002: its stored spec is not valid at "
        "resources.mem_per_gpu: '24 parsecs': unknown unit 'parsecs'"
    )
    with open_store(d, write=False) as ro:
        assert ro.schema_version == V3
    assert stored(d / "state.db") == {"train-000001": FULL_V3, "bad-000002": bad}
