"""A test hook: a controller that stops at a named point of a pass, so a test can kill it there.

Only when `GPUCTL_TEST_PAUSE_AT` is set (`POINT` or `POINT@N`: the Nth time, from 1) does
`controller run` wrap its store and job runner; otherwise nothing changes. At the point the
controller writes `gpuctl-test: paused at POINT` on stderr and waits for ever (its lease renewer
still runs: the lease expires only once the process is killed), or, when `GPUCTL_TEST_RESUME`
names a file, until that file exists (a test restarts the database meanwhile, say). Points, in
pass order:

- `observed`: a node's runs were read (gather);
- `before_intent`: a launch is about to be written (`begin_launch` not called yet);
- `in_transaction`: inside the launch's write transaction, its fence checked (the lease's row
  and the job's locked, nothing committed: a controller stopped mid-transaction);
- `intent_written`: the launch intent and its cards are in the store, nothing sent to the node;
- `exec_sent`: the node has been told to start the job;
- `confirmed`: the incarnation was recorded running;
- `job_written`: a job row changed (a requeue, an end);
- `pass_end`: the pass ended and was recorded.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuctl.adapters.protocols import JobRunner, Store
from gpuctl.core.jobs.model import IncarnationState

ENV = "GPUCTL_TEST_PAUSE_AT"
RESUME_ENV = "GPUCTL_TEST_RESUME"
POLL_S = 0.05
POINTS = (
    "observed",
    "before_intent",
    "in_transaction",
    "intent_written",
    "exec_sent",
    "confirmed",
    "job_written",
    "pass_end",
)


class Pauser:
    def __init__(self, spec: str, resume: str | None = None) -> None:
        point, _, nth = spec.partition("@")
        if point not in POINTS:
            raise ValueError(f"{ENV}: unknown point {point!r} (one of {', '.join(POINTS)})")
        self.point, self.nth, self.seen = point, int(nth or 1), 0
        self.resume = resume
        self._lock = threading.Lock()

    def at(self, point: str) -> None:
        if point != self.point:
            return
        with self._lock:
            self.seen += 1
            if self.seen != self.nth:
                return
        sys.stderr.write(f"gpuctl-test: paused at {point}\n")
        sys.stderr.flush()
        resume = self.resume
        if resume is None:
            threading.Event().wait()  # until killed
            return
        while not Path(resume).exists():
            time.sleep(POLL_S)
        sys.stderr.write(f"gpuctl-test: resumed at {point}\n")
        sys.stderr.flush()


class _PausingStore:
    def __init__(self, inner: Store, pauser: Pauser) -> None:
        self._inner, self._pauser = inner, pauser
        self._launching: int | None = None  # the thread in `begin_launch` (not the renewer)
        check = getattr(inner, "_check_fence", None)
        if pauser.point == "in_transaction" and check is not None:

            def checked(conn: Any, fenced: bool) -> None:  # the SQL stores' first step
                check(conn, fenced)
                if self._launching == threading.get_ident():
                    self._pauser.at("in_transaction")

            inner._check_fence = checked  # type: ignore[attr-defined]

    def begin_launch(self, *args: Any, **kwargs: Any) -> Any:
        self._pauser.at("before_intent")
        self._launching = threading.get_ident()
        try:
            out = self._inner.begin_launch(*args, **kwargs)
        finally:
            self._launching = None
        self._pauser.at("intent_written")
        return out

    def update_incarnation(self, *args: Any, **kwargs: Any) -> Any:
        out = self._inner.update_incarnation(*args, **kwargs)
        if kwargs.get("state") == IncarnationState.RUNNING:
            self._pauser.at("confirmed")
        return out

    def update_job(self, *args: Any, **kwargs: Any) -> Any:
        out = self._inner.update_job(*args, **kwargs)
        self._pauser.at("job_written")
        return out

    def mark_pass(self) -> None:
        self._inner.mark_pass()
        self._pauser.at("pass_end")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _PausingRunner:
    def __init__(self, inner: JobRunner, pauser: Pauser) -> None:
        self._inner, self._pauser = inner, pauser

    def launch(self, *args: Any, **kwargs: Any) -> Any:
        out = self._inner.launch(*args, **kwargs)
        self._pauser.at("exec_sent")
        return out

    def observe(self, *args: Any, **kwargs: Any) -> Any:
        out = self._inner.observe(*args, **kwargs)
        self._pauser.at("observed")
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def wrap(
    store: Store, runner: JobRunner, spec: str, resume: str | None = None
) -> tuple[Store, JobRunner]:
    """`store` and `runner`, pausing at `spec`'s point (until `resume` exists, if given)."""
    pauser = Pauser(spec, resume)
    paused_store: Any = _PausingStore(store, pauser)
    paused_runner: Any = _PausingRunner(runner, pauser)
    return paused_store, paused_runner
