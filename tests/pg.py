"""A real PostgreSQL server for the tests: Debian's `postgresql` (initdb and postgres from
/usr/lib/postgresql/*/bin), in a temporary folder, as the unprivileged system user `gpuctl-pg`
when the tests run as root, listening on a unix socket only (no TCP). One server per session;
each test that asks for `pg_url` gets a fresh, empty database on it.

Missing binaries fail the tests with the command that installs them (`make deps`): a store test
that quietly skipped its PostgreSQL half would prove nothing."""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.postgres import open_url
from gpuctl.testing.memstore import MemoryStore

PG_USER = "gpuctl-pg"  # the system user the server runs as (when the tests run as root)
ROLE = "gpuctl"  # the database superuser initdb creates
START_DEADLINE_S = 60.0


def bin_dir() -> Path:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    if not found:
        pytest.fail(
            "PostgreSQL's server is not installed (no /usr/lib/postgresql/*/bin/postgres): "
            "run `make deps` (it installs Debian's postgresql)",
            pytrace=False,
        )
    return Path(found[-1]).parent


def _as_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["/usr/sbin/useradd", "--system", "--user-group", "--no-create-home", PG_USER],
            check=True,
            capture_output=True,
        )
    return ["/usr/sbin/runuser", "-u", PG_USER, "--"]


class Server:
    """A running server; `url(db)` names a database on it; `restart()` stops it (fast: clients
    are disconnected, open transactions rolled back) and starts it again on the same data."""

    def __init__(self, root: Path, command: list[str], log: Path) -> None:
        self.root = root
        self.socket_dir = root
        self.command = command
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                self.admin().close()
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"PostgreSQL did not start: {self.log.read_text(errors='replace')[-2000:]}",
                        pytrace=False,
                    )
                time.sleep(0.05)

    def stop(self, *, fast: bool = False) -> None:
        """Stop the server: at once (fast: SIGINT to the postmaster, which `runuser` does not
        pass on) or by SIGTERM (smart shutdown would wait on the tests' open connections)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        if fast:
            pid_file = self.root / "data" / "postmaster.pid"
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
        else:
            proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop(fast=True)
        self.start()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{ROLE}@/{database}?host={self.socket_dir}"

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url(), autocommit=True)

    def fresh_database(self) -> str:
        name = f"t{os.getpid()}_{next(self._names)}"
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0 STRATEGY FILE_COPY')
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def running_server() -> Iterator[Server]:
    pg_bin = bin_dir()
    runas = _as_user()
    root = Path(tempfile.mkdtemp(prefix="gpuctl-pg-"))
    if runas:
        shutil.chown(root, PG_USER, PG_USER)
    data = root / "data"
    log = root / "server.log"
    started: Server | None = None
    try:
        done = subprocess.run(
            [
                *runas,
                str(pg_bin / "initdb"),
                "-D",
                str(data),
                "-U",
                ROLE,
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"initdb failed: {done.stderr.decode(errors='replace')}", pytrace=False)
        server = Server(
            root,
            [
                *runas,
                str(pg_bin / "postgres"),
                "-D",
                str(data),
                "-k",
                str(root),
                "-c",
                "listen_addresses=",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "max_connections=200",
            ],
            log,
        )
        started = server
        server.start()
        yield server
    finally:
        if started is not None:
            started.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    with running_server() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: Server) -> Iterator[str]:
    """A fresh, empty database on the session's server."""
    name = pg_server.fresh_database()
    yield pg_server.url(name)
    pg_server.drop_database(name)


STORES = ["memory", "sqlite", "postgresql"]  # the `store` fixtures of the store-agnostic tests


def open_test_store(request: pytest.FixtureRequest, state_dir: Path) -> Store:
    """The store `request.param` names (one of `STORES`), opened for writing: the in-memory
    one, SQLite in `state_dir`, or PostgreSQL on a fresh database of the session's server."""
    if request.param == "memory":
        return MemoryStore()
    if request.param == "postgresql":
        return open_url(request.getfixturevalue("pg_url"), write=True)
    return open_store(state_dir, write=True)
