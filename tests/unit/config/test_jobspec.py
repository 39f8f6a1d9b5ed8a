"""Job spec files: every good fixture loads into the expected request; every bad one fails with
one exact error naming the file, the line and the field."""

import json
from pathlib import Path

import pytest

from gpuctl.config.jobspec import JobSpecModel, spec_document, spec_from_data
from gpuctl.config.jobspec_files import load_job_specs, load_specs
from gpuctl.core.jobs.spec import CheckpointSync, JobSpec, SecretRef, SliceEnforcement
from gpuctl.core.placement import LabelRequirement, Tier
from gpuctl.core.units import MemPerCard
from gpuctl.errors import ExitCode, JobSpecError

FIXTURES = Path(__file__).parents[2] / "fixtures" / "jobs"
GOOD = FIXTURES / "good"
BAD = FIXTURES / "bad"
EXAMPLES = Path(__file__).parents[3] / "examples" / "jobs"
NAME_RULE = "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def test_a_slice_job_reads_memory_cpu_host_memory_and_command() -> None:
    (loaded,) = load_specs([GOOD / "slice.yaml"])
    req = loaded.spec.request
    assert req.name == "infer-small"
    assert loaded.spec.command == ("python", "-m", "server", "--port", "8000")
    assert req.shape.gpus == 1
    assert req.shape.mem_per_card == MemPerCard.of_mib(24 * 1024)
    assert (req.shape.cpu_milli, req.shape.host_mem_mib) == (4000, 32 * 1024)
    assert (req.tier, req.priority) == (Tier.STANDARD, 0)


def test_a_fraction_job_defaults_to_one_gpu() -> None:
    (loaded,) = load_specs([GOOD / "fraction.yaml"])
    req = loaded.spec.request
    assert (req.shape.gpus, req.shape.mem_per_card) == (1, MemPerCard.of_fraction(0.5))
    assert loaded.spec.command == ()


def test_a_whole_card_job_reads_models_priority_group_and_labels() -> None:
    (req,) = load_job_specs([GOOD / "whole.yaml"])
    assert req.shape.gpus == 4
    assert req.shape.mem_per_card == MemPerCard.whole_card()
    assert req.shape.gpu_models == ("H100", "H200")
    assert (req.priority, req.group, dict(req.labels)) == (10, "llama", {"team": "nlp"})


def test_affinity_becomes_label_requirements_and_job_anti_affinity() -> None:
    (req,) = load_job_specs([GOOD / "affinity.yaml"])
    assert req.shape.mem_per_card == MemPerCard.of_mib(38147)  # 40 GB, decimal, rounded up
    assert req.node_affinity == (LabelRequirement("zone", ("eu-1", "eu-2")),)
    assert req.node_anti_affinity == (LabelRequirement("maintenance"),)  # "*": any value
    assert (req.avoid_jobs, req.avoid_groups) == (("train-llama",), ("serving",))


def test_a_spot_job_reads_its_tier_and_milli_cores() -> None:
    (req,) = load_job_specs([GOOD / "spot.yaml"])
    assert (req.tier, req.priority, req.shape.cpu_milli) == (Tier.SPOT, -5, 500)


def test_a_file_may_hold_a_list_of_jobs() -> None:
    reqs = load_job_specs([GOOD / "list.yaml"])
    assert [r.name for r in reqs] == ["web-0", "web-1", "etl"]
    assert reqs[2].shape.gpus == 0
    assert reqs[2].shape.host_mem_mib == 64 * 1024


def test_names_must_be_unique_across_files() -> None:
    with pytest.raises(JobSpecError) as err:
        load_job_specs([GOOD / "slice.yaml", GOOD / "slice.yaml"])
    assert "name: job name 'infer-small' is used twice (first at " in str(err.value)


def test_every_example_in_the_docs_is_a_valid_job_spec() -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert len(files) >= 5
    assert len(load_job_specs(files)) >= 5


BAD_CASES = {
    "unknown-key.yaml": ("3: resources.gpu: unknown key 'gpu'", "did you mean 'gpus'?"),
    "mem-without-unit.yaml": (
        "3: resources.mem_per_gpu: 24: a bare number is a fraction of a card in (0, 1]; "
        "for an amount give a unit (e.g. 24GiB)",
        None,
    ),
    "mem-bad-unit.yaml": (
        "3: resources.mem_per_gpu: '24 parsecs': unknown unit 'parsecs'; use KiB, MiB, GiB, TiB "
        "(binary), KB, MB, GB, TB (decimal) or K, M, G, T (binary)",
        None,
    ),
    "host-mem-without-unit.yaml": (
        "3: resources.host_mem: 64 needs a unit: write e.g. 24GiB, 512MiB or 80GB",
        None,
    ),
    "bad-name.yaml": (f"1: name: {NAME_RULE} (got '-rm')", None),
    "bad-avoid-job.yaml": (f"4: affinity.avoid_jobs[0]: {NAME_RULE} (got 'bad name')", None),
    "bad-tier.yaml": ("3: tier: must be 'standard' or 'spot' (got 'premium')", None),
    "missing-resources.yaml": ("1: missing required key 'resources'", None),
    "duplicate-names.yaml": (
        "4: jobs[1].name: job name 'j' is used twice (first at {path}:2)",
        None,
    ),
    "negative-gpus.yaml": (
        "3: resources.gpus: must be an integer between 0 and 64 (got -1)",
        None,
    ),
    "priority-out-of-range.yaml": (
        "3: priority: must be an integer between -1000 and 1000 (got 5000)",
        None,
    ),
    "cpu-only-with-mem.yaml": (
        "4: resources.mem_per_gpu: needs gpus of 1 or more (gpus is 0: CPU only)",
        None,
    ),
    "empty-label-values.yaml": (
        "4: affinity.nodes: label 'zone': give at least one value, or '*'",
        None,
    ),
    "command-string.yaml": ("2: command: must be a list (got 'python train.py')", None),
    "command-nul.yaml": (
        "2: command[3]: an argument cannot hold a NUL character (a command line ends at one)",
        None,
    ),
    "command-too-long.yaml": (
        "3: command[2]: too long to launch: command, env, workdir and checkpoint.dir take 68,019 "
        "bytes of the launch command line (this value 68,013); the limit is 49,152",
        "pass large data in a file the job reads (under workdir), not on its command line",
    ),
    "empty-list.yaml": ("1: jobs: must not be empty", None),
    "not-a-mapping.yaml": (
        "1: expected a mapping of keys at the top of the job spec file, found a list",
        None,
    ),
    "env-reserved.yaml": (
        "4: env.CUDA_VISIBLE_DEVICES: key CUDA_VISIBLE_DEVICES is set by gpuctl at launch; "
        "a job spec cannot set it",
        None,
    ),
    "env-bool.yaml": (
        "4: env.DEBUG: true/false is ambiguous in an environment: quote it ('true' or '1')",
        None,
    ),
    "secret-shape.yaml": (
        "4: secret_env[0]: TOKEN: a secret's source is {file: PATH} (got keys: path)",
        None,
    ),
    "secret-twice.yaml": (
        "5: secret_env[1]: secret TOKEN is listed twice (first at secret_env[0])",
        None,
    ),
    "secret-and-env.yaml": (
        "4: secret_env[0]: TOKEN is both in env and in secret_env: keep it in one",
        None,
    ),
    "secret-files-key.yaml": (
        "4: secret_files: unknown key 'secret_files'",
        "list files under secret_env: - NAME: {file: PATH}",
    ),
    "secret-file-bad-name.yaml": (
        "5: secret_env[1]: '1TOKEN' is not an environment variable name "
        "(^[A-Za-z_][A-Za-z0-9_]{0,127}$)",
        None,
    ),
    "checkpoint-sync.yaml": ("4: checkpoint.sync: must be 'shared' or 'pull' (got 'rsync')", None),
    "checkpoint-typo.yaml": ("5: checkpoint.synk: unknown key 'synk'", "did you mean 'sync'?"),
    "grace-zero.yaml": (
        "3: grace_s: must be a number greater than 0 and of 3600 or less (got 0)",
        None,
    ),
    "restart-budget-negative.yaml": (
        "3: restart_budget: must be an integer between 0 and 100 (got -1)",
        None,
    ),
    "slice-enforcement.yaml": (
        "3: slice_enforcement: must be 'observe' or 'stop' (got 'kill')",
        None,
    ),
    "workdir-typo.yaml": ("3: work_dir: unknown key 'work_dir'", "did you mean 'workdir'?"),
}
NEEDS_COMMAND = "no-command.yaml"  # valid for `gpuctl place`, refused by `gpuctl submit`


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_a_bad_job_spec_fails_with_one_exact_error(name: str) -> None:
    path = BAD / name
    expected, hint = BAD_CASES[name]
    with pytest.raises(JobSpecError) as err:
        load_job_specs([path])
    assert str(err.value) == f"{path}:{expected.replace('{path}', str(path))}"
    assert err.value.hint == hint
    assert err.value.exit_code is ExitCode.USAGE


def test_every_bad_fixture_has_an_expected_error() -> None:
    on_disk = {p.name for p in BAD.glob("*.yaml")} - {"bad-yaml.yaml", NEEDS_COMMAND}
    assert on_disk == set(BAD_CASES)


def test_invalid_yaml_names_the_file_and_line() -> None:
    with pytest.raises(JobSpecError) as err:
        load_job_specs([BAD / "bad-yaml.yaml"])
    assert str(err.value).startswith(f"{BAD / 'bad-yaml.yaml'}:3: invalid YAML")


def test_a_missing_file_is_a_job_spec_error() -> None:
    with pytest.raises(JobSpecError, match="job spec file not found"):
        load_job_specs([GOOD / "nope.yaml"])


def test_submit_needs_a_command_and_says_so_with_the_file_and_line() -> None:
    path = BAD / NEEDS_COMMAND
    assert [r.name for r in load_job_specs([path])] == ["j"]  # fine for `gpuctl place`
    with pytest.raises(JobSpecError) as err:
        load_specs([path], require_command=True)
    assert str(err.value) == (
        f"{path}:1: missing required key 'command' (the argv to run, e.g. [python, train.py])"
    )
    assert err.value.exit_code is ExitCode.USAGE


def test_a_200_kb_argument_is_refused_when_read_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: j\ncommand: [python, train.py, --data, {'x' * 200_000}]\nresources: {{}}\n"
    )
    with pytest.raises(JobSpecError) as err:
        load_specs([path], require_command=True)
    assert str(err.value) == (
        f"{path}:2: command[3]: too long to launch: command, env, workdir and checkpoint.dir take "
        "200,024 bytes of the launch command line (this value 200,001); the limit is 49,152"
    )
    assert err.value.exit_code is ExitCode.USAGE


def test_env_workdir_and_checkpoint_dir_count_towards_the_launch_size(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    text = (
        "name: j\ncommand: [python, train.py]\nresources: {}\n"
        f"env: {{A: {'a' * 30_000}, B: {'b' * 15_000}}}\nworkdir: /{'w' * 4000}\n"
    )
    path.write_text(text)
    assert len(load_specs([path])) == 1  # under the limit
    path.write_text(text + "checkpoint: {dir: /ckpt}\n")  # its folder, and the resume point in it
    with pytest.raises(JobSpecError) as err:
        load_specs([path])
    assert str(err.value).startswith(f"{path}:4: env.A: too long to launch: ")
    assert "take 49,292 bytes of the launch command line (this value 30,003)" in str(err.value)


def test_running_keys_are_read_and_relative_paths_resolve_against_the_spec_folder() -> None:
    (loaded,) = load_specs([GOOD / "run.yaml"], require_command=True)
    spec = loaded.spec
    assert loaded.source == f"{GOOD / 'run.yaml'}:2"
    assert spec.command == ("python", "train.py", "--steps", "1000")
    assert spec.workdir == str((GOOD.parent / "work").absolute())
    assert spec.env == {"EPOCHS": "3", "LR": "0.001", "MODE": "fast"}
    assert spec.secrets == (  # names and where to read them: what the store keeps
        SecretRef("WANDB_API_KEY"),
        SecretRef("HF_TOKEN", str((GOOD / "secrets" / "hf.token").absolute())),
    )
    policy = spec.policy
    assert policy.checkpoint.dir == str(GOOD / "ckpt" / "{job_id}")
    assert policy.checkpoint.sync is CheckpointSync.SHARED
    assert (policy.restart_budget, policy.grace_s, policy.slice_enforcement) == (
        5,
        45.0,
        SliceEnforcement.STOP,
    )


def test_running_keys_have_documented_defaults(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: j\ncommand: [sleep, '10']\nresources: {}\nworkdir: ~/work\n")
    (loaded,) = load_specs([path], require_command=True)
    spec = loaded.spec
    assert spec.workdir == "~/work"  # the node's home: left for the node to expand
    assert (spec.env, spec.secrets) == ({}, ())
    policy = spec.policy
    assert (policy.checkpoint.dir, policy.checkpoint.sync) == (None, CheckpointSync.PULL)
    assert (policy.restart_budget, policy.grace_s, policy.slice_enforcement) == (
        3,
        30.0,
        SliceEnforcement.OBSERVE,
    )


def test_a_loaded_spec_round_trips_through_plain_data() -> None:
    (loaded,) = load_specs([GOOD / "run.yaml"])
    data = loaded.spec.to_dict()
    assert JobSpec.from_dict(json.loads(json.dumps(data))) == loaded.spec


def test_a_secret_value_never_enters_the_loaded_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    value = "s3cr3t-value-7f1e"
    monkeypatch.setenv("WANDB_API_KEY", value)
    (loaded,) = load_specs([GOOD / "run.yaml"])
    assert value not in repr(loaded)
    assert value not in json.dumps(loaded.spec.to_dict())
    assert "WANDB_API_KEY" in json.dumps(loaded.spec.to_dict())  # the name is kept, not the value


@pytest.mark.parametrize("path", sorted(GOOD.glob("*.yaml")), ids=lambda p: p.name)
def test_a_spec_shows_with_a_spec_files_keys_and_reads_back_to_the_same_spec(path: Path) -> None:
    for loaded in load_specs([path]):
        doc = spec_document(loaded.spec)  # `gpuctl jobs show -o json`: the keys it always had
        assert list(doc) == list(JobSpecModel.model_fields)
        assert list(doc["resources"]) == ["gpus", "mem_per_gpu", "gpu_models", "cpu", "host_mem"]
        assert json.loads(json.dumps(doc)) == doc
        if not doc["resources"]["gpus"]:  # CPU only: a spec file gives no card keys
            del doc["resources"]["mem_per_gpu"], doc["resources"]["gpu_models"]
        assert spec_from_data(doc) == loaded.spec


def test_a_spec_shows_sizes_in_gib_or_mib_and_cpu_in_cores_or_milli_cores() -> None:
    (slice_,) = load_specs([GOOD / "slice.yaml"])
    (spot,) = load_specs([GOOD / "spot.yaml"])
    (affinity,) = load_specs([GOOD / "affinity.yaml"])
    assert spec_document(slice_.spec)["resources"] | {"gpu_models": []} == {
        "gpus": 1,
        "mem_per_gpu": "24GiB",
        "gpu_models": [],
        "cpu": 4,
        "host_mem": "32GiB",
    }
    assert spec_document(spot.spec)["resources"]["cpu"] == "500m"
    assert spec_document(affinity.spec)["resources"]["mem_per_gpu"] == "38147MiB"  # 40GB
    assert spec_document(affinity.spec)["affinity"]["avoid_nodes"] == {"maintenance": "*"}
