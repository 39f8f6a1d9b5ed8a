"""The error family, the exit codes, and the one mapping from error or outcome to exit code.

Every error gpuctl raises on purpose is a `GpuctlError`; the CLI's error boundary prints
`error: <message>` (and `hint: <hint>`) on stderr and exits with the class's exit code.
A traceback is shown only with `--debug`. A command that ends without an error exits with the
code of its outcome, from one function per kind of outcome below (`exit_for_poll`,
`exit_for_plan`, `exit_for_apply`, `exit_for_db_check`, `exit_for_playbook`); `gpuctl health`
alone exits with Nagios's codes (`core.health.model.Severity.nagios`), as monitoring expects.

3 (PARTIAL) has one meaning per command, documented in the README: a poll or a check that some
nodes did not answer; a plan (`place`, `consolidate --for`) that left work out; an apply
(`drain`, `consolidate --apply`) that left moves undone. No command can end both ways (`place`
with nodes down exits 0 when every job fits), so the code stays what scripts already rely on.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class ExitCode(enum.IntEnum):
    """Exit statuses, documented in the README."""

    OK = 0
    ERROR = 1  # an operation failed (unexpected, or a remote action failed)
    USAGE = 2  # bad input: command line, inventory, job spec, playbook
    PARTIAL = 3  # a fleet operation answered for some nodes and not others
    UNREACHABLE = 4  # no node answered
    HOST_KEY = 5  # host key unknown or changed: an operator must decide
    STATE = 6  # the state store refuses (corrupt, newer schema, locked)
    INTERRUPTED = 130


def exit_for_poll(outcomes: Iterable[str]) -> ExitCode:
    """A command that reached every node it names, from each node's outcome: `ok`; `failed`
    (it answered, but what was asked failed or the operator declined it); `host_key`; any other
    (a `Reach` such as `timeout`) is a node that did not answer.

    5 when any host key is unknown or changed (an operator must decide: before 3 and 4); 4 when
    no node answered; 3 when some did not; 1 when one that answered failed; else 0."""
    seen = list(outcomes)
    if "host_key" in seen:
        return ExitCode.HOST_KEY
    silent = sum(1 for o in seen if o not in ("ok", "failed"))
    if silent:
        return ExitCode.UNREACHABLE if silent == len(seen) else ExitCode.PARTIAL
    return ExitCode.ERROR if "failed" in seen else ExitCode.OK


def exit_for_plan(*, complete: bool) -> ExitCode:
    """A plan (`place`, `consolidate --for`): 0 when it fits everything asked, 3 when it left
    some of it out (each unplaced job or the target's shortfall is explained in the plan)."""
    return ExitCode.OK if complete else ExitCode.PARTIAL


def exit_for_apply(*, complete: bool) -> ExitCode:
    """An applied plan (`drain`, `consolidate --apply`): 0 when every move was done, 3 when some
    were left undone (the result says which and why)."""
    return ExitCode.OK if complete else ExitCode.PARTIAL


def exit_for_db_check(*, store_ok: bool, fleet_problems: int, unread_nodes: int) -> ExitCode:
    """`gpuctl db check [--fleet]`: 6 when the store cannot be trusted; 1 when the fleet does
    not match it (a job live twice, a stray run, a card over its capacity); 3 when some nodes
    could not be read (the fleet check is partial); else 0."""
    if not store_ok:
        return ExitCode.STATE
    if fleet_problems:
        return ExitCode.ERROR
    return ExitCode.PARTIAL if unread_nodes else ExitCode.OK


_PLAYBOOK_EXITS = {
    "ok": ExitCode.OK,
    "outside_window": ExitCode.OK,  # nothing to do now: not a failure
    "failed": ExitCode.ERROR,
    "stopped": ExitCode.ERROR,
    "declined": ExitCode.ERROR,
}


def exit_for_playbook(outcome: str) -> ExitCode:
    """A playbook run's outcome: 0 done (or outside its window), 1 failed, stopped or declined."""
    return _PLAYBOOK_EXITS[outcome]


class GpuctlError(Exception):
    """Base of every error gpuctl raises on purpose."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(GpuctlError):
    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """A file gpuctl reads (inventory, job spec, playbook, settings) is invalid.

    The message names the file, the line where known, and the field.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = ""
        if path is not None:
            where = path if line is None else f"{path}:{line}"
        if field:
            where = f"{where}: {field}" if where else field
        super().__init__(f"{where}: {message}" if where else message, hint=hint)
        self.path = path
        self.line = line
        self.field = field


class InventoryError(ConfigError):
    pass


class JobSpecError(ConfigError):
    pass


class TransportError(GpuctlError):
    """A node could not be reached or a remote command failed at the transport level.

    `reach` is the per-node outcome code shown in results: refused, auth_failed, host_key,
    timeout, unreachable or error.
    """

    reach = "error"


class ConnectRefused(TransportError):
    reach = "refused"


class Unreachable(TransportError):
    reach = "unreachable"


class AuthFailed(TransportError):
    reach = "auth_failed"


class HostKeyError(TransportError):
    reach = "host_key"
    exit_code = ExitCode.HOST_KEY


class HostKeyUnknown(HostKeyError):
    pass


class HostKeyChanged(HostKeyError):
    pass


class TransportTimeout(TransportError):
    reach = "timeout"


class ProbeError(GpuctlError):
    """Node output could not be understood at all."""


class StateError(GpuctlError):
    exit_code = ExitCode.STATE


class StoreConflict(StateError):
    """A compare-and-set lost: the row changed under us (another control loop, another operator)."""


class ControllerLeads(StoreConflict):
    """`gpuctl reconcile` runs no pass while a controller holds a live lease: the message names
    it, its token and until when its lease runs."""


class StalePlan(StoreConflict):
    """A plan's write refused because what it was made on changed since (another operator's
    cordon, drain or move): the message says what changed, who did it and when; nothing was
    written."""


class StoreCorrupt(StateError):
    """The database is damaged, or its file was truncated or replaced under an open store: nothing
    more is read from it or written to it."""


class LeaseLost(StateError):
    """A controller's write carried a fencing token that is no longer the lease's (another
    controller took it) or whose lease expired: nothing was written; the controller steps down.
    `holder` and `token`: the lease's now (None: it merely expired)."""

    def __init__(
        self, message: str, *, holder: str | None = None, token: int | None = None
    ) -> None:
        super().__init__(message)
        self.holder = holder
        self.token = token


class StoreUnavailable(StateError):
    """The store's server cannot be reached, or dropped the connection (a restart, a failover):
    the call's transaction rolled back, nothing written; the next call connects again."""


class ReadOnlyRole(StateError):
    """The database refused a change: the store's role may only read (PostgreSQL's
    insufficient_privilege). The CLI names the verb: "read-only: this role cannot change the
    state (submit)"."""


class StoreFull(StateError):
    """No space left for the state store: the change was rolled back, nothing is damaged."""


class PlanError(GpuctlError):
    pass


class LabError(GpuctlError):
    """The local lab fleet could not be started, stopped or changed."""
