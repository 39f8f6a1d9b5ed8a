"""Fan-out: bounded, per-node results in inventory order, failures as values, warm pool reuse."""

import threading
import time

import pytest

from gpuctl.core.model import NodeSpec
from gpuctl.errors import ConnectRefused
from gpuctl.ops.fanout import Fanout, fanout

NODES = tuple(NodeSpec(name=f"n{i:02d}", host=f"10.0.0.{i}") for i in range(1, 13))


def test_results_come_back_in_inventory_order_whatever_finishes_first() -> None:
    def slow_first(node: NodeSpec) -> str:
        time.sleep(0.02 if node.name == "n01" else 0)
        return node.host

    results = fanout(NODES, slow_first, max_workers=4)
    assert list(results) == [n.name for n in NODES]
    assert results["n01"] == "10.0.0.1"


def test_one_node_failing_is_a_value_not_the_end_of_the_round() -> None:
    def flaky(node: NodeSpec) -> int:
        if node.name == "n03":
            raise ConnectRefused("n03: connection refused")
        return 1

    results = fanout(NODES, flaky)
    assert isinstance(results["n03"], ConnectRefused)
    assert sum(1 for r in results.values() if r == 1) == len(NODES) - 1


def test_concurrency_never_exceeds_max_workers() -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    def track(node: NodeSpec) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1

    fanout(NODES, track, max_workers=3)
    assert peak == 3


def test_progress_reports_each_node_once_with_a_running_count() -> None:
    seen: list[tuple[str, int, int]] = []
    fanout(
        NODES,
        lambda n: n.name,
        progress=lambda name, _r, done, total: seen.append((name, done, total)),
    )
    assert sorted(name for name, _, _ in seen) == [n.name for n in NODES]
    assert [done for _, done, _ in seen] == list(range(1, len(NODES) + 1))
    assert {total for _, _, total in seen} == {len(NODES)}


def fanout_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("gpuctl-fanout")}


def test_a_kept_fanout_reuses_its_threads_between_rounds() -> None:
    before = fanout_threads()
    barrier = threading.Barrier(4, timeout=5)
    with Fanout[str](max_workers=4) as pool:
        pool.map(NODES[:4], lambda n: str(barrier.wait()))  # all four workers busy at once
        after_first = fanout_threads() - before
        pool.map(NODES, lambda n: n.name)
        after_second = fanout_threads() - before
    assert len(after_first) == 4
    assert after_second == after_first


def test_keyboard_interrupt_in_a_worker_is_not_swallowed() -> None:
    def interrupted(node: NodeSpec) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fanout(NODES[:2], interrupted)


def test_duplicate_node_names_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct"):
        fanout((NODES[0], NODES[0]), lambda n: n)


def test_an_empty_inventory_gives_an_empty_result() -> None:
    assert fanout((), lambda n: n) == {}
