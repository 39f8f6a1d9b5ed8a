"""A node whose sshd keeps dropping (it misses a poll, answers again, misses one again) is cordoned
by health after a few such outages within a window, its running jobs left alone, and the cordon is
lifted once it has answered every poll for the cool-down; against both stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.protocols import Store
from gpuctl.core.jobs.model import IncarnationState, JobState
from gpuctl.testing.drainkit import Kit
from tests.pg import STORES, open_test_store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = open_test_store(request, tmp_path)
    yield s
    s.close()


def flap(k: Kit, node: str, times: int) -> None:
    """`times` outages of `node`, two minutes apart, each one poll long (within the grace)."""
    for _ in range(times):
        k.cluster.partition(node)
        k.step(5)  # node_failing
        k.cluster.heal(node)
        k.step(5)  # node_recovered
        k.step(110)


def test_three_outages_within_ten_minutes_cordon_the_node_and_leave_its_job_running(
    store: Store,
) -> None:
    k = Kit.make(store)
    job = k.submit("train")
    k.step()
    node = k.inc(job.id).node
    flap(k, node, 3)
    (cordon,) = store.cordons()
    assert (cordon.node, cordon.operator, cordon.source) == (node, "gpuctl", "health")
    assert "came back 3 times within 10m00s" in cordon.reason
    (event,) = store.events(kinds=["cordon"])
    assert "running jobs are left alone" in event.message
    inc = k.inc(job.id)
    assert (inc.n, inc.node, inc.state) == (1, node, IncarnationState.RUNNING)
    assert k.job(job.id).state is JobState.RUNNING and k.signals(job.id) == []
    assert store.events(kinds=["drain"]) == [] and store.reservations() == []


def test_two_outages_do_not_cordon(store: Store) -> None:
    k = Kit.make(store)
    job = k.submit("train")
    k.step()
    flap(k, k.inc(job.id).node, 2)
    assert store.cordons() == []
    assert len(store.events(kinds=["node_recovered"])) == 2


def test_the_flapping_cordon_is_lifted_after_the_node_answered_every_poll_for_the_cool_down(
    store: Store,
) -> None:
    k = Kit.make(store)
    flap(k, "n1", 3)
    assert [c.node for c in store.cordons()] == ["n1"]
    for _ in range(4):
        k.step(60)  # 350 s of answers since it came back: within the cool-down (600 s)
    assert [c.node for c in store.cordons()] == ["n1"]
    for _ in range(5):
        k.step(60)  # 650 s
    assert store.cordons() == []
    (lifted,) = store.events(kinds=["uncordon"])
    assert lifted.node == "n1" and "cool-down" in lifted.message
