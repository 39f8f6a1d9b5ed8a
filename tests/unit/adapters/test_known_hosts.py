"""known_hosts: unknown, changed, hashed and `[host]:port` entries; what operators are told."""

import base64
import hashlib
import hmac
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpuctl.adapters.ssh import known_hosts as kh
from gpuctl.core.model import NodeSpec
from gpuctl.errors import ExitCode, HostKeyChanged, HostKeyUnknown

NODE = NodeSpec(name="gpu-07", host="10.0.0.7", port=2222)


def new_key() -> tuple[str, bytes]:
    """A fresh ed25519 public key as (known_hosts base64, blob)."""
    public = Ed25519PrivateKey.generate().public_key()
    line = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    b64 = line.decode().split()[1]
    return b64, base64.b64decode(b64)


def hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def ssh_keygen_fingerprint(tmp_path: Path, b64: str) -> str:
    pub = tmp_path / "k.pub"
    pub.write_text(f"ssh-ed25519 {b64}\n")
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()[1]


def recorded_for(tmp_path: Path, text: str, node: NodeSpec = NODE) -> tuple[kh.KnownKey, ...]:
    path = tmp_path / "known_hosts"
    path.write_text(text)
    return kh.KnownHostsFiles().for_host([path], kh.host_key_name(node.host, node.port))


def test_fingerprint_is_the_one_ssh_keygen_prints(tmp_path: Path) -> None:
    b64, blob = new_key()
    assert kh.fingerprint_of(blob) == ssh_keygen_fingerprint(tmp_path, b64)


def test_unknown_host_names_host_key_type_fingerprint_and_the_trust_command(
    tmp_path: Path,
) -> None:
    b64, blob = new_key()
    with pytest.raises(HostKeyUnknown) as err:
        kh.check(NODE, recorded_for(tmp_path, ""), "ssh-ed25519", blob)
    message = err.value.message
    assert "gpu-07 ([10.0.0.7]:2222)" in message
    assert f"ssh-ed25519 {ssh_keygen_fingerprint(tmp_path, b64)}" in message
    assert err.value.hint is not None and "gpuctl hosts trust gpu-07" in err.value.hint
    assert err.value.exit_code is ExitCode.HOST_KEY
    assert err.value.reach == "host_key"


def test_changed_key_names_both_fingerprints_and_the_file_line_of_the_old_one(
    tmp_path: Path,
) -> None:
    old_b64, old_blob = new_key()
    _, new_blob = new_key()
    text = f"# fleet\nother ssh-ed25519 {new_key()[0]}\n[10.0.0.7]:2222 ssh-ed25519 {old_b64}\n"
    with pytest.raises(HostKeyChanged) as err:
        kh.check(NODE, recorded_for(tmp_path, text), "ssh-ed25519", new_blob)
    message = err.value.message
    assert kh.fingerprint_of(new_blob) in message
    assert kh.fingerprint_of(old_blob) in message
    assert f"{tmp_path / 'known_hosts'}:3" in message
    assert err.value.hint is not None and "gpuctl hosts trust --replace gpu-07" in err.value.hint


def test_a_host_recorded_only_with_another_key_type_counts_as_changed(tmp_path: Path) -> None:
    old_b64, _ = new_key()
    _, offered = new_key()
    recorded = recorded_for(tmp_path, f"[10.0.0.7]:2222 ecdsa-sha2-nistp256 {old_b64}\n")
    with pytest.raises(HostKeyChanged):
        kh.check(NODE, recorded, "ssh-ed25519", offered)


def test_the_matching_key_is_trusted_and_names_where_it_is(tmp_path: Path) -> None:
    b64, blob = new_key()
    entry = kh.check(
        NODE, recorded_for(tmp_path, f"[10.0.0.7]:2222 ssh-ed25519 {b64}\n"), "ssh-ed25519", blob
    )
    assert entry.where == f"{tmp_path / 'known_hosts'}:1"


def test_hashed_entries_are_matched(tmp_path: Path) -> None:
    b64, blob = new_key()
    text = f"{hashed('[10.0.0.7]:2222')} ssh-ed25519 {b64}\n"
    assert kh.check(NODE, recorded_for(tmp_path, text), "ssh-ed25519", blob).line == 1


def test_hashed_entry_for_another_host_does_not_match(tmp_path: Path) -> None:
    b64, blob = new_key()
    text = f"{hashed('[10.0.0.8]:2222')} ssh-ed25519 {b64}\n"
    with pytest.raises(HostKeyUnknown):
        kh.check(NODE, recorded_for(tmp_path, text), "ssh-ed25519", blob)


def test_ssh_keygen_hashed_file_is_read(tmp_path: Path) -> None:
    b64, blob = new_key()
    path = tmp_path / "known_hosts"
    path.write_text(f"[10.0.0.7]:2222 ssh-ed25519 {b64}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], capture_output=True, check=True)
    assert path.read_text().startswith("|1|")
    recorded = kh.KnownHostsFiles().for_host([path], "[10.0.0.7]:2222")
    assert kh.check(NODE, recorded, "ssh-ed25519", blob).line == 1


def test_a_plain_host_entry_does_not_cover_another_port(tmp_path: Path) -> None:
    b64, blob = new_key()
    with pytest.raises(HostKeyUnknown):
        kh.check(NODE, recorded_for(tmp_path, f"10.0.0.7 ssh-ed25519 {b64}\n"), "ssh-ed25519", blob)


def test_port_22_uses_the_bare_host_name(tmp_path: Path) -> None:
    node = NodeSpec(name="gpu-07", host="10.0.0.7")
    b64, blob = new_key()
    recorded = recorded_for(tmp_path, f"gpu-x,10.0.0.7 ssh-ed25519 {b64}\n", node)
    assert kh.check(node, recorded, "ssh-ed25519", blob).line == 1


def test_wildcards_and_negation_follow_openssh(tmp_path: Path) -> None:
    assert kh.hosts_match("10.0.0.*", "10.0.0.7")
    assert kh.hosts_match("10.0.0.?", "10.0.0.7")
    assert not kh.hosts_match("10.0.0.*,!10.0.0.7", "10.0.0.7")
    assert kh.hosts_match("GPU-07.example", "gpu-07.example")
    # brackets are literal, not a character class
    assert not kh.hosts_match("[10.0.0.7]:2222", "1")
    assert kh.hosts_match("[10.0.0.7]:2222", "[10.0.0.7]:2222")


def test_comments_markers_and_broken_lines_are_skipped(tmp_path: Path) -> None:
    b64, _ = new_key()
    text = (
        f"# comment\n\n@cert-authority *.example ssh-ed25519 {b64}\n"
        "[10.0.0.7]:2222 ssh-ed25519 not-base64!!\nonly-two fields\n"
        f"[10.0.0.7]:2222 ssh-ed25519 {b64}\n"
    )
    assert [k.line for k in recorded_for(tmp_path, text)] == [6]


def test_a_missing_file_trusts_nothing(tmp_path: Path) -> None:
    assert kh.KnownHostsFiles().for_host([tmp_path / "absent"], "x") == ()


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    files = kh.KnownHostsFiles()
    path = tmp_path / "known_hosts"
    path.write_text("")
    assert files.for_host([path], "[10.0.0.7]:2222") == ()
    b64, _ = new_key()
    path.write_text(f"[10.0.0.7]:2222 ssh-ed25519 {b64}\n")
    assert len(files.for_host([path], "[10.0.0.7]:2222")) == 1


def test_record_writes_a_bracketed_entry_in_a_private_file(tmp_path: Path) -> None:
    b64, blob = new_key()
    path = tmp_path / "state" / "known_hosts"
    kh.record(path, "10.0.0.7", 2222, "ssh-ed25519", blob)
    assert path.read_text() == f"[10.0.0.7]:2222 ssh-ed25519 {b64}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_record_on_port_22_writes_the_bare_host(tmp_path: Path) -> None:
    b64, blob = new_key()
    path = tmp_path / "known_hosts"
    kh.record(path, "gpu-07.example", 22, "ssh-ed25519", blob)
    assert path.read_text() == f"gpu-07.example ssh-ed25519 {b64}\n"


def test_record_with_replace_drops_the_old_entries_for_that_host_only(tmp_path: Path) -> None:
    old_b64, _ = new_key()
    other_b64, _ = new_key()
    new_b64, new_blob = new_key()
    path = tmp_path / "known_hosts"
    path.write_text(
        f"{hashed('[10.0.0.7]:2222')} ssh-ed25519 {old_b64}\n"
        f"[10.0.0.8]:2222 ssh-ed25519 {other_b64}\n"
        f"[10.0.0.7]:2222 ssh-ed25519 {old_b64}"  # no final newline
    )
    kh.record(path, "10.0.0.7", 2222, "ssh-ed25519", new_blob, replace=True)
    assert path.read_text() == (
        f"[10.0.0.8]:2222 ssh-ed25519 {other_b64}\n[10.0.0.7]:2222 ssh-ed25519 {new_b64}\n"
    )


def test_recorded_key_types_are_preferred_in_negotiation(tmp_path: Path) -> None:
    b64, _ = new_key()
    recorded = recorded_for(tmp_path, f"[10.0.0.7]:2222 ssh-rsa {b64}\n")
    available = ["ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256"]
    assert kh.preferred_key_types(recorded, available) == [
        "rsa-sha2-512",
        "rsa-sha2-256",
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
    ]
    assert kh.preferred_key_types((), available) == available
