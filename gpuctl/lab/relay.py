"""A TCP relay for a lab node that lives in its own network namespace (`gpuctl lab partition`).

    python3 relay.py --listen-fd FD --to HOST:PORT [--tag TEXT]

It accepts connections on an inherited listening socket (bound to the node's loopback address in
the machine's own namespace) and forwards each one to HOST:PORT, reached from the namespace the
relay runs in: through the veth link into the node's namespace. When that link is down, new
connections get no answer and open ones stall, as across a real partition. `--tag` only marks
the process (the lab finds its relays by it).

Standard library only, no gpuctl import: it runs under any python3.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
from types import FrameType

CONNECT_TIMEOUT_S = 10.0
BUFFER = 65536


def _close(*socks: socket.socket) -> None:
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(BUFFER)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _close(src, dst)


def _serve(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=CONNECT_TIMEOUT_S)
    except OSError:
        _close(client)
        return
    upstream.settimeout(None)
    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
    _pump(upstream, client)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="TCP relay into a lab node's namespace")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--to", required=True, help="HOST:PORT")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    host, _, port = str(args.to).rpartition(":")
    target = (host, int(port))
    listener = socket.socket(fileno=args.listen_fd)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        try:
            client, _ = listener.accept()
        except InterruptedError:
            continue
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve, args=(client, target), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
