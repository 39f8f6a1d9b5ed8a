"""The HTTP endpoint: the latest exposition on any path, written once per reading.

prometheus_client's server would rebuild the exposition on every scrape from its registry; gpuctl
writes the per-GPU and per-job families itself (`_text`), so it serves bytes: the text format
0.0.4 (what `generate_latest` writes and every Prometheus accepts), gzip when the scraper asks for
it (Prometheus does), each made at most once per reading.
"""

from __future__ import annotations

import gzip
import http.server
import socket
import threading
from collections.abc import Callable

from gpuctl.errors import GpuctlError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Cached:
    """The exposition of the latest reading, plain and gzipped, made on the first scrape."""

    def __init__(self, render: Callable[[], tuple[object, bytes]]) -> None:
        self._render = render  # -> (the reading it is of, its exposition)
        self._lock = threading.Lock()
        self._key: object = None
        self._plain = b""
        self._gzipped: bytes | None = None

    def body(self, gzipped: bool) -> bytes:
        with self._lock:  # a burst of scrapes renders once
            key, plain = self._render()
            if key is not self._key or key is None:
                self._key, self._plain, self._gzipped = key, plain, None
            if not gzipped:
                return self._plain
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._plain, compresslevel=1)
            return self._gzipped


def _handler(cached: _Cached) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            body = cached.body(gzipped)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape would drown the refresh lines on stderr

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def serve(
    address: str, port: int, render: Callable[[], tuple[object, bytes]]
) -> tuple[http.server.ThreadingHTTPServer, threading.Thread]:
    """Listen on `address:port` (0: a free port) in a thread of its own."""
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as exc:
        raise GpuctlError(
            f"cannot listen on {address}:{port}: {exc.strerror or exc}",
            hint="pick another --port or --address",
        ) from None
    server_class = type("Server", (_Server,), {"address_family": family})
    try:
        httpd = server_class((address, port), _handler(_Cached(render)))
    except OSError as exc:
        raise GpuctlError(
            f"cannot listen on {address}:{port}: {exc.strerror or exc}",
            hint="pick another --port or --address",
        ) from None
    thread = threading.Thread(target=httpd.serve_forever, name="gpuctl-metrics", daemon=True)
    thread.start()
    return httpd, thread
