"""The inventory: each bad fixture gives its exact one-line error; good ones resolve exactly."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuctl.config.inventory import load_inventory
from gpuctl.core.model import Inventory, NodeSpec
from gpuctl.errors import ExitCode, InventoryError

FIXTURES = Path(__file__).parents[2] / "fixtures" / "inventory"
HOST = "must be a host name or IP address: letters, digits, '.', '-', '_', ':' or '%'"
NAME = "must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"

# fixture -> (the error line, the hint line or None); paths are relative to FIXTURES
ROOT = "gpuctl would log in to gpu01 as root and run jobs there as root; set allow_root: true"
ROOT_HINT = "use a dedicated unprivileged account on the nodes (README: the inventory)"
BAD: dict[str, tuple[str, str | None]] = {
    "slurm-unknown-key": ("2: slurm.clustr: unknown key 'clustr'", "did you mean 'cluster'?"),
    "slurm-via-unknown": ("2: slurm.via: must be 'local' or 'ssh' (got 'rsh')", None),
    "slurm-ssh-without-login": (
        "2: slurm.via: is ssh: name the login node with slurm: login: (a node or a host)",
        None,
    ),
    "slurm-login-but-local": ("2: slurm.login: is set but via is local: set via: ssh", None),
    "slurm-address-unknown": (
        "2: slurm.address: must be 'NodeAddr', 'NodeHostName' or 'name' (got 'NodeIP')",
        None,
    ),
    "slurm-partition-not-a-string": (
        "2: slurm.partitions[1]: must be a string (got 7)",
        "quote the value to make it a string",
    ),
    "user-root": (f"2: defaults.user: is root: {ROOT} to mean it", ROOT_HINT),
    "user-root-allow-overridden": (f"3: groups.ops.user: is root: {ROOT} to mean it", ROOT_HINT),
    "unknown-key-node": ("3: nodes[0].hots: unknown key 'hots'", "did you mean 'host'?"),
    "unknown-key-top": ("1: node: unknown key 'node'", "did you mean 'nodes'?"),
    "unknown-key-defaults": ("2: defaults.usr: unknown key 'usr'", "did you mean 'user'?"),
    "unknown-key-group": (
        "3: groups.h100.gpu_modle: unknown key 'gpu_modle'",
        "did you mean 'gpu_model'?",
    ),
    "unknown-key-no-match": (
        "3: nodes[0].zzzzzz: unknown key 'zzzzzz'",
        "valid keys: user, allow_root, port, key_file, known_hosts, connect_timeout_s, "
        "command_timeout_s, transport, jump, ssh_config, labels, gpus, gpu_model, name, host, "
        "group, groups",
    ),
    "name-bad-chars": (f"2: nodes[0].name: {NAME} (got 'gpu 01')", None),
    "name-starts-with-dash": (
        "2: nodes[0].name: must not start with '-' (got '-oProxyCommand=sh')",
        None,
    ),
    "name-too-long": (f"2: nodes[0].name: {NAME} (got '{'a' * 65}')", None),
    "name-not-a-string": (
        "2: nodes[0].name: must be a string (got 1234)",
        "quote the value to make it a string",
    ),
    "host-starts-with-dash": (
        "3: nodes[0].host: must not start with '-' (got '-oProxyCommand=sh')",
        None,
    ),
    "host-bad-chars": (f"3: nodes[0].host: {HOST} (got 'gpu01;reboot')", None),
    "history-retention-bad": (
        "2: defaults.history_retention: '30 days' is not a duration (e.g. 30d, 12h, 7d12h)",
        None,
    ),
    "history-retention-short": (
        "2: defaults.history_retention: must be 1h to 366d, got '10m'",
        None,
    ),
    "user-starts-with-dash": ("2: defaults.user: must not start with '-' (got '-l')", None),
    "port-too-big": (
        "3: nodes[0].port: must be an integer between 1 and 65535 (got 70000)",
        None,
    ),
    "jump-bad-port": (
        "2: defaults.jump: bad port '99999' in jump host 'ops@bastion:99999': 1-65535",
        None,
    ),
    "jump-starts-with-dash": (
        "3: nodes[0].proxy_jump: bad host '-oProxyCommand=sh' in jump host '-oProxyCommand=sh'",
        None,
    ),
    "port-zero": ("2: defaults.port: must be an integer between 1 and 65535 (got 0)", None),
    "port-not-a-number": (
        "3: nodes[0].port: must be an integer between 1 and 65535 (got 'ssh')",
        None,
    ),
    "duplicate-name": (
        "6: nodes[2].name: duplicate node name 'gpu01' (first at bad/duplicate-name.yaml:2)",
        None,
    ),
    "duplicate-name-in-range": (
        "3: nodes[1].name: duplicate node name 'gpu03' "
        "(first at bad/duplicate-name-in-range.yaml:2)",
        None,
    ),
    "duplicate-address": (
        "5: nodes[1].host: duplicate address 10.0.0.1:22 "
        "(node 'gpu01' at bad/duplicate-address.yaml:2 has it too)",
        None,
    ),
    "duplicate-address-from-range": (
        "5: nodes[1].host: duplicate address 10.0.0.2:22 "
        "(node 'gpu2' at bad/duplicate-address-from-range.yaml:2 has it too)",
        None,
    ),
    "duplicate-key": ("4: nodes[0].port: duplicate key 'port' (first at line 3)", None),
    "unknown-group": (
        "5: nodes[0].group: unknown group 'h100-trian'",
        "did you mean 'h100-train'?",
    ),
    "unknown-group-none-defined": (
        "3: nodes[0].groups[0]: unknown group 'h100'",
        "no groups are defined: add a top-level `groups:` section",
    ),
    "group-and-groups": ("6: nodes[0].groups: use either 'group' or 'groups', not both", None),
    "range-bad-syntax": (
        "2: nodes[0].name: bad range [1-x]: each item must be N, N-M or N-M/STEP (got '1-x')",
        None,
    ),
    "range-reversed": ("2: nodes[0].name: bad range [9-1]: 9 is after 1", None),
    "range-unbalanced": ("2: nodes[0].name: unbalanced '[' and ']' in 'gpu[1-4'", None),
    "range-count-mismatch": (
        "3: nodes[0].host: the range gives 3 hosts but name gives 4 names",
        None,
    ),
    "range-one-host-many-names": (
        "3: nodes[0].host: one host for 4 names: give host a range too, or drop it",
        None,
    ),
    "range-too-large": (
        "2: nodes[0].name: 'gpu[0-99999]' expands to more than 10,000 names",
        None,
    ),
    "timeout-zero": (
        "2: defaults.connect_timeout_s: must be a number greater than 0 (got 0)",
        None,
    ),
    "timeout-negative": (
        "3: nodes[0].command_timeout_s: must be a number greater than 0 (got -5)",
        None,
    ),
    "gpus-negative": ("3: groups.g.gpus: must be an integer between 0 and 1024 (got -1)", None),
    "transport-unknown": (
        "3: nodes[0].transport: must be 'ssh' or 'local' (got 'telnet')",
        None,
    ),
    "missing-name": ("3: nodes[1]: missing required key 'name'", None),
    "label-value-not-a-string": (
        "3: nodes[0].labels.rack: must be a string (got 12)",
        "quote the value to make it a string",
    ),
    "label-key-bad": (
        "3: nodes[0].labels['bad key']: key must be 1-63 letters, digits, '.', '_', '/' or '-', "
        "starting with a letter or digit (got 'bad key')",
        None,
    ),
    "yaml-syntax": ("3: invalid YAML at column 11: a quoted string is never closed", None),
    "top-level-list": (
        "1: expected a mapping of keys at the top of the inventory file, found a list",
        None,
    ),
    # no line: these are about the whole file
    "empty": (": the inventory file is empty: expected a mapping of keys", None),
    "no-nodes": (
        ": the inventory has no nodes",
        "add a `nodes:` list; see inventory/example.yaml",
    ),
}


@pytest.fixture
def in_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load fixtures by relative path, so errors name them as an operator would see them."""
    monkeypatch.chdir(FIXTURES)
    monkeypatch.setenv("HOME", "/home/op")


def test_every_bad_fixture_has_an_expected_error() -> None:
    assert sorted(p.stem for p in (FIXTURES / "bad").glob("*.yaml")) == sorted(BAD)


@pytest.mark.usefixtures("in_fixtures")
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_fixture_gives_its_exact_error(case: str) -> None:
    error, hint = BAD[case]
    with pytest.raises(InventoryError) as info:
        load_inventory(Path("bad") / f"{case}.yaml")
    sep = "" if error.startswith(":") else ":"
    assert str(info.value) == f"bad/{case}.yaml{sep}{error}"
    assert info.value.hint == hint
    assert info.value.exit_code == ExitCode.USAGE
    assert "\n" not in str(info.value)


def test_the_history_retention_is_read_from_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("defaults:\n  history_retention: 7d12h\nnodes: [{name: a}]\n")
    (tmp_path / "b.yaml").write_text("nodes: [{name: b}]\n")
    assert load_inventory(tmp_path).history_retention_s == 7 * 86400 + 12 * 3600
    assert load_inventory(tmp_path / "b.yaml").history_retention_s is None
    (tmp_path / "b.yaml").write_text("defaults: {history_retention: 1d}\nnodes: [{name: b}]\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}/b.yaml:1: defaults.history_retention: is set a second time "
        f"(first at {tmp_path}/a.yaml:2)"
    )


@pytest.mark.usefixtures("in_fixtures")
def test_minimal_inventory_uses_the_built_in_defaults() -> None:
    inv = load_inventory(Path("good/minimal.yaml"))
    assert inv == Inventory(
        nodes=(NodeSpec(name="solo", host="solo", source="good/minimal.yaml:3", port_set=False),),
        sources=("good/minimal.yaml",),
    )
    solo = inv.nodes[0]
    assert (solo.port, solo.user, solo.transport) == (22, None, "ssh")
    assert (solo.connect_timeout_s, solo.command_timeout_s) == (5.0, 10.0)


@pytest.mark.usefixtures("in_fixtures")
def test_full_inventory_resolves_node_over_groups_over_defaults() -> None:
    good = FIXTURES / "good"
    gpu08 = NodeSpec(
        name="gpu08",
        host="10.0.1.8",
        port=2200,
        user="trainer",  # the group's user beats the defaults'
        key_file=str(good / "keys/id_ed25519"),  # relative to the file's folder
        known_hosts=("/home/op/.ssh/known_hosts",),  # one string is a list of one
        labels={"gpu": "h100", "pool": "train", "rack": "r1"},  # the node's over the group's
        groups=("h100",),
        expected_gpus=8,
        expected_model="NVIDIA H100 80GB HBM3",
        connect_timeout_s=3.0,
        command_timeout_s=7.5,
        source="good/full.yaml:22",
    )
    expected = (
        gpu08,
        dataclasses.replace(gpu08, name="gpu09", host="10.0.1.9"),
        dataclasses.replace(gpu08, name="gpu10", host="10.0.1.10"),
        NodeSpec(
            name="gpu11",
            host="gpu11",
            port=22,  # rack-r2 is listed first: its port and key win over h100's and defaults'
            user="trainer",
            key_file="/home/op/.ssh/r2_key",
            known_hosts=("/home/op/.ssh/known_hosts",),
            labels={"gpu": "h100", "pool": "spare", "rack": "r2"},
            groups=("rack-r2", "h100"),
            expected_gpus=4,  # the node's own count beats its group's
            expected_model="NVIDIA H100 80GB HBM3",
            connect_timeout_s=1.0,
            command_timeout_s=7.5,
            source="good/full.yaml:26",
        ),
        NodeSpec(
            name="local",
            host="local",
            port=2200,
            user="gpuadmin",
            key_file=str(good / "keys/id_ed25519"),
            known_hosts=("/home/op/.ssh/known_hosts",),
            labels={"gpuctl.io/role": "workstation"},
            transport="local",
            connect_timeout_s=3.0,
            command_timeout_s=7.5,
            source="good/full.yaml:30",
        ),
    )
    assert load_inventory(Path("good/full.yaml")) == Inventory(
        nodes=expected, sources=("good/full.yaml",)
    )


@pytest.mark.usefixtures("in_fixtures")
def test_a_folder_reads_its_yaml_files_in_order_sharing_groups_not_defaults() -> None:
    inv = load_inventory(Path("split"))
    assert inv.sources == ("split/10-groups.yaml", "split/20-site-a.yaml", "split/30-site-b.yml")
    a1 = NodeSpec(
        name="a1",
        host="a1",
        user="site-a",
        groups=("a100",),
        expected_gpus=8,
        expected_model="NVIDIA A100-SXM4-80GB",
        labels={"gpu": "a100"},
        source="split/20-site-a.yaml:4",
        port_set=False,  # no port: ssh_config's, else 22
    )
    assert inv.nodes == (
        a1,
        dataclasses.replace(a1, name="a2", host="a2"),
        dataclasses.replace(
            a1, name="b1", host="b1.example.internal", user=None, source="split/30-site-b.yml:2"
        ),
    )


@pytest.mark.usefixtures("in_fixtures")
def test_the_example_inventory_shipped_in_the_repository_is_valid() -> None:
    inv = load_inventory(FIXTURES.parents[2] / "inventory" / "example.yaml")
    assert len(inv.nodes) == 19
    assert [n.name for n in inv.nodes[:2]] == ["gpu01", "gpu02"]
    assert inv.by_name()["gpu16"].host == "10.0.1.16"


# --- folders and files -------------------------------------------------------------------------


def _write(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_duplicate_names_across_files_name_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "inv", "a.yaml", "nodes:\n  - name: gpu[1-3]\n")
    _write(tmp_path / "inv", "b.yaml", "# second site\nnodes:\n  - name: x\n  - name: gpu2\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(Path("inv"))
    assert str(info.value) == (
        "inv/b.yaml:4: nodes[1].name: duplicate node name 'gpu2' (first at inv/a.yaml:2)"
    )


def test_duplicate_groups_across_files_name_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "inv", "a.yml", "groups:\n  g: {}\nnodes:\n  - name: n1\n")
    _write(tmp_path / "inv", "b.yml", "groups:\n  h: {}\n  g: {gpus: 1}\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(Path("inv"))
    assert str(info.value) == "inv/b.yml:3: groups.g: duplicate group 'g' (first at inv/a.yml:2)"


def test_an_empty_folder_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "inv", "README.md", "not an inventory\n")
    _write(tmp_path / "inv", ".hidden.yaml", "nodes: [{name: x}]\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(Path("inv"))
    assert str(info.value) == "inv: no *.yaml or *.yml files in the inventory folder"
    assert info.value.hint == "add a file such as nodes.yaml, or pass a file with -i"


def test_a_missing_path_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError, match=r"^nowhere\.yaml: inventory not found$"):
        load_inventory(Path("nowhere.yaml"))


@pytest.mark.parametrize(
    "text",
    [
        "defaults: {user: root, allow_root: true}\nnodes:\n  - name: gpu01\n",
        "groups:\n  ops: {user: root}\nnodes:\n  - {name: gpu01, group: ops, allow_root: true}\n",
    ],
)
def test_root_is_accepted_where_allow_root_says_so(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    assert [n.user for n in load_inventory(path).nodes] == ["root"]


def test_the_same_host_on_different_ports_is_two_nodes(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "i.yaml",
        "nodes:\n  - {name: a, host: 127.0.0.1, port: 2201}\n"
        "  - {name: b, host: 127.0.0.1, port: 2202}\n",
    )
    inv = load_inventory(tmp_path / "i.yaml")
    assert [n.address for n in inv.nodes] == ["127.0.0.1:2201", "127.0.0.1:2202"]


def test_host_addresses_compare_without_case(tmp_path: Path) -> None:
    _write(
        tmp_path, "i.yaml", "nodes:\n  - {name: a, host: GPU1.lan}\n  - {name: b, host: gpu1.lan}\n"
    )
    with pytest.raises(InventoryError, match=r"duplicate address gpu1\.lan:22 \(node 'a' at "):
        load_inventory(tmp_path / "i.yaml")


# --- hostlist ranges (the rules themselves: tests/unit/config/test_hostlist.py) ----------------


@pytest.mark.usefixtures("in_fixtures")
def test_a_name_with_two_ranges_and_a_list_expands_to_every_node() -> None:
    inv = load_inventory(Path("good/multi-range.yaml"))
    assert [(n.name, n.host) for n in inv.nodes] == [
        ("rack1-gpu01", "10.0.1.11"),
        ("rack1-gpu02", "10.0.1.12"),
        ("rack2-gpu01", "10.0.2.11"),
        ("rack2-gpu02", "10.0.2.12"),
        ("login01", "login01"),
        ("spare1", "spare1"),
        ("spare2", "spare2"),
    ]


# --- jump hosts and the ssh_config file (how the transport uses them: tests/unit/adapters/ssh) --


def test_jump_hosts_resolve_node_over_group_over_defaults(tmp_path: Path) -> None:
    from gpuctl.core.model import Hop

    _write(
        tmp_path,
        "i.yaml",
        "defaults: {jump: 'ops@bastion.example:2222', ssh_config: conf/ssh_config}\n"
        "groups:\n  far: {proxy_jump: 'a@j1,ssh://j2:23,[fd00::1]:24'}\n"
        "nodes:\n  - {name: n1}\n  - {name: n2, group: far}\n"
        "  - {name: n3, group: far, jump: none, ssh_config: none, port: 22}\n",
    )
    n1, n2, n3 = load_inventory(tmp_path / "i.yaml").nodes
    assert n1.jump == (Hop("bastion.example", user="ops", port=2222),)
    assert n2.jump == (Hop("j1", user="a"), Hop("j2", port=23), Hop("fd00::1", port=24))
    assert n3.jump == ()  # none: directly, whatever ssh_config says
    assert n1.ssh_config == str(tmp_path / "conf/ssh_config")  # relative to the file's folder
    assert n3.ssh_config == "none"
    assert (n1.port_set, n3.port_set) == (False, True)
