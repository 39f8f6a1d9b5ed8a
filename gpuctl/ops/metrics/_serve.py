"""The HTTP endpoint: the latest exposition on any path, built once per reading.

prometheus_client's server would rebuild the exposition on every scrape from its registry; gpuctl
writes the per-GPU and per-job families itself (`_text`), so it serves bytes: the text format
0.0.4 (what `generate_latest` writes and every Prometheus accepts), gzip when the scraper asks for
it (Prometheus does). The first scrape after a refresh builds the reading's exposition (and
gzips it, when asked), every other scrape of that reading sends the same bytes: at 1,000 nodes ×
8 GPUs, about 50 ms to build and 30 ms to gzip (`benchmarks/metrics_scrape.py`), then nothing.
The exposition is kept as its pieces, never joined: 24 MB copied once less.

gzip is ISA-L's (python-isal), level 1: 4 times as fast as zlib's level 1 on the exposition, and
smaller (3.3 MB against 3.6 MB for 24 MB).
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from isal import isal_zlib

from gpuctl.errors import GpuctlError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GZIP_LEVEL = 1  # ISA-L's levels are 0-3; 1 and 2 cost and weigh about the same here
_NONE = object()
R = TypeVar("R")  # a reading


def gzip_parts(parts: Sequence[bytes]) -> bytes:
    """`parts` as one gzip stream, compressed piece by piece (no joined copy)."""
    packer = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, 16 + isal_zlib.MAX_WBITS)
    return b"".join([*map(packer.compress, parts), packer.flush()])


class _Cached(Generic[R]):
    """The exposition of the latest reading, plain and gzipped, each made on the first scrape
    that asks for it and kept until the reading changes."""

    def __init__(self, latest: Callable[[], R], build: Callable[[R], Sequence[bytes]]) -> None:
        self._latest = latest  # -> the reading now (compared by identity: readings are values)
        self._build = build  # a reading -> its exposition, in pieces
        self._lock = threading.Lock()
        self._key: object = _NONE
        self._plain: tuple[bytes, ...] = ()
        self._gzipped: bytes | None = None

    def body(self, gzipped: bool) -> tuple[bytes, ...]:
        """The pieces to send, in order."""
        with self._lock:  # a burst of scrapes builds once
            key = self._latest()
            if key is not self._key:
                self._key, self._plain, self._gzipped = key, tuple(self._build(key)), None
            if not gzipped:
                return self._plain
            if self._gzipped is None:
                self._gzipped = gzip_parts(self._plain)
            return (self._gzipped,)


def _handler(cached: _Cached[R]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            body = cached.body(gzipped)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(sum(map(len, body))))
            self.end_headers()
            self.wfile.writelines(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape would drown the refresh lines on stderr

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def serve(
    address: str,
    port: int,
    latest: Callable[[], R],
    build: Callable[[R], Sequence[bytes]],
) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    """Listen on `address:port` (0: a free port) in a thread of its own, serving the exposition
    `build` makes of the reading `latest` returns, once per reading."""
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as exc:
        raise GpuctlError(
            f"cannot listen on {address}:{port}: {exc.strerror or exc}",
            hint="pick another --port or --address",
        ) from None
    server_class = type("Server", (_Server,), {"address_family": family})
    try:
        httpd = server_class((address, port), _handler(_Cached(latest, build)))
    except OSError as exc:
        raise GpuctlError(
            f"cannot listen on {address}:{port}: {exc.strerror or exc}",
            hint="pick another --port or --address",
        ) from None
    thread = threading.Thread(target=httpd.serve_forever, name="gpuctl-metrics", daemon=True)
    thread.start()
    return httpd, thread
