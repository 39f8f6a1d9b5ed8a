"""`gpuctl hosts trust|list` against real lab nodes: trust is explicit and shows fingerprints."""

import json
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpuctl.adapters.ssh import SshTransport
from gpuctl.cli.main import app
from gpuctl.lab.sshd import generate_ed25519
from gpuctl.testing.lab import LabFleet, lab_fleet

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def lab() -> Iterator[LabFleet]:
    with lab_fleet(nodes=2, gpus=1) as fleet:
        yield fleet


@pytest.fixture
def inventory(lab: LabFleet, tmp_path: Path) -> Path:
    """The lab's nodes, with no known_hosts of their own: only gpuctl's own file applies."""
    lines = ["defaults:", f"  user: {lab.lab.user}", f"  key_file: {lab.lab.key_path}", "nodes:"]
    for node in lab.lab.nodes:
        lines.append(f"  - {{name: {node.name}, host: {node.host}, port: {node.port}}}")
    lines.append("  - {name: gone, host: 127.0.0.1, port: 1}")
    path = tmp_path / "inventory.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def own_known_hosts(tmp_path: Path) -> Path:
    return tmp_path / "state" / "known_hosts"


def gpuctl(tmp_path: Path, inventory: Path, *args: str, answer: str | None = None) -> Result:
    env = {"GPUCTL_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path / "home")}
    return CliRunner().invoke(app, ["-i", str(inventory), *args], input=answer, env=env)


def fingerprint(pub: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()[1]


def test_trust_with_yes_records_the_key_and_the_node_then_connects(
    lab: LabFleet, inventory: Path, own_known_hosts: Path, tmp_path: Path
) -> None:
    node = lab.lab.node("lab-01")
    result = gpuctl(tmp_path, inventory, "hosts", "trust", "lab-01", "--yes")
    assert result.exit_code == 0, result.stderr
    expected = fingerprint(lab.host_key_public("lab-01"))
    assert result.stdout == f"lab-01\t[127.0.0.1]:{node.port}\tssh-ed25519\t{expected}\n"
    assert f"recorded in {own_known_hosts}" in result.stderr
    public = lab.host_key_public("lab-01").read_text().split()[1]
    assert own_known_hosts.read_text() == f"[127.0.0.1]:{node.port} ssh-ed25519 {public}\n"
    assert stat.S_IMODE(own_known_hosts.stat().st_mode) == 0o600
    assert stat.S_IMODE(own_known_hosts.parent.stat().st_mode) == 0o700
    with SshTransport(own_known_hosts=own_known_hosts, system_known_hosts=()) as transport:
        spec = lab.spec("lab-01", known_hosts=())
        assert transport.run(spec, "echo trusted", timeout_s=5).stdout == b"trusted\n"

    again = gpuctl(tmp_path, inventory, "hosts", "trust", "lab-01")
    assert again.exit_code == 0
    assert f"already trusted ({own_known_hosts}:1)" in again.stderr


def test_trust_answered_no_records_nothing(
    inventory: Path, own_known_hosts: Path, tmp_path: Path
) -> None:
    result = gpuctl(tmp_path, inventory, "hosts", "trust", "lab-02", answer="n\n")
    assert result.exit_code == 1
    assert "Trust lab-02 (ssh-ed25519 SHA256:" in result.stderr
    assert "not recorded" in result.stderr
    assert not own_known_hosts.exists()


def test_trust_answered_yes_records_the_key(
    inventory: Path, own_known_hosts: Path, tmp_path: Path
) -> None:
    result = gpuctl(tmp_path, inventory, "hosts", "trust", "lab-02", answer="y\n")
    assert result.exit_code == 0, result.stderr
    assert own_known_hosts.read_text().count("ssh-ed25519") == 1


def test_a_changed_key_is_refused_unless_replace_is_asked_for(
    lab: LabFleet, inventory: Path, own_known_hosts: Path, tmp_path: Path
) -> None:
    node = lab.lab.node("lab-01")
    impostor = generate_ed25519(tmp_path / "impostor", "impostor").split()[1]
    own_known_hosts.parent.mkdir(mode=0o700)
    old_text = f"[127.0.0.1]:{node.port} ssh-ed25519 {impostor}\n"
    own_known_hosts.write_text(old_text)

    refused = gpuctl(tmp_path, inventory, "hosts", "trust", "lab-01", "--yes")
    assert refused.exit_code == 5
    assert "HOST KEY CHANGED" in refused.stderr
    assert fingerprint(tmp_path / "impostor.pub") in refused.stderr
    assert fingerprint(lab.host_key_public("lab-01")) in refused.stderr
    assert "gpuctl hosts trust --replace lab-01" in refused.stderr
    assert own_known_hosts.read_text() == old_text

    replaced = gpuctl(tmp_path, inventory, "hosts", "trust", "lab-01", "--replace", "--yes")
    assert replaced.exit_code == 0, replaced.stderr
    public = lab.host_key_public("lab-01").read_text().split()[1]
    assert own_known_hosts.read_text() == f"[127.0.0.1]:{node.port} ssh-ed25519 {public}\n"


def test_an_unreachable_node_is_reported_and_the_others_still_trusted(
    inventory: Path, own_known_hosts: Path, tmp_path: Path
) -> None:
    result = gpuctl(tmp_path, inventory, "hosts", "trust", "--all", "--yes")
    assert result.exit_code == 3
    assert "gone (127.0.0.1:1): connection refused" in result.stderr
    assert "Traceback" not in result.stderr
    assert own_known_hosts.read_text().count("ssh-ed25519") == 2


def test_an_unknown_node_name_is_a_usage_error(inventory: Path, tmp_path: Path) -> None:
    result = gpuctl(tmp_path, inventory, "hosts", "trust", "lab-99", "--yes")
    assert result.exit_code == 2
    assert "unknown node 'lab-99'" in result.stderr


def test_list_shows_what_is_trusted_and_where(
    lab: LabFleet, inventory: Path, own_known_hosts: Path, tmp_path: Path
) -> None:
    gpuctl(tmp_path, inventory, "hosts", "trust", "lab-02", "--yes")
    result = gpuctl(tmp_path, inventory, "hosts", "list", "lab-01", "lab-02")
    assert result.exit_code == 1  # lab-01 has no key recorded
    port = lab.lab.node("lab-02").port
    expected = fingerprint(lab.host_key_public("lab-02"))
    assert result.stdout.splitlines() == [
        f"lab-01\t[127.0.0.1]:{lab.lab.node('lab-01').port}\t-\t(none)\t-",
        f"lab-02\t[127.0.0.1]:{port}\tssh-ed25519\t{expected}\t{own_known_hosts}:1",
    ]


def test_trust_without_an_answer_or_yes_is_a_usage_error_and_records_nothing(
    inventory: Path, own_known_hosts: Path, tmp_path: Path
) -> None:
    result = gpuctl(tmp_path, inventory, "hosts", "trust", "lab-02")  # stdin at its end
    assert result.exit_code == 2
    assert result.stderr.endswith(
        "[y/N]: \nerror: no answer (no terminal): nothing changed\n"
        "hint: pass --yes to apply without a terminal\n"
    )
    assert not own_known_hosts.exists()


def _ssh_config_env(tmp_path: Path, ssh_config: Path) -> dict[str, str]:
    """A home and state of the test's own, and `ssh_config` as the operator's ssh config."""
    return {
        "GPUCTL_STATE_DIR": str(tmp_path / "state"),
        "HOME": str(tmp_path / "home"),
        "GPUCTL_SSH_CONFIG": str(ssh_config),
    }


def test_list_shows_the_keys_of_the_jump_hosts_a_node_is_reached_through(
    tmp_path: Path, own_known_hosts: Path
) -> None:
    """No network: the route comes from ssh_config, the keys from known_hosts."""
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        "Host gpu-behind\n  HostName 10.9.0.2\n  Port 2222\n  ProxyJump bastion\n"
        "Host bastion\n  HostName 127.0.0.1\n  Port 2201\n"
    )
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text("nodes:\n  - {name: gpu01, host: gpu-behind}\n")
    public_line = generate_ed25519(tmp_path / "key", "test")
    (tmp_path / "key.pub").write_text(public_line + "\n")
    public = public_line.split()[:2]
    own_known_hosts.parent.mkdir(parents=True)
    own_known_hosts.write_text(f"[10.9.0.2]:2222 {' '.join(public)}\n")
    env = _ssh_config_env(tmp_path, ssh_config)
    run = CliRunner().invoke
    result = run(app, ["-i", str(inventory), "hosts", "list", "-o", "json"], env=env)
    assert result.exit_code == 1  # the bastion's key is not recorded
    (node,) = json.loads(result.stdout)["nodes"]
    assert node["host"] == "[10.9.0.2]:2222" and len(node["keys"]) == 1
    assert node["jumps"] == [{"host": "[127.0.0.1]:2201", "keys": []}]
    with own_known_hosts.open("a") as f:
        f.write(f"[127.0.0.1]:2201 {' '.join(public)}\n")
    result = run(app, ["-i", str(inventory), "hosts", "list"], env=env)
    assert result.exit_code == 0, result.stderr
    fp = fingerprint(tmp_path / "key.pub")
    assert result.stdout.splitlines() == [
        f"gpu01\tvia [127.0.0.1]:2201\tssh-ed25519\t{fp}\t{own_known_hosts}:2",
        f"gpu01\t[10.9.0.2]:2222\tssh-ed25519\t{fp}\t{own_known_hosts}:1",
    ]


def test_trust_records_the_key_under_ssh_configs_host_key_alias_and_a_poll_then_connects(
    lab: LabFleet, own_known_hosts: Path, tmp_path: Path
) -> None:
    """As `ssh gpu-a` would: the alias as written, no `[127.0.0.1]:port`; list shows it."""
    node = lab.lab.node("lab-01")
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        f"Host gpu-a\n  HostName {node.host}\n  Port {node.port}\n  HostKeyAlias gpu-a-key\n"
    )
    inventory = tmp_path / "fleet.yaml"
    inventory.write_text(
        f"defaults: {{user: {lab.lab.user}, key_file: {lab.lab.key_path}}}\n"
        "nodes:\n  - {name: lab-01, host: gpu-a}\n"
    )
    env = _ssh_config_env(tmp_path, ssh_config)
    run = CliRunner().invoke
    result = run(app, ["-i", str(inventory), "hosts", "trust", "lab-01", "--yes"], env=env)
    assert result.exit_code == 0, result.stderr
    expected = fingerprint(lab.host_key_public("lab-01"))
    assert result.stdout == f"lab-01\tgpu-a-key\tssh-ed25519\t{expected}\n"
    assert "lab-01 (gpu-a-key): recorded in" in result.stderr
    public = lab.host_key_public("lab-01").read_text().split()[1]
    assert own_known_hosts.read_text() == f"gpu-a-key ssh-ed25519 {public}\n"

    listed = run(app, ["-i", str(inventory), "hosts", "list"], env=env)
    assert listed.exit_code == 0, listed.stderr
    assert listed.stdout == f"lab-01\tgpu-a-key\tssh-ed25519\t{expected}\t{own_known_hosts}:1\n"
    with SshTransport(
        own_known_hosts=own_known_hosts, system_known_hosts=(), ssh_config=ssh_config
    ) as transport:
        spec = lab.spec("lab-01", host="gpu-a", port_set=False, known_hosts=())
        assert transport.run(spec, "echo trusted", timeout_s=5).stdout == b"trusted\n"
