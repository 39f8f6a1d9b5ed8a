"""The one atomic file write: the old file or the new one, never a part; the mode asked for."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters import files


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old\n")
    files.write_atomic(path, '{"new": true}\n')
    assert path.read_text() == '{"new": true}\n'
    files.write_atomic(path, b"bytes\n")
    assert path.read_bytes() == b"bytes\n"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_a_crash_between_the_write_and_the_rename_leaves_the_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "health-history.json"
    path.write_text("the old history, whole\n")

    def crash(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="No space left"):
        files.write_atomic(path, "the new history " * 1000)
    assert path.read_text() == "the old history, whole\n"
    assert [p.name for p in tmp_path.iterdir()] == ["health-history.json"]


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("old entries\n")

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        files.write_atomic(path, "new entries\n")
    assert path.read_text() == "old entries\n"
    assert [p.name for p in tmp_path.iterdir()] == ["known_hosts"]


@pytest.mark.usefixtures("loose_umask")
def test_a_state_file_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "store.id"
    path.write_text("was readable by all\n")
    path.chmod(0o644)
    files.write_atomic(path, "private\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_file_gets_the_mode_asked_for_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        files.write_atomic(tmp_path / "lab.json", "{}\n", mode=0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "lab.json").stat().st_mode) == 0o644


def test_keep_owner_gives_the_new_file_the_old_files_owner_when_run_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    path.write_text("{}\n")
    st = path.stat()
    chowned: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "fchown", lambda fd, uid, gid: chowned.append((uid, gid)))
    files.write_atomic(path, "{}\n", mode=0o644)
    assert chowned == []  # not asked
    files.write_atomic(path, "{}\n", mode=0o644, keep_owner=True)
    assert chowned == [(st.st_uid, st.st_gid)]
