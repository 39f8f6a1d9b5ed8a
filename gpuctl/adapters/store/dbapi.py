"""What the store's SQL runs on: the little of a DB-API connection both backends give.

SQL is written once with `?` placeholders (SQLite's); the PostgreSQL connection turns them into
psycopg's `%s` (`postgres.store.PgConn`). No SQL text of the store holds a literal `?` or `%`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol


class Cursor(Protocol):
    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...
