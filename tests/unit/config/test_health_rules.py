"""The health rules file: built-in table, operator overrides, and exact errors for bad overrides."""

from pathlib import Path

import pytest

from gpuctl.config.health_rules import RulesModel, load_rules
from gpuctl.core.health import RULE_IDS, Action, Severity
from gpuctl.errors import ConfigError, ExitCode


def test_every_rule_the_core_knows_has_an_entry_in_the_file_schema() -> None:
    assert list(RulesModel.model_fields) == list(RULE_IDS)


def test_the_built_in_rules_load_with_the_documented_defaults() -> None:
    rules = load_rules()
    t = rules.temperature
    assert (t.limit_c, t.sustained_samples, t.sustained_window_s, t.max_gap_s) == (85, 3, 60, 300)
    assert rules.xid_rule(79).action is Action.DRAIN
    assert rules.xid_rule(13).action is Action.NONE
    assert rules.xid_rule(555).id == "xid_unknown"
    assert rules.source == "built-in"


def test_an_override_changes_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "thresholds:\n"
        "  temperature:\n"
        "    limit_c: 80\n"
        "xid_classes:\n"
        "  application:\n"
        "    xids: [13, 31]\n"
        "  noisy:\n"
        "    xids: [43]\n"
        "    action: alert\n"
        "    severity: warn\n"
        '    reason: "XID {xid} again"\n'
        "rules:\n"
        "  temp_spike: {action: none}\n"
    )
    rules = load_rules(path)
    assert rules.temperature.limit_c == 80
    assert rules.temperature.sustained_samples == 3  # kept from the built-in file
    assert rules.xid_rule(43).id == "xid_noisy"
    assert rules.xid_rule(43).severity is Severity.WARN
    assert rules.xid_rule(79).action is Action.DRAIN
    spike = rules.rule("temp_spike")
    assert (spike.action, spike.severity) == (Action.NONE, Severity.WARN)
    assert rules.source == f"built-in + {path}"


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        (
            "thresholds:\n  temperature:\n    limt_c: 80\n",
            "rules.yaml:3: thresholds.temperature.limt_c: unknown key 'limt_c'",
            "did you mean 'limit_c'?",
        ),
        (
            "thresholds:\n  temperature:\n    limit_c: hot\n",
            "rules.yaml:3: thresholds.temperature.limit_c: must be an integer between 0 and 150 "
            "(got 'hot')",
            None,
        ),
        (
            "rules:\n  temp_spike:\n    action: kill\n",
            "rules.yaml:3: rules.temp_spike.action: must be 'none', 'alert', 'cordon' or 'drain' "
            "(got 'kill')",
            None,
        ),
        (
            "xid_classes:\n  application:\n    xids: [13, 79]\n",
            "rules.yaml:3: xid_classes.application.xids[1]: XID 79 is also in the class 'hardware'",
            "an XID belongs to one class: remove it from xid_classes.hardware.xids",
        ),
        (
            'rules:\n  temp_spike:\n    reason: "{temp} is hot"\n',
            "rules.yaml:3: rules.temp_spike.reason: the reason uses {temp}, which this rule does "
            "not offer (it offers {temp_c}, {limit_c})",
            None,
        ),
        (
            'rules:\n  gpu_missing:\n    reason: "{expected.__class__}"\n',
            "rules.yaml:3: rules.gpu_missing.reason: the reason uses {expected.__class__}, which "
            "this rule does not offer (it offers {expected}, {found}, {missing})",
            None,
        ),
        (
            "xid_classes:\n  unknown:\n    xids: [1]\n    action: none\n    severity: ok\n"
            "    reason: x\n",
            "rules.yaml:2: xid_classes.unknown: the class name 'unknown' is reserved",
            "XIDs in no class already take the rule rules.xid_unknown",
        ),
        ("version: 2\n", "rules.yaml:1: version: must be 1 (got 2)", None),
        ("", "rules.yaml: the health rules file is empty: expected a mapping of keys", None),
    ],
)
def test_a_bad_override_is_one_error_naming_file_line_and_field(
    tmp_path: Path, text: str, message: str, hint: str | None
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_rules(path)
    assert caught.value.message == f"{tmp_path}/{message}"
    assert caught.value.hint == hint
    assert caught.value.exit_code is ExitCode.USAGE
