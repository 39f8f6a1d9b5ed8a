"""The typed job spec: `to_dict` is plain JSON that `from_dict` reads back to the same value, and
`from_dict` refuses anything else naming the field."""

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuctl.core.jobs.spec import (
    CheckpointPolicy,
    CheckpointSync,
    JobPolicy,
    JobSpec,
    SecretRef,
    SliceEnforcement,
    SpecDataError,
    _read_fast,
    _read_slow,
)
from gpuctl.core.placement.model import JobRequest, JobShape, LabelRequirement, Tier
from gpuctl.core.units import MemPerCard

text = st.text(min_size=1, max_size=12)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
mems = st.one_of(
    st.just(MemPerCard(whole=True)),
    st.integers(1, 1 << 20).map(MemPerCard.of_mib),
    st.floats(0.01, 1.0).map(MemPerCard.of_fraction),
)
requirements = st.builds(LabelRequirement, text, st.lists(text, max_size=3).map(tuple))
requests = st.builds(
    JobRequest,
    name=text,
    shape=st.builds(
        JobShape,
        gpus=st.integers(0, 64),
        mem_per_card=mems,
        gpu_models=st.lists(text, max_size=2).map(tuple),
        cpu_milli=st.integers(0, 10**6),
        host_mem_mib=st.integers(0, 10**7),
    ),
    tier=st.sampled_from(Tier),
    priority=st.integers(-1000, 1000),
    labels=st.dictionaries(text, text, max_size=3),
    node_affinity=st.lists(requirements, max_size=2).map(tuple),
    node_anti_affinity=st.lists(requirements, max_size=2).map(tuple),
    group=st.none() | text,
    avoid_jobs=st.lists(text, max_size=2).map(tuple),
    avoid_groups=st.lists(text, max_size=2).map(tuple),
)
policies = st.builds(
    JobPolicy,
    grace_s=st.floats(0.001, 3600),
    restart_budget=st.integers(0, 100),
    checkpoint=st.builds(CheckpointPolicy, st.none() | text, st.sampled_from(CheckpointSync)),
    slice_enforcement=st.sampled_from(SliceEnforcement),
    disruptible=st.booleans(),
    min_runtime_between_moves_s=st.floats(0, 7 * 86400),
)
specs = st.builds(
    JobSpec,
    request=requests,
    policy=policies,
    command=st.lists(text, max_size=3).map(tuple),
    workdir=st.none() | text,
    env=st.dictionaries(names, st.text(max_size=8), max_size=3),
    secrets=st.lists(st.builds(SecretRef, names, st.none() | text), max_size=2).map(tuple),
)


@given(specs)
def test_a_spec_round_trips_through_json(spec: JobSpec) -> None:
    data = json.loads(json.dumps(spec.to_dict(), allow_nan=False))
    assert JobSpec.from_dict(data) == spec
    assert _read_fast(data) == _read_slow(data) == spec  # the quick read and the careful one


SPEC = JobSpec(
    JobRequest("train", JobShape(1, MemPerCard.of_mib(24576))),
    command=("python", "train.py"),
    secrets=(SecretRef("HF_TOKEN", "~/.hf_token"),),
)


def changed(path: str, value: Any) -> dict[str, Any]:
    """SPEC's plain data with the value at `path` (dotted) replaced; `...`: the key removed."""
    data = SPEC.to_dict()
    *parents, last = path.split(".")
    here = data
    for key in parents:
        here = here[key]
    if value is ...:
        del here[last]
    else:
        here[last] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        ("policy.grace_s", ..., "policy.grace_s: missing"),
        ("request.shape.gpus", "4", "request.shape.gpus: must be an integer, got str"),
        ("request.shape.gpus", True, "request.shape.gpus: must be an integer, got bool"),
        ("request.shape.gpus", -1, "request.shape: a job shape is never negative"),
        ("request.tier", "gold", "request.tier: 'gold' is not one of standard, spot"),
        ("request.owner", "al", "request.owner: unknown key"),
        ("policy.checkpoint.sync", None, "policy.checkpoint.sync: must be text, got null"),
        ("workdir", 3, "workdir: must be text or null, got int"),
        ("env", {"A": 1}, "env.A: must be text, got int"),
        ("command", "python", "command: must be a list, got str"),
        (
            "request.shape.mem_per_card",
            {"mib": 1, "whole": True},
            "request.shape.mem_per_card: must hold one of mib, fraction or whole",
        ),
        (
            "request.shape.mem_per_card",
            {"fraction": 1.5},
            "request.shape.mem_per_card: fraction must be in (0, 1]",
        ),
        ("secrets", [{"name": "A"}], "secrets[0].file: missing"),
    ],
)
def test_from_dict_refuses_what_to_dict_never_writes_naming_the_field(
    path: str, value: Any, error: str
) -> None:
    with pytest.raises(SpecDataError) as err:
        JobSpec.from_dict(changed(path, value))
    assert str(err.value) == error


def test_a_spec_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(SpecDataError, match=r"^spec: must be a mapping, got list$"):
        JobSpec.from_dict([])


def test_the_checkpoint_dir_takes_the_job_id_and_defaults_to_the_node_home() -> None:
    assert CheckpointPolicy().dir_for("a-1") == "~/.gpuctl/checkpoints/a-1"
    assert CheckpointPolicy("/shared/{job_id}/ckpt").dir_for("a-1") == "/shared/a-1/ckpt"
