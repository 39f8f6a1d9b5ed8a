"""`--state-url` / `GPUCTL_STATE_URL`: which PostgreSQL database holds the state, checked and
shown without secrets. Pure (no psycopg): the CLI checks and prints URLs without loading it.

A password never travels in the URL (it would sit in shell history, `ps` and logs): libpq reads
it from its passfile (`~/.pgpass`, or the file `PGPASSFILE` names) or a service
(`postgresql:///?service=NAME`, `pg_service.conf`)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from gpuctl.errors import UsageError

SCHEMES = ("postgresql", "postgres")
PASSFILE_HINT = (
    "put the password in ~/.pgpass (or the file PGPASSFILE names, mode 0600) as "
    "host:port:database:user:password, or name a service from pg_service.conf "
    "(postgresql:///?service=NAME), and give the URL without it"
)


def check(url: str, *, where: str = "--state-url") -> str:
    """`url` if it is a PostgreSQL URL without a password; UsageError naming `where` otherwise
    (the message never repeats the password)."""
    text = url.strip()
    try:
        parts = urlsplit(text)
        _ = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise UsageError(f"{where}: not a PostgreSQL URL: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise UsageError(
            f"{where}: {redact(text)!r} is not a PostgreSQL URL",
            hint="give postgresql://user@host:port/database or "
            "postgresql:///database?host=/socket/dir",
        )
    if parts.password is not None or any(k == "password" for k, _ in _query(parts.query)):
        raise UsageError(
            f"{where}: the URL carries a password; gpuctl takes none on a command line or in "
            "its environment",
            hint=PASSFILE_HINT,
        )
    return text


def redact(url: str) -> str:
    """The URL with any password removed (from the user part and the query)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, host = netloc.rsplit("@", 1)
            netloc = f"{user.split(':', 1)[0]}@{host}"
        query = parts.query
        if any(k == "password" for k, _ in _query(query)):
            kept = [(k, v) for k, v in _query(query) if k != "password"]
            query = urlencode(kept, safe="/")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<a URL that cannot be read>"


def describe(url: str) -> str:
    """Where the server is, for messages: `host:port/database`, `socket /dir, database d`, or
    `service s` (never a password)."""
    try:
        parts = urlsplit(url)
        query = dict(_query(parts.query))
        host = parts.hostname or query.get("host") or ""
        port = parts.port or query.get("port")
    except ValueError:
        return redact(url)
    database = parts.path.lstrip("/") or query.get("dbname") or ""
    if "service" in query and not host:
        return f"PostgreSQL service {query['service']}" + (
            f", database {database}" if database else ""
        )
    if not host or host.startswith("/"):
        where = f"the local socket{f' in {host}' if host else ''}"
        return f"PostgreSQL on {where}" + (f", database {database}" if database else "")
    return f"PostgreSQL at {host}{f':{port}' if port else ''}" + (
        f"/{database}" if database else ""
    )


def _query(query: str) -> list[tuple[str, str]]:
    return parse_qsl(query, keep_blank_values=True)
