"""The one decorator every gRPC servicer uses to turn domain errors into status codes.

Servicer methods raise domain errors and never call ``context.abort`` themselves; the decorator maps each
error to its code (anything unexpected is logged and becomes INTERNAL) and optionally observes the call.
It wraps plain async methods (unary responses) and async generators (server streaming) alike.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

F = TypeVar("F", bound=Callable[..., Any])
CodeOf = Callable[[Exception], "grpc.StatusCode | None"]
# (servicer, method name, status code name, seconds) after every call.
Observe = Callable[[Any, str, str, float], None]
# Trailing metadata a known error sends with its status (e.g. when to retry).
TrailersOf = Callable[[Exception], Sequence[tuple[str, str]]]


def by_type(errors: Mapping[type[Exception], grpc.StatusCode]) -> CodeOf:
    """A ``CodeOf`` from a table of error types (the first matching entry wins)."""

    def code_of(e: Exception) -> grpc.StatusCode | None:
        return next((c for t, c in errors.items() if isinstance(e, t)), None)

    return code_of


def status_codes(
    code_of: CodeOf,
    log: logging.Logger,
    internal_message: str,
    observe: Observe | None = None,
    trailers_of: TrailersOf | None = None,
) -> Callable[[F], F]:
    """Decorate servicer methods: ``code_of(e)`` gives a known error's code (None: unexpected, so INTERNAL
    with ``internal_message`` and the traceback in ``log``); the message of a known error is its text, and
    ``trailers_of(e)`` its trailing metadata."""

    async def abort(context: grpc.aio.ServicerContext, e: Exception) -> grpc.StatusCode:
        code = code_of(e)
        trailers: tuple[tuple[str, str], ...] = ()
        if code is None:
            log.error("%s", internal_message, exc_info=e)
            code, message = grpc.StatusCode.INTERNAL, internal_message
        else:
            message = str(e) or code.name
            trailers = tuple(trailers_of(e)) if trailers_of is not None else ()
        await context.abort(code, message, trailing_metadata=trailers)
        raise AssertionError("unreachable: abort raises")

    def done(servicer: Any, name: str, code: grpc.StatusCode, t0: float) -> None:
        if observe is not None:
            observe(servicer, name, code.name, time.perf_counter() - t0)

    def decorate(fn: F) -> F:
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def stream(
                self: Any, request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                t0, code = time.perf_counter(), grpc.StatusCode.OK
                try:
                    async for item in fn(self, request, context):
                        yield item
                except Exception as e:  # mapped in abort
                    code = code_of(e) or grpc.StatusCode.INTERNAL
                    await abort(context, e)
                finally:
                    done(self, fn.__name__, code, t0)

            return stream  # type: ignore[return-value]

        @functools.wraps(fn)
        async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0, code = time.perf_counter(), grpc.StatusCode.OK
            try:
                return await fn(self, request, context)
            except Exception as e:  # mapped in abort
                code = code_of(e) or grpc.StatusCode.INTERNAL
                await abort(context, e)
            finally:
                done(self, fn.__name__, code, t0)

        return unary  # type: ignore[return-value]

    return decorate
