"""Domain errors of the front door. ``server.py`` maps each one to a gRPC status code, in one place.

Every error carries the *name* of its status code rather than a ``grpc.StatusCode`` so that the domain
modules (and the pure policy) import nothing from gRPC.
"""

from __future__ import annotations


class DispatchError(Exception):
    """Base class: a request the front door refuses or cannot finish. ``code`` is a gRPC status name."""

    code: str = "INTERNAL"


class InvalidRequest(DispatchError):
    code = "INVALID_ARGUMENT"


class RequestTooLarge(DispatchError):
    code = "RESOURCE_EXHAUSTED"


class ModelNotFound(DispatchError):
    code = "NOT_FOUND"


class StageConflict(DispatchError):
    """A stage index going backwards, or a pin that contradicts the program's assignment."""

    code = "FAILED_PRECONDITION"


class DuplicateRequest(DispatchError):
    code = "ALREADY_EXISTS"


class NoLiveEngine(DispatchError):
    code = "UNAVAILABLE"


class StoreUnavailable(DispatchError):
    """Redis could not be reached: nothing was decided, the caller may retry."""

    code = "UNAVAILABLE"


class DeadlineExceeded(DispatchError):
    code = "DEADLINE_EXCEEDED"


class RequestFailed(DispatchError):
    """The request ran and failed (its worker reported an error, or it was lost); ``code`` comes from it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
