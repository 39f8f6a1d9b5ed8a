"""The state store: SQLite in gpuctl's state folder, behind the `Store` protocol.

`open_store(state_dir, write=True)` for commands that change state (it creates the store on first
use and migrates an older schema); `write=False` for commands that only read (nothing is created:
a folder with no store yet reads as empty). Both fail closed with `StateError` on a store that
cannot be trusted.
"""

from __future__ import annotations

from pathlib import Path

from gpuctl.adapters.store.opening import DB_NAME, LOCK_NAME, MARKER_NAME, db_path
from gpuctl.adapters.store.schema import SCHEMA_VERSION
from gpuctl.adapters.store.sqlite import SqliteStore


def open_store(state_dir: Path, *, write: bool) -> SqliteStore:
    from gpuctl.adapters.store.opening import open_connection

    return SqliteStore(open_connection(state_dir, write=write))


__all__ = [
    "DB_NAME",
    "LOCK_NAME",
    "MARKER_NAME",
    "SCHEMA_VERSION",
    "SqliteStore",
    "db_path",
    "open_store",
]
