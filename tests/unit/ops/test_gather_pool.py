"""How `PoolGatherer` shares a fleet among its poller processes (no process started here: the
assignment is the parent's), and how many pollers a fleet gets by default."""

from pathlib import Path

from gpuctl.adapters.protocols import Transport
from gpuctl.core.model import Inventory, NodeSpec
from gpuctl.ops.compose import Root
from gpuctl.ops.gather import Gatherer
from gpuctl.ops.gather_pool import PoolGatherer, auto_pollers
from gpuctl.testing.fakes import FakeTransport


def no_nodes() -> Transport:
    return FakeTransport({})


def homes(pool: PoolGatherer, names: list[str]) -> dict[str, int]:
    return {name: pool._assign(name) for name in names}


def test_a_node_keeps_its_poller_and_two_gatherers_agree_on_it() -> None:
    names = [f"node-{i:03}" for i in range(60)]
    first = PoolGatherer(no_nodes, pollers=4)
    second = PoolGatherer(no_nodes, pollers=4)
    assigned = homes(first, names)
    assert homes(first, names) == assigned  # asked again: the same poller, its session warm
    assert homes(second, list(reversed(names))) == assigned  # the order the nodes come in
    assert set(assigned.values()) == {0, 1, 2, 3}


def test_no_poller_takes_more_nodes_than_its_connections_and_a_larger_fleet_gets_more() -> None:
    pool = PoolGatherer(no_nodes, pollers=2, max_connections=10)
    assigned = homes(pool, [f"n{i}" for i in range(35)])
    per_poller = [list(assigned.values()).count(i) for i in range(4)]
    assert per_poller == [10, 10, 10, 5]
    assert [p.nodes for p in pool.pollers()] == per_poller
    assert all(p.pid is None for p in pool.pollers())  # nothing started before a poll


def test_small_fleets_are_polled_in_process_and_large_ones_on_every_core_up_to_a_cap() -> None:
    assert auto_pollers(199, cores=8) == 1
    assert auto_pollers(200, cores=8) == 8
    assert auto_pollers(5000, cores=1) == 1
    assert auto_pollers(5000, cores=64) == 16


def inventory(nodes: int) -> Inventory:
    return Inventory(nodes=tuple(NodeSpec(name=f"n{i}", host=f"10.0.0.{i}") for i in range(nodes)))


def test_the_control_loop_and_metrics_link_polls_through_pollers_when_asked_or_the_fleet_is_large(
    tmp_path: Path,
) -> None:
    asked = Root(env={}, state_dir=tmp_path, transport=no_nodes, pollers=2)
    link = asked.connect(inventory(3))
    try:
        assert isinstance(link.gatherer, PoolGatherer)
    finally:
        link.close()
    small = Root(env={}, state_dir=tmp_path, transport=no_nodes).connect(inventory(3))
    try:
        assert isinstance(small.gatherer, Gatherer)  # under 200 nodes: in process
    finally:
        small.close()
    unpicklable = Root(env={}, state_dir=tmp_path, transport=lambda: FakeTransport({}), pollers=2)
    link = unpicklable.connect(inventory(3))  # a test's own factory cannot reach a worker
    try:
        assert isinstance(link.gatherer, Gatherer)
    finally:
        link.close()
