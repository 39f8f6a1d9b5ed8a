"""Poller processes (`PoolGatherer`) against real sshd on loopback: the same snapshots as the
in-process gatherer, a worker killed mid-round costs its nodes that round only, no process is
left behind, and no worker holds more connections than it is allowed."""

import dataclasses
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuctl.adapters.ssh import SshTransport
from gpuctl.core.model import FleetSnapshot, NodeSnapshot, NodeSpec, Reach
from gpuctl.ops.gather import Gatherer
from gpuctl.ops.gather_pool import PoolGatherer
from gpuctl.testing.lab import LabFleet
from gpuctl.testing.waiting import wait_for

pytestmark = pytest.mark.e2e


def factory(tmp_path: Path) -> functools.partial[SshTransport]:
    """The workers' transport: trusts only the lab's known_hosts (picklable, as spawn needs)."""
    return functools.partial(
        SshTransport, own_known_hosts=tmp_path / "own_known_hosts", system_known_hosts=()
    )


def comparable(node: NodeSnapshot) -> NodeSnapshot:
    """The node's snapshot without what changes between two polls (when, how fast, the node's
    clock and free memory)."""
    obs = node.observation
    if obs is not None:
        facts = dataclasses.replace(obs.facts, clock_s=None, host_mem_available_mib=None)
        obs = dataclasses.replace(obs, facts=facts)
    return dataclasses.replace(node, observation=obs, latency_s=None, taken_at=None)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_pollers_read_every_node_as_the_in_process_gatherer_does(
    lab: LabFleet, tmp_path: Path
) -> None:
    specs: tuple[NodeSpec, ...] = (
        *lab.specs(),
        # a node whose key nobody trusted, and one whose port nothing listens on
        dataclasses.replace(
            lab.spec("lab-02"), name="stranger", known_hosts=(str(tmp_path / "empty"),)
        ),
        dataclasses.replace(lab.spec("lab-03"), name="gone", port=closed_port()),
    )
    (tmp_path / "empty").write_text("")
    with Gatherer(factory(tmp_path)()) as inproc:
        expected = [inproc.gather(specs) for _ in range(2)]
    with PoolGatherer(factory(tmp_path), pollers=2) as pool:
        got = [pool.gather(specs) for _ in range(2)]  # cold, then warm
        assert [p.nodes > 0 for p in pool.pollers()] == [True, True]  # both took nodes
    for theirs, ours in zip(expected, got, strict=True):
        assert [comparable(n) for n in ours.nodes] == [comparable(n) for n in theirs.nodes]
    reach = {n.name: n.reach for n in got[1].nodes}
    assert reach == {
        "lab-01": Reach.OK,
        "lab-02": Reach.OK,
        "lab-03": Reach.OK,
        "stranger": Reach.HOST_KEY,
        "gone": Reach.REFUSED,
    }


def test_a_poller_killed_mid_round_fails_only_its_nodes_that_round_and_the_next_is_whole(
    own_lab: LabFleet, tmp_path: Path
) -> None:
    specs = own_lab.specs()
    # one node per poller, so the other poller's node must come through
    with PoolGatherer(factory(tmp_path), pollers=2, max_connections=1) as pool:
        assert [n.reach for n in pool.gather(specs).nodes] == [Reach.OK, Reach.OK]
        info = {p.index: p for p in pool.pollers()}
        own_lab.inject("lab-01", hang=True)  # its probe now takes seconds: a round in flight
        before = own_lab.processes("lab-01")
        box: list[FleetSnapshot] = []
        poll = threading.Thread(target=lambda: box.append(pool.gather(specs)))
        poll.start()
        try:
            # the round reached lab-01: its poller's probe started processes there
            assert wait_for(lambda: own_lab.processes("lab-01") - before, timeout_s=30)
            victim = pool._home["lab-01"]
            pid = info[victim].pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
        finally:
            poll.join(60)
        (fleet,) = box
        hit, other = fleet.nodes
        assert hit.reach is Reach.ERROR
        assert hit.error == (
            f"lab-01: poller process {victim} died (killed by SIGKILL) during this poll; "
            "a new one polls the node next round"
        )
        assert other.reach is Reach.OK and len(other.gpus) == 2
        own_lab.inject("lab-01", clear=True)
        after = pool.gather(specs)
        assert [(n.reach, len(n.gpus)) for n in after.nodes] == [(Reach.OK, 2), (Reach.OK, 2)]
        started_again = pool.pollers()[victim].pid
        assert started_again is not None and started_again != pid


def test_no_poller_process_outlives_close_nor_a_killed_parent(
    lab: LabFleet, tmp_path: Path
) -> None:
    with PoolGatherer(factory(tmp_path), pollers=2, max_connections=2) as pool:
        pool.gather(lab.specs())
        pids = [p.pid for p in pool.pollers() if p.pid is not None]
        assert len(pids) == 2
    assert not [pid for pid in pids if alive(pid)]

    script = (
        "import functools, pathlib, sys\n"
        "from gpuctl.adapters.ssh import SshTransport\n"
        "from gpuctl.lab import fleet\n"
        "from gpuctl.ops.gather_pool import PoolGatherer\n"
        "from gpuctl.testing.lab import LabFleet\n"
        "if __name__ == '__main__':\n"
        "    lab = LabFleet(pathlib.Path(sys.argv[1]), fleet.load(pathlib.Path(sys.argv[1])))\n"
        "    make = functools.partial(SshTransport, own_known_hosts=pathlib.Path(sys.argv[2]),\n"
        "                             system_known_hosts=())\n"
        "    pool = PoolGatherer(make, pollers=2, max_connections=2)\n"
        "    pool.gather(lab.specs())\n"
        "    print(' '.join(str(p.pid) for p in pool.pollers()), flush=True)\n"
        "    sys.stdin.read()\n"
    )
    (tmp_path / "parent.py").write_text(script)
    with subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py"), str(lab.dir), str(tmp_path / "kh")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        try:
            assert parent.stdout is not None
            children = [int(x) for x in parent.stdout.readline().split()]
            assert len(children) == 2 and all(alive(pid) for pid in children)
        finally:
            parent.kill()  # SIGKILL: the parent's close() never runs
    assert wait_for(lambda: not [pid for pid in children if alive(pid)], timeout_s=30)


def test_no_poller_holds_more_connections_than_allowed(lab: LabFleet, tmp_path: Path) -> None:
    with PoolGatherer(factory(tmp_path), pollers=1, max_connections=1) as pool:
        for _ in range(2):
            fleet = pool.gather(lab.specs())
            assert [n.reach for n in fleet.nodes] == [Reach.OK] * 3
        # three nodes, one connection each at most: two pollers more than asked for
        assert [(p.nodes, p.connects) for p in pool.pollers()] == [(1, 1)] * 3
