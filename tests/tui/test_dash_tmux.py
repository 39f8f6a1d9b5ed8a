"""End to end: `gpuctl dash` in a real terminal (tmux) against a lab fleet of real sshd.

What an operator sees: the nodes and the numbers; a node killed shows as down within a few
refreshes; `:queue` shows the queued job and why it waits; `q` quits with status 0.
Needs tmux (`apt-get install -y tmux`) and what the lab needs (openssh-server).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuctl.testing.lab import LabFleet, lab_fleet

pytestmark = pytest.mark.e2e

GPUCTL = Path(sys.executable).with_name("gpuctl")
WIDTH, HEIGHT = 200, 50


@pytest.fixture
def lab() -> Iterator[LabFleet]:
    with lab_fleet(nodes=2, gpus=2) as fleet:
        yield fleet


class Pane:
    def __init__(self, session: str) -> None:
        self.session = session

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", *args], capture_output=True, text=True, check=True)
        return out.stdout

    def capture(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.session, *keys)

    def wait_for(self, seen: Callable[[str], bool], what: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.capture()
            if seen(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout_s:g}s; the pane shows:\n{screen}")
            time.sleep(0.2)


def row(screen: str, name: str) -> str:
    return next((line for line in screen.splitlines() if line.lstrip().startswith(name)), "")


def test_an_operator_watches_the_lab_fleet_sees_a_node_die_reads_the_queue_and_quits(
    lab: LabFleet, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    job = tmp_path / "big.yaml"
    job.write_text(
        "name: big\ncommand: [python, train.py]\nresources: {gpus: 8, mem_per_gpu: whole}\n"
    )
    base = [str(GPUCTL), "-i", str(lab.dir / "inventory.yaml"), "--state-dir", str(state)]
    # 8 cards fit no lab node: queued anyway, to read why it waits
    subprocess.run([*base, "submit", "--queue-anyway", str(job)], check=True, capture_output=True)
    session = f"gpuctl-dash-{uuid.uuid4().hex[:8]}"
    command = f"{shlex.join([*base, 'dash', '--refresh', '1'])}; echo DASH-EXITED $?; sleep 60"
    env = {**os.environ, "TERM": "xterm-256color"}
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", str(WIDTH), "-y", str(HEIGHT), command],
        check=True,
        env=env,
    )
    pane = Pane(session)
    try:
        screen = pane.wait_for(
            lambda s: "ready" in row(s, "lab-01") and "ready" in row(s, "lab-02"), "both nodes"
        )
        assert "UTILIZATION" in screen and "0% allocated" in screen
        assert "QUEUE WAIT p50" in screen and "1 waiting" in screen
        assert "FAILOVER OK" in screen and "CHECKPOINT AGE max" in screen
        assert row(screen, "lab-01").split()[2] == "2/2"  # GPUs seen / expected
        (tmp_path / "overview.txt").write_text(screen)

        lab.kill("lab-02")
        # the row and the alert are two tables: a capture may fall between their repaints
        screen = pane.wait_for(
            lambda s: "down (refused)" in row(s, "lab-02") and "lab-02 refused" in s,
            "lab-02 down in its row and in the alerts",
        )
        assert "ready" in row(screen, "lab-01")

        pane.keys(":", "queue", "Enter")
        screen = pane.wait_for(lambda s: "WHY IT WAITS" in s and "8 × whole cards" in s, "queue")
        assert row(screen, "big-").split()[1:3] == ["big", "standard"]

        pane.keys("q")
        pane.wait_for(lambda s: "DASH-EXITED 0" in s, "a clean exit")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
