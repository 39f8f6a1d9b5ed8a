"""The error family and the one table from error to exit code.

Every error gpuctl raises on purpose is a `GpuctlError`; the CLI's error boundary prints
`error: <message>` (and `hint: <hint>`) on stderr and exits with the class's exit code.
A traceback is shown only with `--debug`.
"""

from __future__ import annotations

import enum


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


class StoreCorrupt(StateError):
    """The database is damaged, or its file was truncated or replaced under an open store: nothing
    more is read from it or written to it."""


class StoreFull(StateError):
    """No space left for the state store: the change was rolled back, nothing is damaged."""


class PlanError(GpuctlError):
    pass


class LabError(GpuctlError):
    """The local lab fleet could not be started, stopped or changed."""
