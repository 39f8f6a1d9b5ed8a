"""The controller's lease in the store (schema v6): one holder at a time, a fencing token that
only grows, and every write of a fenced store refused once its token is stale. On memory, SQLite
and PostgreSQL: two handles on one store are two controllers."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.adapters.store import open_store
from gpuctl.adapters.store.postgres import open_url
from gpuctl.core.jobs.model import Cordon, Event
from gpuctl.errors import LeaseLost, StateError
from gpuctl.testing.memstore import MemoryStore
from gpuctl.testing.waiting import wait_for
from tests.pg import STORES, open_test_store

SHORT_S = 0.3  # a lease short enough to let expire in a test


@pytest.fixture(params=STORES)
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two handles on one store: two controllers' (two processes', for SQL stores)."""
    a = open_test_store(request, tmp_path / "state")
    if isinstance(a, MemoryStore):
        b: Store = a.shared()
    elif request.param == "postgresql":
        b = open_url(request.getfixturevalue("pg_url"), write=True)
    else:
        b = open_store(tmp_path / "state", write=True)
    yield a, b
    b.close()
    a.close()


def expired(store: Store) -> bool:
    lease = store.lease()
    return lease is not None and not lease.live


def cordon(node: str) -> tuple[Cordon, Event]:
    return Cordon(node, "hot", "gpuctl", "health", 1.0), Event(1.0, "gpuctl", "cordon", node)


def test_a_live_lease_is_not_taken_and_an_expired_one_is_with_the_next_token(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    assert a.lease() is None
    first = a.acquire_lease("a", SHORT_S)
    assert (first.holder, first.token, first.live) == ("a", 1, True)
    refused = b.acquire_lease("b", SHORT_S)
    assert (refused.holder, refused.token) == ("a", 1)  # a's, untouched
    assert wait_for(lambda: expired(b), timeout_s=10)
    taken = b.acquire_lease("b", 15.0)
    assert (taken.holder, taken.token, taken.live) == ("b", 2, True)
    again = b.acquire_lease("b", 15.0)  # its own: renewed, the same token
    assert again.token == 2 and again.expires_at >= taken.expires_at


def test_a_stale_fence_has_every_write_refused_and_nothing_written(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    a.set_fence(a.acquire_lease("a", SHORT_S).fence)
    a.cordon(*cordon("gpu-01"))  # while it holds the lease
    assert wait_for(lambda: expired(b), timeout_s=10)
    b.set_fence(b.acquire_lease("b", 15.0).fence)
    with pytest.raises(LeaseLost, match=r"^lost the lease to b \(token 2 > 1\): stepping down$"):
        a.cordon(*cordon("gpu-02"))
    with pytest.raises(LeaseLost) as lost:
        a.renew_lease(15.0)
    assert (lost.value.holder, lost.value.token) == ("b", 2)
    with pytest.raises(LeaseLost):
        a.mark_pass()
    assert [c.node for c in b.cordons()] == ["gpu-01"]
    b.cordon(*cordon("gpu-03"))  # the new leader's writes go through
    assert [c.node for c in a.cordons()] == ["gpu-01", "gpu-03"]


def test_an_expired_lease_refuses_its_holders_writes_until_taken_again(
    pair: tuple[Store, Store],
) -> None:
    a, _ = pair
    a.set_fence(a.acquire_lease("a", SHORT_S).fence)
    assert wait_for(lambda: expired(a), timeout_s=10)
    with pytest.raises(LeaseLost, match=r"token 1\) expired"):
        a.append_event(Event(1.0, "gpuctl", "note", "late"))
    a.set_fence(None)  # stepped down; unfenced writes (an operator's) are not the lease's
    a.append_event(Event(1.0, "gpuctl", "note", "operator"))


def test_a_released_lease_is_taken_at_once_and_tokens_are_never_reused(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    a.set_fence(a.acquire_lease("a", 15.0).fence)
    a.mark_pass()
    lease = a.lease()
    assert lease is not None and lease.last_pass_at is not None
    a.release_lease()
    assert b.acquire_lease("b", 15.0).token == 2
    b.set_fence(b.lease().fence)  # type: ignore[union-attr]
    b.release_lease()
    assert a.acquire_lease("a", 15.0).token == 3


def test_members_are_listed_while_their_heartbeat_lasts(pair: tuple[Store, Store]) -> None:
    a, b = pair
    a.heartbeat("a", "leader", 15.0)
    b.heartbeat("b", "standby", SHORT_S)
    assert [(m.holder, m.role) for m in a.members()] == [("a", "leader"), ("b", "standby")]
    assert wait_for(lambda: [m.holder for m in a.members()] == ["a"], timeout_s=10)
    a.leave("a")
    assert a.members() == []


def test_a_postgresql_store_whose_connection_the_server_dropped_connects_again(
    pg_url: str,
) -> None:
    """A restarted server drops every connection: the call that lost it fails (exit 6, nothing
    written), the next one connects again and goes on (the controller retries with back-off)."""
    with open_url(pg_url, write=True) as store, open_url(pg_url, write=True) as admin:
        store.set_fence(store.acquire_lease("a", 15.0).fence)
        pid = store._pg.raw.info.backend_pid
        admin._pg.execute("SELECT pg_terminate_backend(?)", (pid,))
        with pytest.raises(StateError, match="lost the connection to the state store"):
            store.cordon(*cordon("gpu-01"))
        store.cordon(*cordon("gpu-02"))  # connected again, still fenced by its lease
        assert [c.node for c in admin.cordons()] == ["gpu-02"]
        assert store.renew_lease(15.0).token == 1
