"""How the state store is opened: a `StoreOpener` (the SQLite store of a state folder by default,
the PostgreSQL database of `--state-url` / `GPUCTL_STATE_URL` when one is given; a test injects
its own through the CLI's `AppContext`), and over it a `SessionStore` that a long-lived service
calls for one read or one write at a time: opened per use, or, for the dashboard, one read-only
connection kept open (`KeptStore`, SQLite's).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from gpuctl.adapters.protocols import Store
from gpuctl.errors import StateError

if TYPE_CHECKING:
    from gpuctl.adapters.store.memo import MemoStore

SessionStore = Callable[[bool], AbstractContextManager[Store]]  # (write) -> the store, closed after


class StoreOpener(Protocol):
    """The store of `state_dir`. `write=False`: read-only, creating nothing (a folder without a
    store reads as empty); `write=True`: created on first use, failing closed (`StateError`)."""

    def __call__(self, state_dir: Path, *, write: bool) -> Store: ...


def open_sqlite(state_dir: Path, *, write: bool) -> Store:
    """The SQLite store of `state_dir` (`gpuctl.adapters.store.open_store`), imported on use."""
    from gpuctl.adapters.store import open_store

    return open_store(state_dir, write=write)


STATE_URL_ENV = "GPUCTL_STATE_URL"


def state_url(env: Mapping[str, str], override: str | None = None) -> str | None:
    """`--state-url`, else `GPUCTL_STATE_URL`, checked (a PostgreSQL URL, no password in it:
    `UsageError` naming where it came from); None: the SQLite store of the state folder."""
    from gpuctl.adapters.store.postgres.url import check

    if override:
        return check(override, where="--state-url")
    if env.get(STATE_URL_ENV):
        return check(env[STATE_URL_ENV], where=STATE_URL_ENV)
    return None


def url_opener(url: str) -> StoreOpener:
    """The PostgreSQL store at `url` (the state folder is not where it lives)."""

    def open_url(state_dir: Path, *, write: bool) -> Store:
        from gpuctl.adapters.store.postgres import open_url

        return open_url(url, write=write)

    return open_url


def per_use(open_store: StoreOpener, state_dir: Path) -> SessionStore:
    """Open the store of `state_dir` for one read or one write, closed after."""

    @contextlib.contextmanager
    def opener(write: bool) -> Iterator[Store]:
        store = open_store(state_dir, write=write)
        try:
            yield store
        finally:
            store.close()

    return opener


class KeptStore:
    """A `SessionStore` for the dashboard: reads go through one read-only SQLite connection kept
    open, whose reads are remembered until the database changes (`adapters.store.memo.MemoStore`);
    each write opens the store for that write alone. `close()` closes the kept connection."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._kept: MemoStore | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, write: bool) -> Iterator[Store]:
        from gpuctl.adapters.store import open_store

        if write:
            with open_store(self.state_dir, write=True) as store:
                yield store
            return
        store = self._reader()
        try:
            yield store
        finally:
            if store is not self._kept:
                store.close()

    def _reader(self) -> MemoStore:
        from gpuctl.adapters.store.memo import MemoStore
        from gpuctl.adapters.store.opening import open_connection

        with self._lock:
            kept = self._kept
            if kept is not None:
                try:
                    if kept.still_current():
                        return kept
                except StateError:
                    pass
                self._kept = None
                kept.close()
            store = MemoStore(open_connection(self.state_dir, write=False))
            if not store.ephemeral:  # no database yet: look again next time
                self._kept = store
            return store

    def close(self) -> None:
        with self._lock:
            if self._kept is not None:
                self._kept.close()
                self._kept = None


def session(open_store: StoreOpener, state_dir: Path, *, kept: bool = False) -> SessionStore:
    """The store of `state_dir` for a long-lived service: `kept` (the dashboard) reads through
    one kept connection when the opener is SQLite's own (`open_sqlite`); any other opener (a
    test's) is opened per use."""
    if kept and open_store is open_sqlite:
        return KeptStore(state_dir)
    return per_use(open_store, state_dir)
