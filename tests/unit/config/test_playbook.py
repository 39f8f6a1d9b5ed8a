"""Playbook files: every bad fixture fails with one exact error naming the file, the line and the
field (exit 2); the good fixture and every example playbook load into the expected steps."""

from pathlib import Path

import pytest

from gpuctl.config.inventory import load_inventory
from gpuctl.config.playbook import PlaybookError, load_playbook, parse_window
from gpuctl.core.playbook import STEP_KINDS, Selector, TimeWindow
from gpuctl.errors import ExitCode

FIXTURES = Path(__file__).parents[2] / "fixtures" / "playbooks"
BAD = FIXTURES / "bad"
EXAMPLES = Path(__file__).parents[3] / "playbooks"
INVENTORY = load_inventory(FIXTURES / "inventory.yaml")
KINDS = "step kinds: " + ", ".join(STEP_KINDS)

CASES = [
    ("unknown_step", 5, "steps[1].drian", "unknown step 'drian'", "did you mean 'drain'?"),
    (
        "undefined_target_node",
        3,
        "targets.names[1]",
        "undefined target: 'gpu09' is no node of the inventory",
        "did you mean 'gpu04'?",
    ),
    (
        "undefined_target_group",
        4,
        "targets[1].groups[1]",
        "undefined target: no node of the inventory is in group 'a10'",
        "did you mean 'a100'?",
    ),
    (
        "undeclared_privileged",
        8,
        "steps[0].run.sudo",
        "undeclared privileged command 'systemctl restart nvidia-fabricmanager': no "
        "`privileged:` entry is a prefix of it",
        "add [systemctl, restart, nvidia-fabricmanager] (or a prefix of it) to `privileged:` "
        "(declared: systemctl restart nvidia-persistenced)",
    ),
    (
        "sudo_in_argv",
        4,
        "steps[0].run.argv",
        "do not call sudo yourself: write the command and `sudo: true`",
        "privileged commands run through `sudo -n` and must be listed in `privileged:`",
    ),
    (
        "bad_expression",
        5,
        "steps[0].when",
        "bad expression 'fragmentaton_pct > 20': unknown name 'fragmentaton_pct'; did you mean "
        "'fragmentation_pct'? (column 1)",
        None,
    ),
    (
        "expression_syntax",
        5,
        "steps[0].when",
        "bad expression 'fragmentation_pct > 20 and (band == \"over\"': expected ')', found the "
        "end (column 43)",
        None,
    ),
    (
        "expression_types",
        4,
        "steps[0].assert.that",
        "bad expression 'band > 80': > compares numbers; band is a text (column 1)",
        None,
    ),
    (
        "expression_value",
        5,
        "steps[0].when",
        "bad expression 'node.health == \"sick\"': node.health is never 'sick': it is one of "
        "healthy, degraded, unhealthy, unknown (column 1)",
        None,
    ),
    (
        "node_fact_in_fleet_step",
        5,
        "steps[0].when",
        "bad expression 'node.state == \"ready\"': node.state: node facts are only known in "
        "steps that act on nodes (consolidate does not) (column 1)",
        None,
    ),
    ("two_kinds", 5, "steps[1]", "a step has exactly one kind (found cordon and uncordon)", KINDS),
    ("no_kind", 4, "steps[0]", "a step has exactly one kind (found none)", KINDS),
    (
        "bad_window",
        4,
        "settings.window",
        "must be HH:MM-HH:MM (e.g. 22:00-04:00) or always (got '22:00-25:00')",
        None,
    ),
    ("missing_reason", 4, "steps[0].cordon", "missing required key 'reason'", None),
    (
        "unknown_option",
        4,
        "steps[0].consolidate.max_move",
        "unknown key 'max_move'",
        "did you mean 'max_moves'?",
    ),
    (
        "cancel_nothing",
        4,
        "steps[0].cancel",
        "name the jobs to cancel (jobs:) or a tier (tier: spot)",
        None,
    ),
    (
        "missing_job_spec",
        4,
        "steps[0].submit.files[0]",
        "job spec 'jobs/nothing-here.yaml' not found",
        None,
    ),
    (
        "targets_word",
        2,
        "targets",
        "must be all, a selector (names, groups, labels, states) or a list of selectors",
        None,
    ),
    (
        "serial",
        3,
        "settings.serial",
        "must be a number of nodes or a percentage such as 25% (got 'half')",
        None,
    ),
]


@pytest.mark.parametrize(
    ("name", "line", "field", "message", "hint"), CASES, ids=[c[0] for c in CASES]
)
def test_a_bad_playbook_fails_with_file_line_field_and_the_exact_error(
    name: str, line: int, field: str, message: str, hint: str | None
) -> None:
    path = BAD / f"{name}.yaml"
    with pytest.raises(PlaybookError) as caught:
        load_playbook(path, inventory=INVENTORY)
    err = caught.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert err.message == f"{path}:{line}: {field}: {message}"
    assert err.hint == hint
    assert err.exit_code is ExitCode.USAGE


def test_every_bad_fixture_has_a_case() -> None:
    assert sorted(p.stem for p in BAD.glob("*.yaml")) == sorted(c[0] for c in CASES)


def test_targets_are_checked_against_an_inventory_only_when_one_is_given() -> None:
    playbook = load_playbook(BAD / "undefined_target_node.yaml")
    assert playbook.targets == (Selector(names=("gpu01", "gpu09")),)


def test_the_good_fixture_reads_every_step_kind_with_its_defaults_and_conditions() -> None:
    pb = load_playbook(FIXTURES / "good" / "everything.yaml", inventory=INVENTORY)
    assert pb.name == "everything" and pb.description == "every step kind once"
    assert sorted({s.kind for s in pb.steps}) == sorted(STEP_KINDS)
    assert pb.targets == (
        Selector(names=("gpu0*",), states=("ready", "cordoned")),
        Selector(groups=("h100",), labels={"gpu": "h100"}),
    )
    s = pb.settings
    assert (s.serial, s.serial_pct, s.max_fail_percentage) == (None, 25.0, 50.0)
    assert s.window == TimeWindow(22 * 60, 4 * 60)
    assert pb.privileged == (("systemctl", "restart"),)
    health, cordon, drain = pb.steps[1], pb.steps[2], pb.steps[3]
    assert health.options == {"samples": 2, "interval_s": 0.0, "fail_on": ["unhealthy"]}
    assert cordon.when is not None and cordon.when.uses_node
    assert drain.options["timeout_s"] == 60.0 and drain.options["parallel"] == 2
    submit = pb.steps[5]
    assert Path(submit.options["files"][0]).name == "spot-filler.yaml"
    assert pb.steps[7].options == {"passes": 2, "interval_s": 0.0}
    run = pb.steps[9]
    assert run.options["argv"] == ["systemctl", "restart", "nvidia-persistenced"]
    assert run.options["sudo"] is True
    assert pb.steps[10].options["argv"] == ["sh", "-c", "echo 'hi there'"]
    assert pb.steps[12].per_node and not pb.steps[13].per_node
    assert pb.steps[0].source == f"{FIXTURES / 'good' / 'everything.yaml'}:10"
    assert len(pb.digest) == 64


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_playbook_is_valid(path: Path) -> None:
    pb = load_playbook(path)
    assert pb.name == path.stem and pb.description


def test_the_examples_are_the_five_runbooks() -> None:
    names = {p.stem for p in EXAMPLES.glob("*.yaml")}
    assert names == {
        "nightly-consolidation",
        "health-sweep",
        "node-maintenance",
        "spot-rebalance",
        "fleet-report",
    }


def test_a_window_is_hh_mm_to_hh_mm_or_always() -> None:
    assert parse_window("always") is None
    window = parse_window("22:00-04:00")
    assert window is not None and window.contains(23 * 60) and not window.contains(12 * 60)
    with pytest.raises(ValueError, match="empty"):
        parse_window("10:00-10:00")
