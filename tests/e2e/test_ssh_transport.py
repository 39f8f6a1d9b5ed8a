"""The SSH transport against real sshd on loopback: results, deadlines, failures, quoting."""

import dataclasses
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpuctl.adapters.ssh import PhaseTimeout, SshTransport
from gpuctl.errors import (
    AuthFailed,
    ConnectRefused,
    HostKeyChanged,
    HostKeyUnknown,
    TransportError,
    TransportTimeout,
)
from gpuctl.lab.sshd import generate_ed25519
from gpuctl.testing.lab import LabFleet

pytestmark = pytest.mark.e2e


def fingerprint(pub: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()[1]


def live_processes_with(text: str) -> list[int]:
    """Processes (not zombies) whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(int(entry.name))
    return found


def test_a_command_returns_its_exit_code_stdout_and_stderr(
    lab: LabFleet, transport: SshTransport
) -> None:
    result = transport.run(lab.spec("lab-01"), "echo out; echo err >&2; exit 3", timeout_s=10)
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert result.truncated is False
    ok = transport.run(lab.spec("lab-01"), "true", timeout_s=10)
    assert (ok.exit_code, ok.stdout, ok.stderr) == (0, b"", b"")


def test_the_node_environment_comes_from_the_lab(lab: LabFleet, transport: SshTransport) -> None:
    result = transport.run(lab.spec("lab-02"), 'printf %s "$GPUCTL_LAB_NODE"', timeout_s=10)
    assert result.stdout == b"lab-02"


def test_the_command_reads_no_stdin(lab: LabFleet, transport: SshTransport) -> None:
    result = transport.run(lab.spec("lab-01"), "cat; echo done", timeout_s=5)
    assert result.stdout == b"done\n"


def test_output_is_capped_and_marked_truncated(lab: LabFleet, transport: SshTransport) -> None:
    result = transport.run(
        lab.spec("lab-01"), "head -c 1000000 /dev/zero", timeout_s=10, max_output_bytes=4096
    )
    assert result.truncated is True
    assert result.stdout == b"\0" * 4096


def test_the_connection_is_reused_between_calls(lab: LabFleet, transport: SshTransport) -> None:
    log = lab.lab.log_path("lab-03")
    before = log.read_text().count("Accepted publickey")
    for _ in range(5):
        assert transport.run(lab.spec("lab-03"), "echo x", timeout_s=10).stdout == b"x\n"
    assert log.read_text().count("Accepted publickey") == before + 1
    assert transport.connects == 1


def test_concurrent_calls_to_one_node_respect_the_per_host_limit(lab: LabFleet) -> None:
    with SshTransport(
        own_known_hosts=Path("/nonexistent/known_hosts"), system_known_hosts=(), per_host_limit=2
    ) as transport:
        spans: list[tuple[int, int]] = []
        command = "date +%s%N; sleep 0.2; date +%s%N"

        def one() -> None:
            out = transport.run(lab.spec("lab-02"), command, timeout_s=10).stdout.split()
            spans.append((int(out[0]), int(out[1])))

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(spans) == 6
    peak = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert peak == 2
    assert transport.connects == 1


def test_a_command_past_its_deadline_is_killed_on_the_node(
    lab: LabFleet, transport: SshTransport
) -> None:
    marker = f"30{os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    start = time.monotonic()
    with pytest.raises(TransportTimeout) as err:
        transport.run(lab.spec("lab-01"), f"sleep {marker}", timeout_s=1.0)
    assert time.monotonic() - start < 2.5
    assert isinstance(err.value, PhaseTimeout) and err.value.phase == "read"
    assert "killed on the node" in err.value.message
    # SIGKILL was sent before run() returned; the kernel finishes the process a moment later
    deadline = time.monotonic() + 2
    while live_processes_with(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert live_processes_with(f"sleep {marker}") == []
    # the connection is still good
    assert transport.run(lab.spec("lab-01"), "echo ok", timeout_s=5).stdout == b"ok\n"


def test_a_frozen_sshd_times_out_within_the_connect_deadline(
    own_lab: LabFleet, transport: SshTransport
) -> None:
    own_lab.freeze("lab-01")
    start = time.monotonic()
    with pytest.raises(TransportTimeout) as err:
        transport.run(own_lab.spec("lab-01", connect_timeout_s=1.0), "true", timeout_s=5)
    assert time.monotonic() - start < 1.8
    assert "timeout (connect)" in err.value.message
    assert err.value.reach == "timeout"


def test_a_node_frozen_under_a_warm_connection_times_out_within_the_deadline(
    own_lab: LabFleet, transport: SshTransport
) -> None:
    spec = own_lab.spec("lab-02")
    assert transport.run(spec, "echo warm", timeout_s=5).stdout == b"warm\n"
    own_lab.freeze("lab-02")
    start = time.monotonic()
    with pytest.raises(TransportTimeout) as err:
        transport.run(spec, "true", timeout_s=1.0)
    assert time.monotonic() - start < 1.8
    assert "timeout (exec)" in err.value.message


def test_a_killed_node_is_refused_and_found_again_once_revived(
    own_lab: LabFleet, transport: SshTransport
) -> None:
    spec = own_lab.spec("lab-01")
    assert transport.run(spec, "echo up", timeout_s=5).stdout == b"up\n"
    own_lab.kill("lab-01")
    with pytest.raises(ConnectRefused) as err:
        transport.run(spec, "true", timeout_s=5)
    assert "connection refused" in err.value.message
    assert err.value.reach == "refused"
    own_lab.revive("lab-01")
    assert transport.run(spec, "echo back", timeout_s=5).stdout == b"back\n"
    assert transport.connects == 2


def test_a_key_the_node_does_not_accept_is_an_auth_failure(
    lab: LabFleet, transport: SshTransport, tmp_path: Path
) -> None:
    other = tmp_path / "other_key"
    generate_ed25519(other, "not-authorized")
    with pytest.raises(AuthFailed) as err:
        transport.run(lab.spec("lab-01", key_file=str(other)), "true", timeout_s=5)
    assert "authentication failed" in err.value.message
    assert f"user {lab.lab.user}" in err.value.message
    assert err.value.reach == "auth_failed"


def test_a_private_key_others_can_read_is_refused_before_connecting(
    lab: LabFleet, transport: SshTransport, tmp_path: Path
) -> None:
    loose = tmp_path / "loose_key"
    loose.write_bytes(lab.lab.key_path.read_bytes())
    loose.chmod(0o644)
    with pytest.raises(TransportError) as err:
        transport.run(lab.spec("lab-01", key_file=str(loose)), "true", timeout_s=5)
    assert "readable by others (mode 644)" in err.value.message
    assert err.value.hint == f"chmod 600 {loose}"
    assert transport.connects == 0


def test_an_unknown_host_key_is_an_error_with_its_fingerprint(
    lab: LabFleet, transport: SshTransport
) -> None:
    spec = lab.spec("lab-02", known_hosts=())
    with pytest.raises(HostKeyUnknown) as err:
        transport.run(spec, "true", timeout_s=5)
    expected = fingerprint(lab.host_key_public("lab-02"))
    assert f"host key unknown: ssh-ed25519 {expected}" in err.value.message
    assert err.value.hint is not None and "gpuctl hosts trust lab-02" in err.value.hint


def test_a_changed_host_key_names_both_fingerprints(
    lab: LabFleet, transport: SshTransport, tmp_path: Path
) -> None:
    node = lab.lab.node("lab-03")
    impostor_pub = generate_ed25519(tmp_path / "impostor", "impostor").split()[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"# old\n[{node.host}]:{node.port} ssh-ed25519 {impostor_pub}\n")
    with pytest.raises(HostKeyChanged) as err:
        transport.run(lab.spec("lab-03", known_hosts=(str(known),)), "true", timeout_s=5)
    message = err.value.message
    assert fingerprint(lab.host_key_public("lab-03")) in message
    assert fingerprint(tmp_path / "impostor.pub") in message
    assert f"{known}:2" in message
    assert err.value.reach == "host_key"


def alias_config(tmp_path: Path, lab: LabFleet, name: str) -> Path:
    """ssh_config: `gpu-alias` dials the lab node by HostName and Port; its key is named
    `gpu-key` (HostKeyAlias)."""
    node = lab.lab.node(name)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu-alias\n  HostName {node.host}\n  Port {node.port}\n  HostKeyAlias gpu-key\n"
    )
    return config


def test_a_node_whose_key_is_recorded_under_its_host_key_alias_is_reached(
    lab: LabFleet, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    key = " ".join(lab.host_key_public("lab-01").read_text().split()[:2])
    known.write_text(f"gpu-key {key}\n")  # as `ssh gpu-alias` records it: no [..]:port
    spec = lab.spec("lab-01", host="gpu-alias", port_set=False, known_hosts=(str(known),))
    config = alias_config(tmp_path, lab, "lab-01")
    with SshTransport(own_known_hosts=known, system_known_hosts=(), ssh_config=config) as t:
        assert t.run(spec, "echo $GPUCTL_LAB_NODE", timeout_s=10).stdout == b"lab-01\n"


def test_with_a_host_key_alias_a_key_recorded_under_host_and_port_is_unknown(
    lab: LabFleet, tmp_path: Path
) -> None:
    """As OpenSSH: the alias is the only name looked up (no fallback to `[host]:port`)."""
    node = lab.lab.node("lab-02")
    known = tmp_path / "known_hosts"
    key = " ".join(lab.host_key_public("lab-02").read_text().split()[:2])
    known.write_text(f"[{node.host}]:{node.port} {key}\n")
    spec = lab.spec("lab-02", host="gpu-alias", port_set=False, known_hosts=(str(known),))
    config = alias_config(tmp_path, lab, "lab-02")
    with (
        SshTransport(own_known_hosts=known, system_known_hosts=(), ssh_config=config) as t,
        pytest.raises(HostKeyUnknown) as err,
    ):
        t.run(spec, "true", timeout_s=10)
    expected = fingerprint(lab.host_key_public("lab-02"))
    assert err.value.message == f"lab-02 (gpu-key): host key unknown: ssh-ed25519 {expected}"


HOSTILE = (
    "job; touch {canary}",
    "$(touch {canary})",
    "`touch {canary}`",
    'it\'s "quoted" $(touch {canary})',
    "line one\ntouch {canary}\n",
    "-n; touch {canary} #",
    "a\\'b; touch {canary}",
)


@pytest.mark.parametrize("template", HOSTILE)
def test_quoted_names_and_arguments_never_run_anything(
    lab: LabFleet, transport: SshTransport, template: str
) -> None:
    canary = lab.lab.node_dir("lab-01") / "home" / "canary"
    value = template.format(canary=canary)
    command = shlex.join(["printf", "%s", value])
    show = shlex.quote('printf %s "$JOB_NAME"')
    env_command = f"env JOB_NAME={shlex.quote(value)} sh -c {show}"
    assert transport.run(lab.spec("lab-01"), command, timeout_s=5).stdout == value.encode()
    assert transport.run(lab.spec("lab-01"), env_command, timeout_s=5).stdout == value.encode()
    assert not canary.exists()


def test_failures_print_nothing_on_stderr(
    own_lab: LabFleet, transport: SshTransport, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other_key"
    generate_ed25519(other, "not-authorized")
    spec = own_lab.spec("lab-01", connect_timeout_s=1.0)
    failing = [
        dataclasses.replace(spec, name="wrong-key", key_file=str(other)),
        dataclasses.replace(spec, name="unknown-key", known_hosts=()),
    ]
    for node in failing:
        with pytest.raises(TransportError):
            transport.run(node, "true", timeout_s=2)
    own_lab.freeze("lab-01")
    with pytest.raises(TransportTimeout):
        transport.run(spec, "true", timeout_s=1)
    own_lab.thaw("lab-01")
    own_lab.kill("lab-02")
    with pytest.raises(ConnectRefused):
        transport.run(own_lab.spec("lab-02"), "true", timeout_s=1)
    captured = capfd.readouterr()
    assert captured.err == ""
    assert captured.out == ""
