"""Nodes behind a bastion on a lab fleet: lab-02's sshd is in a network namespace this machine
cannot reach (a direct connection is refused), and a bastion sshd across its link forwards to
it. gpuctl reaches it through the operator's ssh_config (a Host alias with ProxyJump), verifies
both host keys, pools the bastion's connection, and reports the node unreachable when the
bastion dies."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.ssh import SshTransport
from gpuctl.core.model import NodeSpec
from gpuctl.lab import bastion
from gpuctl.testing.lab import LabFleet
from tests.e2e.faults import gpuctl, refuses

pytestmark = pytest.mark.e2e


class Behind:
    def __init__(self, lab: LabFleet, tmp: Path, b: bastion.Bastion) -> None:
        self.b = b
        self.ssh_config = tmp / "ssh_config"
        self.ssh_config.write_text(
            b.ssh_config("lab-02-behind") + b.ssh_config("lab-02-again", bastion_alias="bastion")
        )
        node_key = lab.host_key_public("lab-02").read_text().split()[:2]
        bastion_key = b.host_key_public.read_text().split()[:2]
        self.node_line = f"[{b.node_addr}]:{b.node_port} {' '.join(node_key)}\n"
        self.bastion_line = f"[127.0.0.1]:{b.port} {' '.join(bastion_key)}\n"
        self.known_hosts = tmp / "known_hosts"
        self.inventory = tmp / "fleet.yaml"
        self.inventory.write_text(
            f"defaults: {{known_hosts: [{self.known_hosts}]}}\n"
            "nodes:\n  - {name: lab-02, host: lab-02-behind}\n"
        )
        self.env = {
            "HOME": str(tmp),
            "GPUCTL_STATE_DIR": str(tmp / "state"),
            "GPUCTL_SSH_CONFIG": str(self.ssh_config),
        }
        self.state = tmp / "state"

    def status(self) -> tuple[int, dict[str, object], str]:
        done = gpuctl(self.state, self.inventory, "status", "-o", "json", env=self.env)
        return done.returncode, json.loads(done.stdout or "{}"), done.stderr

    def trust(self) -> subprocess.CompletedProcess[str]:
        """`gpuctl hosts trust lab-02 --yes` into this test's known_hosts."""
        return gpuctl(
            self.state,
            self.inventory,
            "hosts",
            "trust",
            "lab-02",
            "--yes",
            "--known-hosts",
            str(self.known_hosts),
            env=self.env,
        )


@pytest.fixture
def behind(own_lab: LabFleet, tmp_path: Path) -> Iterator[Behind]:
    b = bastion.start(own_lab.dir, "lab-02")
    try:
        yield Behind(own_lab, tmp_path, b)
    finally:
        bastion.stop(b)


def test_status_reaches_a_node_only_its_bastion_reaches_through_an_ssh_config_alias(
    behind: Behind,
) -> None:
    assert refuses("127.0.0.1", behind.b.node_port)  # directly, the node is not there
    behind.known_hosts.write_text(behind.bastion_line + behind.node_line)
    code, doc, err = behind.status()
    assert code == 0, err
    nodes = doc["nodes"]
    assert isinstance(nodes, list)
    assert [(n["name"], n["reach"]) for n in nodes] == [("lab-02", "ok")]


def test_one_bastion_connection_carries_every_node_behind_it(behind: Behind) -> None:
    behind.known_hosts.write_text(behind.bastion_line + behind.node_line)
    with SshTransport(
        own_known_hosts=behind.known_hosts, system_known_hosts=(), ssh_config=behind.ssh_config
    ) as transport:
        for name, alias in (("a", "lab-02-behind"), ("b", "lab-02-again"), ("a", "lab-02-behind")):
            node = NodeSpec(name=name, host=alias, port_set=False)
            assert transport.run(node, "echo $GPUCTL_LAB_NODE", timeout_s=10).stdout == b"lab-02\n"
        assert transport.connects == 3  # the bastion once, each node once


def test_an_unknown_bastion_key_is_refused_naming_the_bastion_until_trusted(
    behind: Behind,
) -> None:
    behind.known_hosts.write_text(behind.node_line)  # the node's key only
    code, doc, err = behind.status()
    assert code == 5, err
    (node,) = doc["nodes"]  # type: ignore[misc]
    assert node["reach"] == "host_key"
    assert (
        f"jump host bastion of lab-02 ([127.0.0.1]:{behind.b.port}): host key unknown"
        in (node["error"])
    )
    trusted = behind.trust()
    assert trusted.returncode == 0, trusted.stderr
    assert f"[127.0.0.1]:{behind.b.port}" in trusted.stdout
    assert behind.status()[0] == 0


def test_a_dead_bastion_reports_its_node_unreachable_in_one_line(behind: Behind) -> None:
    behind.known_hosts.write_text(behind.bastion_line + behind.node_line)
    assert behind.status()[0] == 0
    bastion.stop(behind.b)
    start = time.monotonic()
    code, doc, err = behind.status()
    assert time.monotonic() - start < 30
    (node,) = doc["nodes"]  # type: ignore[misc]
    assert code == 4, err  # every node unreachable
    assert node["reach"] in ("refused", "unreachable")
    assert "jump host bastion of lab-02" in node["error"]
    assert "\n" not in node["error"]
    assert "Traceback" not in err


def test_host_key_aliases_name_the_bastion_and_the_node_for_trust_and_the_poll_after(
    behind: Behind, tmp_path: Path
) -> None:
    """ssh_config's HostKeyAlias on both legs: `hosts trust` records each key under its alias
    (as `ssh` would), and the poll then verifies both keys under those names."""
    b = behind.b
    behind.ssh_config.write_text(
        f"Host keyed-bastion\n  HostName 127.0.0.1\n  Port {b.port}\n  User {b.user}\n"
        f"  IdentityFile {b.key_path}\n  HostKeyAlias the-bastion\n\n"
        f"Host keyed-node\n  HostName {b.node_addr}\n  Port {b.node_port}\n  User {b.user}\n"
        f"  IdentityFile {b.key_path}\n  ProxyJump keyed-bastion\n  HostKeyAlias The-Node\n"
    )
    behind.inventory.write_text(
        f"defaults: {{known_hosts: [{behind.known_hosts}]}}\n"
        "nodes:\n  - {name: lab-02, host: keyed-node}\n"
    )
    behind.known_hosts.write_text(behind.bastion_line + behind.node_line)  # [host]:port only
    code, doc, err = behind.status()
    assert code == 5, err
    (node,) = doc["nodes"]  # type: ignore[misc]
    assert "jump host keyed-bastion of lab-02 (the-bastion): host key unknown" in node["error"]

    behind.known_hosts.write_text("")
    trusted = behind.trust()
    assert trusted.returncode == 0, trusted.stderr
    bastion_key = " ".join(b.host_key_public.read_text().split()[:2])
    node_key = " ".join(behind.node_line.split()[1:3])
    assert behind.known_hosts.read_text() == (
        f"the-bastion {bastion_key}\nthe-node {node_key}\n"  # lowercased, as OpenSSH
    )
    code, doc, err = behind.status()
    assert code == 0, err
    nodes = doc["nodes"]
    assert isinstance(nodes, list)
    assert [(n["name"], n["reach"]) for n in nodes] == [("lab-02", "ok")]
