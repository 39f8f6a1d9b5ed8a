"""Fixtures every test folder may use: the real PostgreSQL server (tests/pg.py)."""

from tests.pg import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]
