"""Exceptions of the SDK, one per gRPC status code the front door uses; all are ``ChimeraError``."""

from __future__ import annotations

from collections.abc import Mapping

import grpc


class ChimeraError(Exception):
    """A call the front door refused or could not finish. ``code`` is the gRPC status name."""

    def __init__(self, code: str, details: str, retry_after_s: float | None = None) -> None:
        super().__init__(f"{code}: {details}" if details else code)
        self.code = code
        self.details = details
        self.retry_after_s = retry_after_s  # when the server said to come back, if it did


class InvalidRequestError(ChimeraError):
    """INVALID_ARGUMENT: the request is malformed; retrying it unchanged fails again."""


class RequestTooLargeError(InvalidRequestError):
    """RESOURCE_EXHAUSTED: the prompt is over the front door's size limit."""


class OverloadedError(ChimeraError):
    """RESOURCE_EXHAUSTED for load: the pool is full; try again after ``retry_after_s`` (None when the
    refusal came from gRPC's own concurrency limit, which names no time)."""


class ModelNotFoundError(ChimeraError):
    """NOT_FOUND: no registered engine serves the pinned model."""


class DuplicateRequestError(ChimeraError):
    """ALREADY_EXISTS: a request with this id was already dispatched."""


class StageConflictError(ChimeraError):
    """FAILED_PRECONDITION: a stage index went backwards, or a pin contradicts the program's model."""


class UnavailableError(ChimeraError):
    """UNAVAILABLE: no live engine, Redis unreachable, or the request was lost; safe to retry."""


class DeadlineExceededError(ChimeraError):
    """DEADLINE_EXCEEDED: the request did not finish in time (it was cancelled)."""


class RequestCancelledError(ChimeraError):
    """CANCELLED: the call was cancelled."""


_BY_CODE: Mapping[grpc.StatusCode, type[ChimeraError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: RequestTooLargeError,
    grpc.StatusCode.NOT_FOUND: ModelNotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: DuplicateRequestError,
    grpc.StatusCode.FAILED_PRECONDITION: StageConflictError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: RequestCancelledError,
}


def from_rpc_error(e: grpc.RpcError) -> ChimeraError:
    """The SDK exception for a failed gRPC call (sync or aio)."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = e.details() if hasattr(e, "details") else str(e)
    retry_after = _retry_after(e)
    cls = _BY_CODE.get(code, ChimeraError)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and (
        retry_after is not None or _CORE_LIMIT in str(details or "")
    ):
        cls = OverloadedError  # busy, not too large: come back later
    return cls(code.name, str(details or ""), retry_after)


# gRPC core's own refusal past a server's ``maximum_concurrent_rpcs``: busy, though it names no time to
# come back (the retry policy's default wait applies). Chimera's dispatcher answers before core does, with a
# Retry-After; this keeps the SDK right against a server or proxy that does not.
_CORE_LIMIT = "Concurrent RPC limit exceeded"


def _retry_after(e: grpc.RpcError) -> float | None:
    trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == "retry-after":
            try:
                return float(value)
            except (TypeError, ValueError):
                return None
    return None
