"""How the SSH transport resolves a node through the operator's ssh_config and jump hosts: what it
dials, as whom, with which keys, through which bastions (no network: `route` only reads files)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.ssh import SshTransport, login_user
from gpuctl.core.model import Hop, NodeSpec
from gpuctl.errors import AuthFailed, ConfigError, ExitCode

CONFIG = """\
Host gpu07
    HostName 10.0.1.7
    User trainer
    Port 2222
    IdentityFile ~/.ssh/id_fleet
    IdentityFile ~/.ssh/id_backup
    ProxyJump ops@bastion:2200,inner

Host bastion
    HostName bastion.example.org
    IdentityFile ~/.ssh/id_bastion

Host inner
    HostName 10.9.0.1
    User jumper
    Port 23
    IdentitiesOnly yes
    IdentityFile ~/.ssh/id_inner

Host *
    ServerAliveInterval 30
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    return tmp_path


@pytest.fixture
def transport(home: Path) -> Iterator[SshTransport]:
    (home / ".ssh/config").write_text(CONFIG)
    with SshTransport(
        own_known_hosts=home / "own", system_known_hosts=(), ssh_config=home / ".ssh/config"
    ) as t:
        yield t


def node(**fields: object) -> NodeSpec:
    spec = NodeSpec(name="gpu07", host="gpu07", port_set=False, source="fleet.yaml:4")
    return dataclasses.replace(spec, **fields)  # type: ignore[arg-type]


def test_an_alias_is_dialled_by_its_hostname_user_port_and_keys_through_its_jump_hosts(
    transport: SshTransport, home: Path
) -> None:
    route = transport.route(node())
    target = route.target.node
    assert (target.name, target.host, target.port, target.user) == (
        "gpu07",
        "10.0.1.7",
        2222,
        "trainer",
    )
    assert route.target.identity_files == (
        f"{home}/.ssh/id_fleet",
        f"{home}/.ssh/id_backup",
    )
    assert route.target.agent  # IdentitiesOnly not set: ssh-agent too, as ssh does
    bastion, inner = route.hops
    # the hop's own user and port win; ssh_config's HostName and keys apply
    assert (bastion.node.host, bastion.node.port, bastion.node.user) == (
        "bastion.example.org",
        2200,
        "ops",
    )
    assert bastion.identity_files == (f"{home}/.ssh/id_bastion",)
    assert (inner.node.host, inner.node.port, inner.node.user) == ("10.9.0.1", 23, "jumper")
    assert not inner.agent  # IdentitiesOnly yes
    # errors name the jump host and its node; `gpuctl hosts trust gpu07` trusts every leg
    assert bastion.node.name == "jump host bastion of gpu07"
    assert {leg.trust for leg in route.legs} == {"gpu07"}


def test_the_inventory_wins_over_ssh_config(transport: SshTransport) -> None:
    route = transport.route(
        node(user="gpuctl", port=22, port_set=True, key_file="/keys/id", jump=(Hop("other"),))
    )
    target = route.target.node
    assert (target.host, target.port, target.user, target.key_file) == (
        "10.0.1.7",  # HostName still applies: the inventory's host is the alias
        22,
        "gpuctl",
        "/keys/id",
    )
    assert route.target.identity_files == ()  # key_file: ssh_config's keys are not tried
    assert [leg.node.host for leg in route.hops] == ["other"]
    assert transport.route(node(jump=())).hops == ()  # jump: none -> directly


def test_a_host_ssh_config_does_not_name_is_dialled_as_written(transport: SshTransport) -> None:
    route = transport.route(NodeSpec(name="gpu01", host="10.0.0.1"))
    assert route.hops == ()
    assert (route.target.node.host, route.target.node.port, route.target.node.user) == (
        "10.0.0.1",
        22,
        None,
    )


def test_the_inventory_ssh_config_wins_and_none_reads_none(
    transport: SshTransport, home: Path
) -> None:
    other = home / "fleet_ssh_config"
    other.write_text("Host gpu07\n    HostName 10.5.5.5\n")
    assert transport.route(node(ssh_config=str(other))).target.node.host == "10.5.5.5"
    assert transport.route(node(ssh_config="none")).target.node.host == "gpu07"


def test_include_reads_files_relative_to_dot_ssh(home: Path) -> None:
    (home / ".ssh/conf.d").mkdir()
    (home / ".ssh/conf.d/fleet.conf").write_text("Host gpu07\n    HostName 10.0.1.77\n")
    (home / ".ssh/config").write_text("Include conf.d/*.conf\n")
    with SshTransport(
        own_known_hosts=home / "own", system_known_hosts=(), ssh_config=home / ".ssh/config"
    ) as t:
        assert t.route(node()).target.node.host == "10.0.1.77"


def test_the_known_hosts_name_is_the_hostname_and_port_dialled(
    transport: SshTransport, home: Path
) -> None:
    (home / "own").write_text(
        "[10.0.1.7]:2222 ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    assert [k.hosts for k in transport.recorded_keys(node())] == ["[10.0.1.7]:2222"]


def test_host_key_alias_names_the_key_of_the_node_and_of_its_jump_host_as_written(
    home: Path,
) -> None:
    """As OpenSSH: the alias, lowercased and with no `[..]:port`, is the known_hosts name; the
    HostName and Port dialled are not looked up at all."""
    config = home / ".ssh/config"
    config.write_text(
        "Host gpu07\n  HostName 10.0.1.7\n  Port 2222\n  HostKeyAlias GPU07-Key\n"
        "  ProxyJump bastion\n"
        "Host bastion\n  HostName 10.9.0.1\n  Port 23\n  HostKeyAlias bastion-key\n"
    )
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    (home / "own").write_text(f"[10.0.1.7]:2222 {key}gpu07-key {key}[10.9.0.1]:23 {key}")
    with SshTransport(own_known_hosts=home / "own", system_known_hosts=(), ssh_config=config) as t:
        (bastion, bastion_keys), (target, target_keys) = t.recorded_route_keys(node())
    assert (target.node.host, target.node.port) == ("10.0.1.7", 2222)  # still dialled there
    assert (target.key_name, bastion.key_name) == ("gpu07-key", "bastion-key")
    assert [k.hosts for k in target_keys] == ["gpu07-key"]
    assert bastion_keys == ()  # recorded only under [10.9.0.1]:23: not its name


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "Host gpu07\n  Port ssh\n",
            "Host gpu07: Port: must be an integer between 1 and 65535 (got 'ssh')",
        ),
        (
            "Host gpu07\n  ProxyJump bastion:0\n",
            "Host gpu07: ProxyJump: bad port '0' in jump host 'bastion:0': 1-65535",
        ),
        (
            "Host gpu07\n  HostName -oProxyCommand=x\n",
            "Host gpu07: HostName: must be a host name or IP address (got '-oProxyCommand=x')",
        ),
        (
            "Host gpu07\n  User -l\n",
            "Host gpu07: User: must be a user name (got '-l')",
        ),
        (
            "Host gpu07\n  HostKeyAlias *.example.org\n",
            "Host gpu07: HostKeyAlias: must be a host name (got '*.example.org')",
        ),
        (
            "Host gpu07\n  ProxyJump bastion\nHost bastion\n  HostKeyAlias gpu07,other\n",
            "Host bastion: HostKeyAlias: must be a host name (got 'gpu07,other')",
        ),
        (
            "Host gpu07\n  ProxyCommand nc %h %p\n",
            "Host gpu07: ProxyCommand: is not supported: gpuctl runs no local command a config "
            "names (it quotes everything it runs itself); use ProxyJump",
        ),
        (
            'Host other\n  User x\nMatch host gpu07 exec "touch /tmp/ran"\n  User y\n',
            "line 3: Match exec: is not supported: gpuctl runs no local command a config "
            "names (it quotes everything it runs itself); use Host or Match host",
        ),
    ],
)
def test_a_bad_value_names_the_file_the_host_and_the_field(
    home: Path, text: str, error: str
) -> None:
    config = home / ".ssh/config"
    config.write_text(text)
    with (
        SshTransport(own_known_hosts=home / "own", system_known_hosts=(), ssh_config=config) as t,
        pytest.raises(ConfigError) as info,
    ):
        t.route(node())
    assert str(info.value) == f"{config}: {error}"
    assert info.value.exit_code == ExitCode.USAGE


def test_an_inventory_ssh_config_that_is_missing_names_the_inventory(
    transport: SshTransport,
) -> None:
    with pytest.raises(ConfigError, match=r"^fleet\.yaml:4: ssh_config: ssh_config /nope: no such"):
        transport.route(node(ssh_config="/nope"))


def test_root_from_ssh_config_needs_allow_root(home: Path) -> None:
    config = home / ".ssh/config"
    config.write_text("Host gpu07\n  User root\n")
    with SshTransport(own_known_hosts=home / "own", system_known_hosts=(), ssh_config=config) as t:
        resolved = t.route(node()).target.node
        with pytest.raises(AuthFailed, match=r"would log in as root \(the ssh config or the jump"):
            login_user(resolved)
        assert login_user(t.route(node(allow_root=True)).target.node) == "root"
