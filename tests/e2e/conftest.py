"""Lab fleets of real sshd on loopback for the end-to-end tests.

`lab` is shared by the whole session: tests must not kill, freeze or inject into it. Tests that
break nodes take `own_lab`, a fresh two-node lab of their own.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuctl.adapters.ssh import SshTransport
from gpuctl.testing.lab import LabFleet, lab_fleet


@pytest.fixture(scope="session")
def lab() -> Iterator[LabFleet]:
    with lab_fleet(nodes=3, gpus=4) as fleet:
        yield fleet


@pytest.fixture
def own_lab() -> Iterator[LabFleet]:
    with lab_fleet(nodes=2, gpus=2) as fleet:
        yield fleet


@pytest.fixture
def transport(tmp_path: Path) -> Iterator[SshTransport]:
    """A transport that trusts only the lab's known_hosts (never this machine's own files)."""
    with SshTransport(own_known_hosts=tmp_path / "own_known_hosts", system_known_hosts=()) as t:
        yield t
