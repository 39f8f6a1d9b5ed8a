"""Run one function per node on a bounded pool: a result per node, partial failure as a value.

`Fanout` keeps its worker threads between calls, so a warm poll round pays no thread start-up;
`fanout()` is the one-shot form. Results come back in the order the nodes were given (inventory
order), each either the function's value or the exception it raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Generic, TypeAlias, TypeVar

from gpuctl.core.model import NodeSpec

T = TypeVar("T")

Result: TypeAlias = T | Exception  # the value, or the exception the call raised

DEFAULT_MAX_WORKERS = 32


class Fanout(Generic[T]):
    """A bounded pool kept alive between `map` calls. Not re-entrant: `fn` must not call `map`
    on the same Fanout (it could wait for a worker that waits for it)."""

    def __init__(self, *, max_workers: int = DEFAULT_MAX_WORKERS) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gpuctl-fanout")
        self._closed = False

    def map(
        self,
        nodes: Iterable[NodeSpec],
        fn: Callable[[NodeSpec], T],
        *,
        progress: Callable[[str, Result[T], int, int], None] | None = None,
    ) -> dict[str, Result[T]]:
        """`fn(node)` for every node, at most `max_workers` at a time. `progress` is called in
        the caller's thread as each node finishes. KeyboardInterrupt and SystemExit propagate."""
        if self._closed:
            raise RuntimeError("Fanout is closed")
        specs = list(nodes)
        names = [n.name for n in specs]
        if len(set(names)) != len(names):
            raise ValueError("fanout needs distinct node names")
        futures = {self._pool.submit(_call, fn, node): node.name for node in specs}
        collected: dict[str, Result[T]] = {}
        try:
            for done, fut in enumerate(as_completed(futures), start=1):
                name = futures[fut]
                collected[name] = fut.result()  # only KeyboardInterrupt/SystemExit raise here
                if progress is not None:
                    progress(name, collected[name], done, len(specs))
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
        return {name: collected[name] for name in names}

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Fanout[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _call(fn: Callable[[NodeSpec], T], node: NodeSpec) -> Result[T]:
    try:
        return fn(node)
    except Exception as exc:  # partial failure is a value
        return exc


def fanout(
    nodes: Iterable[NodeSpec],
    fn: Callable[[NodeSpec], T],
    *,
    max_workers: int = DEFAULT_MAX_WORKERS,
    progress: Callable[[str, Result[T], int, int], None] | None = None,
) -> dict[str, Result[T]]:
    """One-shot `Fanout(...).map(...)`; keep a `Fanout` instead where calls repeat."""
    specs = list(nodes)
    with Fanout[T](max_workers=max(1, min(max_workers, len(specs) or 1))) as pool:
        return pool.map(specs, fn, progress=progress)
