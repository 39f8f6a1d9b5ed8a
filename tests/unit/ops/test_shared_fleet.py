"""The control loop publishes each poll into the store, and operators' views read it while it is
fresh instead of polling every node themselves (`ops.shared_fleet`): N operators, one poll."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gpuctl.adapters.protocols import Store
from gpuctl.core.health.autodrain import AutoDrainPolicy
from gpuctl.ops.loop import publish
from gpuctl.ops.shared_fleet import SharedFleet
from gpuctl.testing.drainkit import Kit
from gpuctl.testing.memstore import MemoryStore

OFF = AutoDrainPolicy(enabled=False)


def reader(kit: Kit, *, live: bool = False) -> SharedFleet:
    @contextlib.contextmanager
    def read() -> Iterator[Store]:
        yield kit.store

    return SharedFleet(read, kit.fleet, kit.clock, live=live)


def test_each_pass_publishes_its_poll_with_who_polled_and_when() -> None:
    kit = Kit.make(MemoryStore(), ("n1", "n2", "n3"), health=OFF)
    kit.loop.interval_s = 10.0
    kit.step()
    published = kit.store.latest_snapshot()
    assert published is not None
    assert (published.publisher, published.nodes, published.interval_s) == ("gpuctl", 3, 10.0)
    assert [n.name for n in published.snapshot().nodes] == ["n1", "n2", "n3"]
    assert published.taken_at == kit.clock.now()


def test_operators_read_the_published_poll_while_it_is_fresh_and_say_how_old() -> None:
    kit = Kit.make(MemoryStore(), ("n1", "n2", "n3"), health=OFF)
    kit.loop.interval_s = 10.0
    kit.step()
    polls = kit.fleet.polls
    operators = [reader(kit) for _ in range(3)]
    kit.clock.advance(4)
    seen = [op.gather(kit.cluster.inventory()) for op in operators]
    assert kit.fleet.polls == polls  # three operators, no poll of their own
    assert [n.name for n in seen[0].nodes] == ["n1", "n2", "n3"]
    assert operators[0].seen_line() == "fleet as the controller saw it 4s ago"
    one = operators[0].gather([kit.cluster.inventory().nodes[1]])
    assert [n.name for n in one.nodes] == ["n2"] and kit.fleet.polls == polls


def test_a_stale_snapshot_live_or_a_node_the_loop_does_not_poll_means_a_poll() -> None:
    kit = Kit.make(MemoryStore(), ("n1", "n2"), health=OFF)
    kit.loop.interval_s = 10.0
    kit.step()
    polls = kit.fleet.polls
    fresh = reader(kit)
    live = reader(kit, live=True)
    live.gather(kit.cluster.inventory())
    assert kit.fleet.polls == polls + 1 and live.seen_line() is None
    kit.clock.advance(31)  # past 3 x the loop's 10 s interval
    fresh.gather(kit.cluster.inventory())
    assert kit.fleet.polls == polls + 2 and fresh.seen_line() is None


def test_a_controller_whose_lease_expired_is_not_read_though_its_snapshot_is_young() -> None:
    store = MemoryStore()
    kit = Kit.make(store, ("n1", "n2"), health=OFF)
    store.now_s = kit.clock.now
    lease = store.acquire_lease("ctl-a", 15.0)
    kit.loop.publisher, kit.loop.interval_s = lease.holder, 10.0
    publish(kit.loop, kit.fleet.gather(kit.cluster.inventory()))  # the controller's pass
    polls = kit.fleet.polls
    reader(kit).gather(kit.cluster.inventory())
    assert kit.fleet.polls == polls  # the leader is live: its snapshot stands
    kit.clock.advance(16)  # the lease expires; the snapshot is 16 s old, under 3 x 10 s
    reader(kit).gather(kit.cluster.inventory())
    assert kit.fleet.polls == polls + 1
