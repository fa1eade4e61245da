"""Domain errors of the front door, and the one guard that turns Redis going away into one of them.

``server.py`` maps each error to a gRPC status code, in one place (``grpc_status.status_codes``), and the
HTTP door maps the same codes to HTTP errors. Every error carries the *name* of its status code rather than
a ``grpc.StatusCode`` so that the domain modules import nothing from gRPC.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

T = TypeVar("T")
# What "Redis is unreachable" looks like from redis-py: nothing was decided, the caller may retry.
REDIS_DOWN: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, OSError)


class DispatchError(Exception):
    """Base class: a request the front door refuses or cannot finish. ``code`` is a gRPC status name."""

    code: str = "INTERNAL"


class InvalidRequest(DispatchError):
    code = "INVALID_ARGUMENT"


class RequestTooLarge(DispatchError):
    code = "RESOURCE_EXHAUSTED"


class Overloaded(DispatchError):
    """The pool is full: the caller should come back after ``retry_after_s`` (HTTP 429, never 503)."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        """``retry_after_s`` as both doors send it (HTTP Retry-After, the gRPC trailer): whole seconds."""
        return str(math.ceil(self.retry_after_s))


class Unauthenticated(DispatchError):
    """No API key, a malformed one, an unknown one or a revoked one (HTTP 401)."""

    code = "UNAUTHENTICATED"


class PermissionDenied(DispatchError):
    """A valid key asking for what its tenant may not have (HTTP 403)."""

    code = "PERMISSION_DENIED"


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


async def guarded(call: Awaitable[T]) -> T:
    """Await a Redis call; Redis going away becomes ``StoreUnavailable`` (UNAVAILABLE / HTTP 503)."""
    try:
        return await call
    except REDIS_DOWN as e:
        raise StoreUnavailable(f"redis is unreachable: {e}") from e
