"""Private keys from the inventory's `key_file`: a key that needs a passphrase is an auth error
naming the file and the way out, never a TypeError from the crypto library."""

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from gpuctl.adapters.ssh._keys import KeyCache
from gpuctl.core.model import NodeSpec
from gpuctl.errors import AuthFailed, ExitCode


def write_key(path: Path, fmt: str, passphrase: bytes | None) -> Path:
    key = (
        ed25519.Ed25519PrivateKey.generate()
        if fmt == "openssh"
        else rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    private_format = {
        "openssh": serialization.PrivateFormat.OpenSSH,
        "pem": serialization.PrivateFormat.TraditionalOpenSSL,
        "pkcs8": serialization.PrivateFormat.PKCS8,
    }[fmt]
    encryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, private_format, encryption))
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("fmt", ["openssh", "pem", "pkcs8"])
def test_a_key_with_a_passphrase_is_an_auth_error_naming_the_file_and_the_fix(
    tmp_path: Path, fmt: str
) -> None:
    key = write_key(tmp_path / "id_key", fmt, b"correct horse")
    with pytest.raises(AuthFailed) as err:
        KeyCache().load(NodeSpec(name="gpu01", host="gpu01", key_file=str(key)))
    assert str(err.value) == (
        f"gpu01: key_file {key} needs a passphrase, which gpuctl never asks for: load it into "
        "ssh-agent and drop key_file, or use a key without a passphrase"
    )
    assert err.value.hint == (
        f"ssh-add {key}, then remove key_file from the inventory; or a key without a passphrase "
        "that only you can read (chmod 600)"
    )
    assert (err.value.reach, err.value.exit_code) == ("auth_failed", ExitCode.ERROR)


def test_a_key_without_a_passphrase_loads(tmp_path: Path) -> None:
    key = write_key(tmp_path / "id_key", "openssh", None)
    assert KeyCache().load(NodeSpec(name="gpu01", host="gpu01", key_file=str(key))) is not None


def test_root_is_never_the_login_user_by_default_not_even_when_gpuctl_runs_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuctl.adapters.ssh import SshTransport

    monkeypatch.setenv("LOGNAME", "root")  # getpass.getuser() reads it first: gpuctl run by root
    unnamed = NodeSpec(name="n1", host="127.0.0.1", port=9, connect_timeout_s=0.5)
    with SshTransport(own_known_hosts=tmp_path / "kh", system_known_hosts=()) as ssh:
        with pytest.raises(AuthFailed, match="would log in as root") as raised:
            ssh.run(unnamed, "true", timeout_s=1.0)  # refused before any connection is tried
        assert raised.value.exit_code is ExitCode.ERROR
        assert ssh.connects == 0
    from gpuctl.adapters.ssh import login_user

    assert login_user(NodeSpec(name="n1", host="h", allow_root=True)) == "root"
    with pytest.raises(AuthFailed, match="would log in as root"):
        login_user(NodeSpec(name="n1", host="h", user="root"))
    monkeypatch.setenv("LOGNAME", "ops")
    assert login_user(unnamed) == "ops"
