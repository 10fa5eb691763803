"""kvmesh's errors as exceptions.

Every failed kvmesh call raises a subclass of :class:`Error` whose ``code`` is
kvmesh's status code name (``"NOT_FOUND"``, ``"INVALID_ARGUMENT"``, ... as in
include/kvmesh/status.h) and whose ``message`` says why. Where a built-in
exception means the same thing, the class derives from it too, so
``except ValueError`` catches bad input and ``except TimeoutError`` a deadline.

Batch calls (``get_into``, ``put_from``) do not raise for a miss: each item
carries its own status (:class:`kvmesh.ItemStatus`).
"""

__all__ = [
    "Error", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError",
    "ResourceExhaustedError", "BusyError", "DataLossError", "UnavailableError",
    "DeadlineExceededError", "StaleEpochError", "FailedPreconditionError",
    "UnimplementedError", "IoError", "InternalError", "PermissionDeniedError",
    "MISS_CODES",
]


class Error(Exception):
    """A kvmesh call failed. ``code``: the status code name; ``message``: why."""

    code = "UNKNOWN"

    def __init__(self, message: str = "", code: "str | None" = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


class InvalidArgumentError(Error, ValueError):
    """The caller sent something malformed (bad key, buffer, option, config)."""
    code = "INVALID_ARGUMENT"


class NotFoundError(Error, LookupError):
    """A miss: the block is not cached."""
    code = "NOT_FOUND"


class AlreadyExistsError(Error):
    code = "ALREADY_EXISTS"


class ResourceExhaustedError(Error):
    """No room (everything pinned), a limit hit, or a destination too small."""
    code = "RESOURCE_EXHAUSTED"


class BusyError(Error):
    """Admission refused under pressure; retry later."""
    code = "BUSY"


class DataLossError(Error):
    """A checksum mismatch: the block is treated as a miss."""
    code = "DATA_LOSS"


class UnavailableError(Error, ConnectionError):
    """A node or the coordinator cannot be reached."""
    code = "UNAVAILABLE"


class DeadlineExceededError(Error, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class StaleEpochError(Error):
    code = "STALE_EPOCH"


class FailedPreconditionError(Error, RuntimeError):
    """The call does not fit the current state (e.g. the client is closed)."""
    code = "FAILED_PRECONDITION"


class UnimplementedError(Error, NotImplementedError):
    code = "UNIMPLEMENTED"


class IoError(Error, OSError):
    code = "IO_ERROR"


class InternalError(Error):
    code = "INTERNAL"


class PermissionDeniedError(Error, PermissionError):
    """A bad or missing auth token."""
    code = "PERMISSION_DENIED"


# Codes a cache client treats as "not here, recompute" (kvmesh::IsMiss).
MISS_CODES = frozenset({"NOT_FOUND", "DATA_LOSS", "UNAVAILABLE", "DEADLINE_EXCEEDED"})

_BY_CODE = {cls.code: cls for cls in (
    InvalidArgumentError, NotFoundError, AlreadyExistsError, ResourceExhaustedError, BusyError,
    DataLossError, UnavailableError, DeadlineExceededError, StaleEpochError, FailedPreconditionError,
    UnimplementedError, IoError, InternalError, PermissionDeniedError)}


def _make(code: str, message: str) -> Error:
    """The exception for a status code (called by kvmesh._core)."""
    return _BY_CODE.get(code, Error)(message, code)
