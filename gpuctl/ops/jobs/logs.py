"""`gpuctl logs`: a job's log from its node, following it across restarts."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from gpuctl.adapters.protocols import JobRunner, Store
from gpuctl.core.jobs.model import Incarnation, Job, JobState
from gpuctl.core.model import Inventory
from gpuctl.errors import GpuctlError
from gpuctl.ops.jobs.service import find_job

# --- logs -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class LogChunk:
    """Bytes of one incarnation's log, or a `note` for the operator (stderr), never both."""

    incarnation: int
    node: str | None
    data: bytes = b""
    note: str | None = None


def read_logs(
    store: Store,
    runner: JobRunner,
    inventory: Inventory,
    ref: str,
    *,
    follow: bool = False,
    incarnation: int | None = None,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[LogChunk]:
    """The job's log from its node: the current incarnation's (or `incarnation`'s).

    `follow`: keep polling; when the job is restarted (a new incarnation), go on with the new
    one's log; stop when the job has ended (or is held). An unreachable node is a note, then
    polling goes on. Without `follow`, what is there now (an unreachable node raises).
    """
    job = find_job(store, ref)
    n = incarnation if incarnation is not None else job.incarnation
    if not follow:
        if n == 0:
            raise GpuctlError(f"job {job.id} has not started yet ({job.state}): no log")
        inc = _incarnation(store, job.id, n)
        yield from _drain(runner, _node(inventory, inc), job.id, n, 0, [0])
        return
    yield from _follow(store, runner, inventory, job, n, incarnation is not None, poll_s, sleep)


def _follow(
    store: Store,
    runner: JobRunner,
    inventory: Inventory,
    job: Job,
    n: int,
    pinned: bool,
    poll_s: float,
    sleep: Callable[[float], None],
) -> Iterator[LogChunk]:
    offset = [0]
    announced = -1
    failing = False
    while True:
        job = find_job(store, job.id)  # read the state first: a log read after it is complete
        if not pinned and job.incarnation > n:
            n, offset = job.incarnation, [0]
        if n > 0:
            inc = _incarnation(store, job.id, n)
            if announced != n:
                yield LogChunk(n, inc.node, note=f"incarnation {n} on {inc.node}")
                announced = n
            try:
                yield from _drain(runner, _node(inventory, inc), job.id, n, offset[0], offset)
                failing = False
            except GpuctlError as exc:  # unreachable, or no run dir there (yet): poll on
                if not failing:
                    yield LogChunk(n, inc.node, note=f"{inc.node}: cannot read the log: {exc}")
                failing = True
        elif announced != 0:
            yield LogChunk(0, None, note=f"waiting for {job.id} to start ({job.state})")
            announced = 0
        if job.state.terminal or job.state is JobState.HELD:
            ended = f"{job.id} {job.state}" + (f": {job.reason}" if job.reason else "")
            yield LogChunk(n, None, note=ended)
            return
        sleep(poll_s)


def _drain(
    runner: JobRunner, node: Any, job_id: str, n: int, start: int, offset: list[int]
) -> Iterator[LogChunk]:
    """Everything from `start` to the log's end; `offset[0]` follows what was read."""
    at = start
    while True:
        data, nxt = runner.logs(node, job_id, n, offset=at)
        if data:
            yield LogChunk(n, node.name, data=data)
        if not data or nxt <= at:
            offset[0] = max(at, nxt)
            return
        at = nxt
        offset[0] = at


def _incarnation(store: Store, job_id: str, n: int) -> Incarnation:
    found = [i for i in store.incarnations(job_id) if i.n == n]
    if not found:
        raise GpuctlError(f"job {job_id} has no incarnation {n}")
    return found[0]


def _node(inventory: Inventory, inc: Incarnation) -> Any:
    spec = inventory.by_name().get(inc.node)
    if spec is None:
        raise GpuctlError(
            f"node {inc.node} (where incarnation {inc.n} of {inc.job_id} ran) is not in the "
            "inventory",
            hint="pass the inventory the job ran on with -i",
        )
    return spec
