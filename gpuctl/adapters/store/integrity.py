"""The store's own health: SQLite's integrity and foreign-key checks, schema version, marker."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpuctl.adapters.store.opening import one_line, read_marker
from gpuctl.errors import StateError


def check(
    conn: sqlite3.Connection, path: Path, marker: Path | None, known_version: int
) -> list[str]:
    """Problems found, one line each (empty: healthy). Never raises for a damaged database."""
    problems: list[str] = []
    try:
        found = conn.execute("PRAGMA integrity_check").fetchall()
        problems += [f"integrity: {one_line(str(r[0]))}" for r in found if r[0] != "ok"]
        for table, rowid, parent, _ in conn.execute("PRAGMA foreign_key_check"):
            problems.append(f"{table} row {rowid} refers to a missing {parent} row")
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.Error as exc:
        return [*problems, f"{path}: {exc}"]
    version = int(meta.get("schema_version", "0"))
    if version > known_version:
        problems.append(
            f"schema version {version} is newer than this gpuctl knows ({known_version})"
        )
    if marker is not None:
        try:
            marker_id = read_marker(marker)
        except StateError as exc:
            problems.append(exc.message)
        else:
            if marker_id not in (None, meta.get("database_id")):
                problems.append(f"{marker} names database {marker_id}, not {path}")
    return problems
