"""The fleet check over a scripted fleet: what runs on the nodes against what the store says."""

from __future__ import annotations

from gpuctl.core.jobs.model import LaunchRequest
from gpuctl.errors import Unreachable
from gpuctl.ops.fleetcheck import check_fleet
from gpuctl.testing.memstore import MemoryStore
from tests.unit.ops.test_reconcile import make


def by_hand(job_id: str, n: int) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        incarnation=n,
        argv=("sleep", "60"),
        cuda_visible_devices="1",
        mib_per_card=1024,
        checkpoint_dir="/elsewhere",
    )


def test_a_fleet_that_matches_its_store_is_clean() -> None:
    t = make(MemoryStore())
    job = t.submit("train")
    t.step()
    found = check_fleet(t.store, t.cluster.inventory(), t.runner, t.fleet.gather(t.loop.inventory))
    assert found.clean and found.problems == () and found.unreadable == ()
    assert found.live == {(job.id, 1): (t.inc(job.id).node,)}


def test_two_live_copies_and_a_stray_run_are_problems() -> None:
    t = make(MemoryStore())
    job = t.submit("train")
    t.step()
    home = t.inc(job.id).node
    other = "n2" if home == "n1" else "n1"
    t.runner.launch(
        t.cluster.node(other).spec(), by_hand(job.id, 7)
    )  # an incarnation never granted
    found = check_fleet(t.store, t.cluster.inventory(), t.runner)
    assert not found.clean
    assert found.problems == (
        f"job {job.id}: 2 live copies: incarnation 1 on {home}, incarnation 7 on {other}",
        f"stray run on {other}: incarnation 7 of job {job.id} is live there; the store has no "
        "live incarnation 7",
    )


def test_a_card_holding_more_than_the_node_reports_is_a_problem() -> None:
    t = make(MemoryStore())
    job = t.submit("train")  # a 20 GiB slice
    t.step()
    node = t.inc(job.id).node
    t.cluster.node(node).mem_mib = 16 * 1024  # the node now reports a 16 GiB card
    found = check_fleet(t.store, t.cluster.inventory(), t.runner, t.fleet.gather(t.loop.inventory))
    card = t.inc(job.id).cards[0]
    assert found.problems == (
        f"card {card} of {node}: 20480 MiB held ({job.id}#1) on a 16384 MiB card",
    )


def test_a_node_that_cannot_be_read_makes_the_check_partial_never_clean() -> None:
    t = make(MemoryStore())
    t.submit("train")
    t.step()
    t.cluster.partition("n2")
    found = check_fleet(t.store, t.cluster.inventory(), t.runner)
    assert found.problems == () and not found.clean
    assert found.unreadable == (f"n2: {Unreachable('n2: no route to host').message}",)
